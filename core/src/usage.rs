//! Token counts in request and response bodies: what a response says it cost (token
//! usage read from a JSON body or from the events of a server-sent-event stream,
//! `text/event-stream`) for rules whose cost is known only after the response
//! (`commit`), and what a request may cost at most (its `max_tokens` and the size of its
//! prompt) for a cost estimated from the request body.
//!
//! A usage field is a sum of JSON paths (`usage.input_tokens+usage.output_tokens`); a
//! rule lists fields in order of preference and the first whose paths all have a value
//! is the cost. In a stream each event's values replace the previous ones path by path,
//! so cumulative counters (Anthropic's `message_delta`, Gemini's `usageMetadata`) and a
//! final usage event (OpenAI's `stream_options.include_usage`) both end with the totals.
//!
//! Memory is bounded: a JSON body is kept up to `max_bytes` (beyond, the usage is
//! unknown), and a stream is read line by line, no line or event longer than
//! `max_bytes` kept. What a response then costs — its usage, `on_error` for an upstream
//! 5xx, or its estimate when the usage cannot be read — is [`settlement`]'s to say.

use std::collections::HashMap;

pub mod settlement;

/// The fields read when a rule names none: OpenAI (`usage.total_tokens`; in a Responses
/// API stream, `response.usage.total_tokens` of its `response.completed` event), Anthropic
/// (`usage.input_tokens` + `usage.output_tokens`; in a stream the input count comes in
/// `message_start`'s `message.usage`), Gemini (`usageMetadata.totalTokenCount`).
pub const DEFAULT_FIELDS: &[&str] = &[
    "usage.total_tokens",
    "response.usage.total_tokens",
    "usage.input_tokens+usage.output_tokens",
    "message.usage.input_tokens+usage.output_tokens",
    "usageMetadata.totalTokenCount",
];

/// Most terms in a field and segments in a path.
pub const MAX_TERMS: usize = 8;
pub const MAX_SEGMENTS: usize = 8;

/// One usage field: the sum of its paths' values.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UsageField {
    terms: Vec<Vec<String>>,
}

impl UsageField {
    /// Parses `a.b+c.d`: 1 to [`MAX_TERMS`] paths of 1 to [`MAX_SEGMENTS`] non-empty
    /// segments. The error says what is wrong.
    pub fn parse(text: &str) -> Result<UsageField, String> {
        let terms: Vec<&str> = text.split('+').collect();
        if terms.len() > MAX_TERMS {
            return Err(format!(
                "{} terms; at most {MAX_TERMS} are allowed",
                terms.len()
            ));
        }
        let mut parsed = Vec::with_capacity(terms.len());
        for term in terms {
            let segments: Vec<String> = term.trim().split('.').map(str::to_string).collect();
            if segments.iter().any(String::is_empty) {
                return Err(format!("{term:?} is not a dotted path (empty segment)"));
            }
            if segments.len() > MAX_SEGMENTS {
                return Err(format!(
                    "{term:?} has {} segments; at most {MAX_SEGMENTS} are allowed",
                    segments.len()
                ));
            }
            parsed.push(segments);
        }
        Ok(UsageField { terms: parsed })
    }
}

impl UsageField {
    /// The most tokens the field allows in a request body `value`: `None` when a path is
    /// missing or `null` (a backend reads that as "not set"); `u64::MAX` for a term that
    /// is there but is not a whole number of tokens (a fraction, a negative number, a
    /// string, a number beyond `u64`), so that the rule's `max` applies: a client cannot
    /// lower its estimate with a value its backend may read otherwise.
    fn read_bound(&self, value: &serde_json::Value) -> Option<u64> {
        self.terms.iter().try_fold(0u64, |sum, path| {
            let found = path
                .iter()
                .try_fold(value, |v, segment| v.get(segment.as_str()))
                .filter(|v| !v.is_null())?;
            Some(sum.saturating_add(whole_number(found).unwrap_or(u64::MAX)))
        })
    }
}

/// `value` as a whole number ≥ 0: an integer, or a JSON number such as `8000.0` or `8e3`
/// whose value is one (below 2^64).
fn whole_number(value: &serde_json::Value) -> Option<u64> {
    if let Some(n) = value.as_u64() {
        return Some(n);
    }
    let f = value.as_f64()?;
    // 2^64 as a float: every whole f64 below it converts exactly.
    let beyond = 18_446_744_073_709_551_616.0_f64;
    if f.fract() == 0.0 && (0.0..beyond).contains(&f) {
        return Some(f as u64);
    }
    None
}

/// The fields a request's most output tokens are read from when a rule names none:
/// OpenAI (`max_tokens`, `max_completion_tokens`, the Responses API's
/// `max_output_tokens`), Anthropic (`max_tokens`), Gemini
/// (`generationConfig.maxOutputTokens`).
pub const DEFAULT_MAX_TOKENS_FIELDS: &[&str] = &[
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "generationConfig.maxOutputTokens",
];

/// How a rule estimates a request's cost from its JSON body: the most tokens it may
/// generate (the largest of the `fields` the body has: a client cannot pick a small field
/// its backend ignores) plus its prompt, estimated from the body's size
/// (`bytes_per_prompt_token`; 0: not counted).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BodyEstimate {
    pub fields: Vec<UsageField>,
    pub bytes_per_prompt_token: u64,
    /// The most of a body read; a longer body is [`RequestBody::TooLarge`].
    pub max_bytes: usize,
}

/// What the filter saw of a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestBody<'a> {
    /// The request had no body, or it was not read.
    Absent,
    Complete(&'a [u8]),
    /// Longer than the rule's `max_bytes`: not read.
    TooLarge,
}

impl BodyEstimate {
    /// The estimate for `body`: `None` when the body says nothing (absent, not JSON, no
    /// field or only `null` ones: the rule's `default` applies), `u64::MAX` when it is too
    /// large to read or a field holds something other than a whole number ≥ 0 (the
    /// rule's `max` applies).
    pub fn estimate(&self, body: RequestBody<'_>) -> Option<u64> {
        let bytes = match body {
            RequestBody::Absent => return None,
            RequestBody::TooLarge => return Some(u64::MAX),
            RequestBody::Complete(bytes) => bytes,
        };
        let value = serde_json::from_slice::<serde_json::Value>(bytes).ok()?;
        let output = self
            .fields
            .iter()
            .filter_map(|field| field.read_bound(&value))
            .max()?;
        let prompt = match self.bytes_per_prompt_token {
            0 => 0,
            per => (bytes.len() as u64).div_ceil(per),
        };
        Some(output.saturating_add(prompt))
    }
}

/// Why a response's usage could not be read: each reason is counted apart, and none
/// refunds the estimate (see [`settlement`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unread {
    /// No field had a value: not JSON, no usage object, or a stream without a usage
    /// event (an OpenAI stream without `stream_options.include_usage`).
    NoUsage,
    /// The JSON body, or an event of the stream, was longer than `max_bytes`, and no
    /// usage was found in the rest.
    TooLarge,
    /// The body has a `content-encoding` other than `identity`: it is not read.
    Compressed,
}

/// Reads one response's usage as its body goes by.
///
/// A JSON body is kept whole (up to `max_bytes`) and read when it ends. An event stream
/// is read as the SSE standard reads it: lines end with CRLF, LF or a bare CR; an event
/// is its `data:` lines joined with "\n" (one optional space after the colon dropped),
/// read when a blank line ends it. An event that is not JSON as a whole is read line by
/// line, for streams that put one JSON document on each `data:` line without blank
/// lines between them.
#[derive(Debug)]
pub struct UsageScanner {
    fields: Vec<UsageField>,
    stream: bool,
    compressed: bool,
    max_bytes: usize,
    /// The JSON body so far, or the stream's unfinished line.
    pending: Vec<u8>,
    /// The body, or the current line, went over `max_bytes`.
    overflow: bool,
    /// The stream's current event: its data lines, each followed by "\n".
    data: Vec<u8>,
    /// The current event went over `max_bytes`: it is skipped.
    data_overflow: bool,
    /// The last piece ended with a CR: an LF that starts the next one ends no line.
    after_cr: bool,
    /// Something was dropped for its size.
    dropped: bool,
    /// Reading stopped: the VM's buffer budget had no room ([`UsageScanner::give_up`]).
    gave_up: bool,
    /// The latest value seen for each path.
    latest: HashMap<Vec<String>, u64>,
}

impl UsageScanner {
    /// A scanner for `fields`, of a JSON body or (`stream`) an event stream.
    pub fn new(fields: &[UsageField], stream: bool, max_bytes: usize) -> UsageScanner {
        UsageScanner {
            fields: fields.to_vec(),
            stream,
            compressed: false,
            max_bytes,
            pending: Vec::new(),
            overflow: false,
            data: Vec::new(),
            data_overflow: false,
            after_cr: false,
            dropped: false,
            gave_up: false,
            latest: HashMap::new(),
        }
    }

    /// Bytes kept for the rest of the body: the JSON body so far, or the stream's
    /// unfinished line and event.
    pub fn buffered(&self) -> usize {
        self.pending.len().saturating_add(self.data.len())
    }

    /// Stops reading and drops what is kept (the VM's buffer budget had no room): the
    /// usage is unread, as for a body over `max_bytes`.
    pub fn give_up(&mut self) {
        self.gave_up = true;
        self.pending = Vec::new();
        self.data = Vec::new();
    }

    /// A scanner for a response with these `content-type` and `content-encoding`
    /// headers: an event stream or a JSON body; a compressed body is not read.
    pub fn for_response(
        fields: &[UsageField],
        max_bytes: usize,
        content_type: Option<&[u8]>,
        content_encoding: Option<&[u8]>,
    ) -> UsageScanner {
        let mut scanner = UsageScanner::new(fields, Self::is_event_stream(content_type), max_bytes);
        scanner.compressed = !Self::is_identity(content_encoding);
        scanner
    }

    /// Whether a response of `content_type` is an event stream.
    pub fn is_event_stream(content_type: Option<&[u8]>) -> bool {
        content_type
            .and_then(|c| c.get(..17))
            .is_some_and(|c| c.eq_ignore_ascii_case(b"text/event-stream"))
    }

    /// Whether a body with this `content-encoding` is as sent: no header, or only
    /// `identity` (and empty entries) in its list.
    pub fn is_identity(content_encoding: Option<&[u8]>) -> bool {
        content_encoding.is_none_or(|value| {
            value.split(|&b| b == b',').all(|coding| {
                let coding = coding.trim_ascii();
                coding.is_empty() || coding.eq_ignore_ascii_case(b"identity")
            })
        })
    }

    /// The next piece of the body.
    pub fn feed(&mut self, chunk: &[u8]) {
        if self.compressed || self.gave_up {
            return;
        }
        if !self.stream {
            if self.overflow || self.pending.len().saturating_add(chunk.len()) > self.max_bytes {
                self.overflow = true;
                self.dropped = true;
                self.pending = Vec::new();
            } else {
                self.pending.extend_from_slice(chunk);
            }
            return;
        }
        let mut rest = chunk;
        if std::mem::take(&mut self.after_cr) {
            if let Some(tail) = rest.strip_prefix(b"\n") {
                rest = tail;
            }
        }
        while let Some(end) = rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            let (line, tail) = rest.split_at(end);
            self.extend_line(line);
            self.end_line();
            rest = match tail {
                [b'\r', b'\n', after @ ..] => after,
                [b'\r'] => {
                    self.after_cr = true;
                    &[]
                }
                [_, after @ ..] => after,
                [] => &[],
            };
        }
        self.extend_line(rest);
    }

    /// The body ended (or was cut: what it carried until then): the usage, or why there
    /// is none.
    pub fn finish(mut self) -> Result<u64, Unread> {
        if self.compressed {
            return Err(Unread::Compressed);
        }
        if self.gave_up {
            return Err(Unread::TooLarge);
        }
        if self.stream {
            // An event the stream did not close with a blank line is read all the same:
            // its lines came whole from the upstream.
            if !self.pending.is_empty() || self.overflow {
                self.end_line();
            }
            self.event_line(b"");
        } else if !self.overflow {
            let body = std::mem::take(&mut self.pending);
            self.record(&body);
        }
        let usage = self.fields.iter().find_map(|field| {
            field.terms.iter().try_fold(0u64, |sum, path| {
                self.latest.get(path).map(|v| sum.saturating_add(*v))
            })
        });
        match usage {
            Some(usage) => Ok(usage),
            None if self.dropped => Err(Unread::TooLarge),
            None => Err(Unread::NoUsage),
        }
    }

    /// More of the stream's current line, dropped past `max_bytes`.
    fn extend_line(&mut self, piece: &[u8]) {
        if self.overflow || self.pending.len().saturating_add(piece.len()) > self.max_bytes {
            self.overflow = true;
            self.dropped = true;
            self.pending.clear();
        } else {
            self.pending.extend_from_slice(piece);
        }
    }

    /// The current line ended. A line dropped for its size may have been part of an
    /// event: that event is skipped.
    fn end_line(&mut self) {
        if std::mem::take(&mut self.overflow) {
            self.data_overflow = true;
            self.data.clear();
        } else {
            let line = std::mem::take(&mut self.pending);
            self.event_line(&line);
        }
        self.pending.clear();
    }

    /// One line of the stream: a `data:` line adds to the event, a blank line ends it.
    fn event_line(&mut self, line: &[u8]) {
        if line.is_empty() {
            let data = std::mem::take(&mut self.data);
            if !std::mem::take(&mut self.data_overflow) {
                self.dispatch(&data);
            }
            return;
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let (field, value) = line.split_at(colon);
                let value = value.get(1..).unwrap_or_default();
                (field, value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        if field != b"data" || self.data_overflow {
            return;
        }
        if self.data.len().saturating_add(value.len()) >= self.max_bytes {
            self.data_overflow = true;
            self.dropped = true;
            self.data.clear();
        } else {
            self.data.extend_from_slice(value);
            self.data.push(b'\n');
        }
    }

    /// An event's data: one JSON document, or one per line.
    fn dispatch(&mut self, data: &[u8]) {
        let data = data.strip_suffix(b"\n").unwrap_or(data);
        if data.is_empty() || self.record(data) {
            return;
        }
        if data.contains(&b'\n') {
            for line in data.split(|&b| b == b'\n') {
                self.record(line);
            }
        }
    }

    /// Records the values of every field's paths found in one JSON document; false when
    /// it is not JSON.
    fn record(&mut self, json: &[u8]) -> bool {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(json) else {
            return false;
        };
        for field in &self.fields {
            for path in &field.terms {
                let found = path
                    .iter()
                    .try_fold(&value, |v, segment| v.get(segment.as_str()))
                    .and_then(whole_number);
                if let Some(n) = found {
                    self.latest.insert(path.clone(), n);
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    fn defaults() -> Vec<UsageField> {
        DEFAULT_FIELDS
            .iter()
            .map(|f| UsageField::parse(f).unwrap())
            .collect()
    }

    fn scan(body: &[u8], stream: bool, chunk: usize) -> Option<u64> {
        scan_why(body, stream, chunk).ok()
    }

    fn scan_why(body: &[u8], stream: bool, chunk: usize) -> Result<u64, Unread> {
        let mut s = UsageScanner::new(&defaults(), stream, 4096);
        for piece in body.chunks(chunk) {
            s.feed(piece);
        }
        s.finish()
    }

    #[test]
    fn a_scanner_that_gives_up_reads_no_usage_and_keeps_nothing() {
        let fields = [UsageField::parse("usage.total_tokens").unwrap()];
        for stream in [false, true] {
            let mut scanner = UsageScanner::new(&fields, stream, 1 << 20);
            scanner.feed(b"data: {\"usage\":{\"total_tokens\":5}}\n\n{\"usage\":");
            assert!(scanner.buffered() > 0);
            scanner.give_up();
            assert_eq!(scanner.buffered(), 0);
            scanner.feed(b"{\"total_tokens\":7}}");
            assert_eq!(scanner.buffered(), 0, "nothing kept after giving up");
            assert_eq!(scanner.finish(), Err(Unread::TooLarge));
        }
    }

    #[test]
    fn the_usage_of_openai_anthropic_and_gemini_bodies() {
        let openai = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#;
        let anthropic = br#"{"type":"message","usage":{"input_tokens":10,"output_tokens":25}}"#;
        let gemini =
            br#"{"candidates":[],"usageMetadata":{"promptTokenCount":4,"totalTokenCount":40}}"#;
        for chunk in [1, 7, 4096] {
            assert_eq!(scan(openai, false, chunk), Some(21));
            assert_eq!(scan(anthropic, false, chunk), Some(35));
            assert_eq!(scan(gemini, false, chunk), Some(40));
        }
        assert_eq!(scan(br#"{"usage":{}}"#, false, 10), None);
        assert_eq!(scan(b"not json", false, 10), None);
    }

    #[test]
    fn the_usage_of_event_streams_is_their_last_count() {
        let openai = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
                       data: {\"choices\":[],\"usage\":{\"total_tokens\":57}}\n\ndata: [DONE]\n\n";
        let anthropic = b"event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n\
                          event: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\r\n\r\n";
        let gemini = b"data: {\"usageMetadata\":{\"totalTokenCount\":10}}\n\ndata: {\"usageMetadata\":{\"totalTokenCount\":33}}\n\n";
        for chunk in [1, 5, 4096] {
            assert_eq!(scan(openai, true, chunk), Some(57));
            assert_eq!(scan(anthropic, true, chunk), Some(40));
            assert_eq!(scan(gemini, true, chunk), Some(33));
        }
        assert_eq!(scan(b"data: {\"choices\":[]}\n\n", true, 3), None);
    }

    #[test]
    fn event_streams_with_bare_cr_line_ends_are_read() {
        let cr = b"event: message\rdata: {\"choices\":[]}\r\rdata: {\"usage\":{\"total_tokens\":57}}\r\r";
        let mixed = b"data: {\"usage\":{\"total_tokens\":5}}\r\n\r\ndata: {\"usage\":{\"total_tokens\":6}}\r\rdata: {\"usage\":{\"total_tokens\":8}}\n\n";
        for chunk in [1, 2, 3, 5, 4096] {
            assert_eq!(scan(cr, true, chunk), Some(57), "chunks of {chunk}");
            assert_eq!(scan(mixed, true, chunk), Some(8), "chunks of {chunk}");
        }
    }

    #[test]
    fn an_event_whose_json_spans_several_data_lines_is_read() {
        // SSE joins an event's data lines with "\n": here, valid JSON.
        let split = b"data: {\"choices\":[],\ndata: \"usage\":\n\
                      data:{\"total_tokens\":64}}\n\ndata: [DONE]\n\n";
        for chunk in [1, 4, 4096] {
            assert_eq!(scan(split, true, chunk), Some(64), "chunks of {chunk}");
        }
        // Lines of one event that are each an event of their own (no blank line between
        // them) are still read one by one.
        let unseparated =
            b"data: {\"usage\":{\"total_tokens\":3}}\ndata: {\"usage\":{\"total_tokens\":9}}\n\n";
        assert_eq!(scan(unseparated, true, 7), Some(9));
    }

    #[test]
    fn the_responses_api_stream_usage_is_read_by_default() {
        let stream = b"event: response.created\n\
            data: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"usage\":null}}\n\n\
            event: response.output_text.delta\n\
            data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n\
            event: response.completed\n\
            data: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":11,\"output_tokens\":31,\"total_tokens\":42}}}\n\n";
        for chunk in [1, 9, 4096] {
            assert_eq!(scan(stream, true, chunk), Some(42), "chunks of {chunk}");
        }
    }

    #[test]
    fn the_scanner_says_why_it_found_no_usage() {
        assert_eq!(
            scan_why(b"{\"choices\":[]}", false, 3),
            Err(Unread::NoUsage)
        );
        assert_eq!(
            scan_why(b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n", true, 3),
            Err(Unread::NoUsage)
        );
        let mut big = b"{\"usage\":{\"total_tokens\":5},\"pad\":\"".to_vec();
        big.extend(std::iter::repeat_n(b'x', 5000));
        big.extend(b"\"}");
        assert_eq!(scan_why(&big, false, 100), Err(Unread::TooLarge));
        let mut event = b"data: {\"usage\":{\"total_tokens\":5},\n".to_vec();
        for _ in 0..100 {
            event.extend(b"data: \"pad\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\",\n");
        }
        event.extend(b"data: \"end\": 1}\n\n");
        assert_eq!(
            scan_why(&event, true, 64),
            Err(Unread::TooLarge),
            "an event over the cap"
        );
        let gzip = |encoding: &[u8]| {
            let mut s = UsageScanner::for_response(
                &defaults(),
                4096,
                Some(b"application/json"),
                Some(encoding),
            );
            s.feed(br#"{"usage":{"total_tokens":5}}"#);
            s.finish()
        };
        assert_eq!(gzip(b"gzip"), Err(Unread::Compressed));
        assert_eq!(gzip(b"identity, br"), Err(Unread::Compressed));
        assert_eq!(gzip(b"Identity"), Ok(5));
        assert_eq!(gzip(b""), Ok(5));
        assert!(UsageScanner::is_identity(None));
    }

    #[test]
    fn bodies_and_lines_beyond_the_cap_are_dropped_not_kept() {
        let mut big = b"{\"usage\":{\"total_tokens\":5},\"pad\":\"".to_vec();
        big.extend(std::iter::repeat_n(b'x', 5000));
        big.extend(b"\"}");
        assert_eq!(scan(&big, false, 100), None, "over 4096 bytes: unknown");
        let mut stream = b"data: {\"pad\":\"".to_vec();
        stream.extend(std::iter::repeat_n(b'x', 5000));
        stream.extend(
            b"\",\"usage\":{\"total_tokens\":99}}\n\ndata: {\"usage\":{\"total_tokens\":7}}\n\n",
        );
        assert_eq!(
            scan(&stream, true, 100),
            Some(7),
            "the long line is skipped"
        );
    }

    #[test]
    fn a_request_is_estimated_from_its_max_tokens_and_its_size() {
        let estimate = BodyEstimate {
            fields: DEFAULT_MAX_TOKENS_FIELDS
                .iter()
                .map(|f| UsageField::parse(f).unwrap())
                .collect(),
            bytes_per_prompt_token: 4,
            max_bytes: 1024,
        };
        let openai = br#"{"model":"m","max_completion_tokens":500,"messages":[]}"#;
        assert_eq!(openai.len(), 55);
        assert_eq!(
            estimate.estimate(RequestBody::Complete(openai)),
            Some(500 + 14)
        );
        let gemini = br#"{"generationConfig":{"maxOutputTokens":64}}"#;
        assert_eq!(
            estimate.estimate(RequestBody::Complete(gemini)),
            Some(64 + 11)
        );
        let without = br#"{"model":"m","messages":[]}"#;
        assert_eq!(estimate.estimate(RequestBody::Complete(without)), None);
        assert_eq!(
            estimate.estimate(RequestBody::Complete(b"max_tokens=5")),
            None
        );
        assert_eq!(estimate.estimate(RequestBody::Absent), None);
        assert_eq!(estimate.estimate(RequestBody::TooLarge), Some(u64::MAX));
        let huge = br#"{"max_tokens":18446744073709551615,"x":1}"#;
        assert_eq!(
            estimate.estimate(RequestBody::Complete(huge)),
            Some(u64::MAX),
            "saturates"
        );
        let output_only = BodyEstimate {
            bytes_per_prompt_token: 0,
            ..estimate
        };
        assert_eq!(
            output_only.estimate(RequestBody::Complete(openai)),
            Some(500)
        );
    }

    fn default_estimate() -> BodyEstimate {
        BodyEstimate {
            fields: DEFAULT_MAX_TOKENS_FIELDS
                .iter()
                .map(|f| UsageField::parse(f).unwrap())
                .collect(),
            bytes_per_prompt_token: 0,
            max_bytes: 1024,
        }
    }

    #[test]
    fn the_estimate_is_the_largest_max_token_field_not_the_first() {
        let estimate = default_estimate();
        let body = |text: &str| estimate.estimate(RequestBody::Complete(text.as_bytes()));
        assert_eq!(
            body(r#"{"max_tokens":1,"max_completion_tokens":8000}"#),
            Some(8000)
        );
        assert_eq!(
            body(r#"{"max_completion_tokens":8000,"max_tokens":1}"#),
            Some(8000)
        );
        assert_eq!(
            body(
                r#"{"max_tokens":5,"max_output_tokens":7,"generationConfig":{"maxOutputTokens":6}}"#
            ),
            Some(7)
        );
        // null is what a backend reads as "not set": the other fields, or the default.
        assert_eq!(
            body(r#"{"max_tokens":null,"max_completion_tokens":30}"#),
            Some(30)
        );
        assert_eq!(body(r#"{"max_tokens":null}"#), None);
    }

    #[test]
    fn integral_json_numbers_are_read_and_other_values_estimate_the_max() {
        let estimate = default_estimate();
        let body = |text: &str| estimate.estimate(RequestBody::Complete(text.as_bytes()));
        assert_eq!(body(r#"{"max_tokens":8000.0}"#), Some(8000));
        assert_eq!(body(r#"{"max_tokens":8e3}"#), Some(8000));
        assert_eq!(body(r#"{"max_tokens":8.0E+3}"#), Some(8000));
        assert_eq!(body(r#"{"max_tokens":-0.0}"#), Some(0));
        // Not a whole number of tokens a backend could mean: the rule's max (u64::MAX,
        // clamped to `max` by the caller), never the default.
        for odd in [
            r#"{"max_tokens":8000.5}"#,
            r#"{"max_tokens":-1}"#,
            r#"{"max_tokens":-8e3}"#,
            r#"{"max_tokens":1e300}"#,
            r#"{"max_tokens":"8000"}"#,
            r#"{"max_tokens":true}"#,
            r#"{"max_tokens":{"n":5}}"#,
            r#"{"max_tokens":1,"max_completion_tokens":"lots"}"#,
        ] {
            assert_eq!(body(odd), Some(u64::MAX), "{odd}");
        }
    }

    #[test]
    fn fields_parse_with_errors_that_say_what_is_wrong() {
        assert!(UsageField::parse("usage.total_tokens").is_ok());
        assert_eq!(
            UsageField::parse("usage..x").unwrap_err(),
            "\"usage..x\" is not a dotted path (empty segment)"
        );
        assert!(UsageField::parse("a+b+c+d+e+f+g+h+i")
            .unwrap_err()
            .contains("9 terms"));
    }
}
