//! Token counts in request and response bodies: what a response says it cost (token
//! usage read from a JSON body or from the events of a server-sent-event stream,
//! `text/event-stream`) for rules whose cost is known only after the response
//! (`commit`), and what a request may cost at most (its `max_tokens` and the size of its
//! prompt) for a cost estimated from the request body.
//!
//! A usage field is a sum of JSON paths (`usage.input_tokens+usage.output_tokens`), each
//! optionally weighted (`0.1*usage.cache_read_input_tokens`) or optional (`...?`: 0 when
//! absent, see [`UsageField`]); a rule lists fields in order of preference and the first
//! whose required paths all have a value is the cost. Bodies are read as Python's
//! `json.loads(bytes)` reads them ([`json`]), and a value named twice counts at its
//! largest, whichever duplicate a backend keeps. In a stream each event's values replace the previous ones path by path,
//! so cumulative counters (Anthropic's `message_delta`, Gemini's `usageMetadata`) and a
//! final usage event (OpenAI's `stream_options.include_usage`) both end with the totals.
//!
//! Memory is bounded: a JSON body is kept up to `max_bytes` (beyond, the usage is
//! unknown), and a stream is read line by line, no line or event longer than
//! `max_bytes` kept. What a response then costs — its usage, `on_error` for an upstream
//! 5xx, or its estimate when the usage cannot be read — is [`settlement`]'s to say.

use json::{Found, Kind};

pub mod clamp;
pub mod json;
pub mod settlement;

/// The fields read when a rule names none, checked against each provider's reference:
/// OpenAI (`usage.total_tokens`, which includes the cached prompt tokens and the
/// reasoning tokens; in a Responses API stream, `response.usage.total_tokens` of its
/// `response.completed` event), Anthropic (`usage.input_tokens` counts only the input
/// after the last cache breakpoint: the tokens written to and read from the prompt cache
/// are counted apart, so they are added when present; in a stream, a `message_delta`
/// that carries cumulative input counts is read as a whole body is, else the input and
/// cache counts come in `message_start`'s `message.usage`), Gemini
/// (`usageMetadata.totalTokenCount`, which includes the cached content, the thoughts and
/// the tool-use prompt).
pub const DEFAULT_FIELDS: &[&str] = &[
    "usage.total_tokens",
    "response.usage.total_tokens",
    "usage.input_tokens+usage.cache_creation_input_tokens?+usage.cache_read_input_tokens?+usage.output_tokens",
    "message.usage.input_tokens+message.usage.cache_creation_input_tokens?+message.usage.cache_read_input_tokens?+usage.output_tokens",
    "usageMetadata.totalTokenCount",
];

/// Most terms in a field and segments in a path.
pub const MAX_TERMS: usize = 8;
pub const MAX_SEGMENTS: usize = 8;

/// A term's weight is written with at most 3 decimals and kept in thousandths, so that
/// a weighted sum stays exact in integers: from 0.001 to [`MAX_WEIGHT_PER_MILLE`] / 1000.
const PER_MILLE: u64 = 1_000;
pub const MAX_WEIGHT_PER_MILLE: u64 = 1_000_000;

/// One usage field: the sum of its terms' values, each a path's value times the term's
/// weight, rounded up to a whole token.
///
/// A term is `[WEIGHT*]a.b.c[?]`: the weight (a decimal from 0.001 to 1000 with at most 3
/// decimals; 1 when absent) multiplies the path's value; `?` makes the term optional, 0
/// when the path has no value, where a required term's absence means the field has no
/// value (the next field is tried). A field needs at least one required term: one made
/// only of optional terms would read 0 from a response without any usage.
///
/// ```
/// use weir_core::usage::UsageField;
///
/// // Anthropic, with cache reads counted at a tenth and cache writes at 1.25.
/// let field = UsageField::parse(
///     "usage.input_tokens+1.25*usage.cache_creation_input_tokens?\
///      +0.1*usage.cache_read_input_tokens?+usage.output_tokens",
/// )
/// .unwrap();
/// assert_eq!(field.terms(), 4);
/// assert_eq!(UsageField::parse("0*usage.x").unwrap_err(),
///     "\"0*usage.x\": the weight 0 is out of range: expected 0.001 to 1000");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UsageField {
    terms: Vec<Term>,
}

/// One term of a field.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Term {
    path: Vec<String>,
    /// The weight in thousandths (1,000: counted once).
    per_mille: u64,
    /// 0 when the path has no value.
    optional: bool,
}

/// What one term of a field reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TermValue {
    /// No value: the path is missing or `null`.
    Unset,
    /// A value that is not a count (a fraction, a negative number, a string...).
    Invalid,
    /// A count; `u64::MAX` stands for no bound (see [`Reading::bound`]).
    Count(u64),
}

impl UsageField {
    /// Parses `a.b+0.1*c.d?`: 1 to [`MAX_TERMS`] terms, each a path of 1 to
    /// [`MAX_SEGMENTS`] non-empty segments with an optional weight and `?`. The error
    /// says what is wrong.
    pub fn parse(text: &str) -> Result<UsageField, String> {
        let terms: Vec<&str> = text.split('+').collect();
        if terms.len() > MAX_TERMS {
            return Err(format!(
                "{} terms; at most {MAX_TERMS} are allowed",
                terms.len()
            ));
        }
        let terms = terms
            .into_iter()
            .map(Term::parse)
            .collect::<Result<Vec<Term>, String>>()?;
        if terms.iter().all(|term| term.optional) {
            return Err(format!(
                "{text:?}: every term is optional; a field needs one without \"?\" (else a \
                 body without any of its paths would read 0)"
            ));
        }
        Ok(UsageField { terms })
    }

    /// The field as configured, normalized: `a.b+0.1*c.d?`.
    pub fn text(&self) -> String {
        let terms: Vec<String> = self.terms.iter().map(Term::text).collect();
        terms.join("+")
    }

    /// How many terms the field sums.
    pub fn terms(&self) -> usize {
        self.terms.len()
    }

    /// The field's path when it is one plain path (not a sum, not weighted), or what it
    /// is instead: a clamp writes one number into it.
    pub fn plain_path(&self) -> Result<&[String], &'static str> {
        // A field of one term is never optional (see `parse`).
        match self.terms.as_slice() {
            [term] if term.per_mille != PER_MILLE => Err("is weighted"),
            [term] => Ok(&term.path),
            _ => Err("is a sum of paths"),
        }
    }

    /// The field's paths, term by term.
    fn paths(&self) -> impl Iterator<Item = &[String]> {
        self.terms.iter().map(|term| term.path.as_slice())
    }

    /// The field's value from what each term reads (`read(i)` for the `i`th term):
    /// `None` when a required term is unset or a term is invalid; `u64::MAX` when a term
    /// has no bound. Exact: the weighted sum in thousandths, rounded up once.
    fn sum(&self, mut read: impl FnMut(usize) -> TermValue) -> Option<u64> {
        let mut thousandths: u128 = 0;
        let mut unbounded = false;
        for (i, term) in self.terms.iter().enumerate() {
            match read(i) {
                TermValue::Unset if term.optional => {}
                TermValue::Unset | TermValue::Invalid => return None,
                TermValue::Count(u64::MAX) => unbounded = true,
                TermValue::Count(n) => {
                    // At most 8 terms of 2^64 × 10^6: far below 2^128.
                    thousandths = thousandths
                        .saturating_add(u128::from(n).saturating_mul(u128::from(term.per_mille)));
                }
            }
        }
        if unbounded {
            return Some(u64::MAX);
        }
        Some(u64::try_from(thousandths.div_ceil(u128::from(PER_MILLE))).unwrap_or(u64::MAX))
    }
}

impl Term {
    fn parse(raw: &str) -> Result<Term, String> {
        let text = raw.trim();
        let (text, optional) = match text.strip_suffix('?') {
            Some(rest) => (rest.trim_end(), true),
            None => (text, false),
        };
        let (per_mille, path) = match text.split_once('*') {
            Some((weight, path)) => (parse_weight(raw.trim(), weight.trim())?, path.trim()),
            None => (PER_MILLE, text),
        };
        if path.contains('*') {
            return Err(format!("{raw:?} has more than one weight (\"*\")"));
        }
        if path.contains('?') {
            return Err(format!(
                "{raw:?}: \"?\" goes at the end of a term (an optional term)"
            ));
        }
        let segments: Vec<String> = path.split('.').map(str::to_string).collect();
        if segments.iter().any(String::is_empty) {
            return Err(format!("{raw:?} is not a dotted path (empty segment)"));
        }
        if segments.len() > MAX_SEGMENTS {
            return Err(format!(
                "{raw:?} has {} segments; at most {MAX_SEGMENTS} are allowed",
                segments.len()
            ));
        }
        Ok(Term {
            path: segments,
            per_mille,
            optional,
        })
    }

    fn text(&self) -> String {
        let weight = match self.per_mille {
            PER_MILLE => String::new(),
            w => {
                let decimals = format!("{:03}", w % PER_MILLE);
                let decimals = decimals.trim_end_matches('0');
                match decimals {
                    "" => format!("{}*", w / PER_MILLE),
                    d => format!("{}.{d}*", w / PER_MILLE),
                }
            }
        };
        let optional = if self.optional { "?" } else { "" };
        format!("{weight}{}{optional}", self.path.join("."))
    }
}

/// A weight as written (`0.1`, `1.25`, `3`), in thousandths.
fn parse_weight(term: &str, weight: &str) -> Result<u64, String> {
    let not_a_number =
        || format!("{term:?}: the weight {weight:?} is not a decimal number (e.g. 0.1 or 1.25)");
    let (whole, decimals) = weight.split_once('.').unwrap_or((weight, ""));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || (weight.contains('.') && !digits(decimals)) {
        return Err(not_a_number());
    }
    if decimals.trim_end_matches('0').len() > 3 {
        return Err(format!(
            "{term:?}: the weight {weight} has more than 3 decimals"
        ));
    }
    let out_of_range = || {
        format!(
            "{term:?}: the weight {weight} is out of range: expected 0.001 to {}",
            MAX_WEIGHT_PER_MILLE / PER_MILLE
        )
    };
    let thousandths = format!(
        "{:0<3}",
        decimals.get(..3.min(decimals.len())).unwrap_or("")
    );
    let per_mille = whole
        .parse::<u64>()
        .ok()
        .and_then(|w| w.checked_mul(PER_MILLE))
        .and_then(|w| w.checked_add(thousandths.parse::<u64>().ok()?))
        .ok_or_else(out_of_range)?;
    if per_mille == 0 || per_mille > MAX_WEIGHT_PER_MILLE {
        return Err(out_of_range());
    }
    Ok(per_mille)
}

/// What the readers of one body find at one path, over every duplicate key: a reader
/// keeping the first duplicate and one keeping the last may find different things.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Reading {
    /// The largest whole number found.
    largest: Option<u64>,
    /// A value that is not a whole number (nor `null`) was found.
    other: bool,
    /// Some reader finds nothing while the path is in the body: a `null`, a duplicate
    /// parent object without the key, or a parent that is `null` or not an object.
    unset: bool,
}

impl Reading {
    fn add(&mut self, found: &Found) {
        match found {
            Found::Value {
                kind: Kind::Whole(n),
                ..
            } => self.largest = self.largest.max(Some(*n)),
            Found::Value {
                kind: Kind::Null, ..
            }
            | Found::NotObject { .. } => self.unset = true,
            Found::Value { .. } => self.other = true,
            // The root has no such key: every reader finds nothing, which is not a
            // disagreement.
            Found::Missing { depth: 0, .. } => {}
            Found::Missing { .. } => self.unset = true,
        }
    }

    /// The most a request body allows at the path: unset when no reader finds a value
    /// (a backend reads the path as not set); no bound (`u64::MAX`, the rule's `max`)
    /// when a value is not a whole number, or when one reader finds a number and another
    /// finds none — a client cannot lower its estimate with a value its backend may read
    /// otherwise.
    fn bound(self) -> TermValue {
        match (self.largest, self.other, self.unset) {
            (None, false, _) => TermValue::Unset,
            (Some(n), false, false) => TermValue::Count(n),
            _ => TermValue::Count(u64::MAX),
        }
    }

    /// The usage a response reports at the path: the largest count (never a lower one
    /// a duplicate could slip in); invalid when a value is not a count.
    fn usage(self) -> TermValue {
        match (self.largest, self.other) {
            (_, true) => TermValue::Invalid,
            (Some(n), false) => TermValue::Count(n),
            (None, false) => TermValue::Unset,
        }
    }
}

/// The paths of `fields`, term by term, field after field: what a reading of a body
/// follows, each reading's index being its position here.
fn field_paths(fields: &[UsageField]) -> Vec<&[String]> {
    fields.iter().flat_map(UsageField::paths).collect()
}

/// Each field with its share of `per_term`, a list with one entry per path of
/// [`field_paths`], in its order.
fn per_field<'a, T>(
    fields: &'a [UsageField],
    per_term: &'a [T],
) -> impl Iterator<Item = (&'a UsageField, &'a [T])> {
    let mut rest = per_term;
    fields.iter().map(move |field| {
        let (terms, after) = rest.split_at(field.terms().min(rest.len()));
        rest = after;
        (field, terms)
    })
}

/// Reads `json` (a whole body, or an event of a stream) along `paths`.
fn read_paths(json: &[u8], paths: &[&[String]]) -> Result<Vec<Reading>, json::Refused> {
    let text = json::decode(json)?;
    let mut readings = vec![Reading::default(); paths.len()];
    json::scan(text.as_bytes(), paths, |hit| {
        if let Some(reading) = readings.get_mut(hit.path) {
            reading.add(&hit.found);
        }
    })?;
    Ok(readings)
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
///
/// The body is read as `json.loads(bytes)` reads it ([`json`]): a BOM, UTF-16 or UTF-32,
/// `NaN` or `Infinity` in another field, lone surrogates do not make a body unreadable,
/// and a body it refuses costs the rule's `max` (a backend that reads it anyway may read
/// any bound). A field named twice (or inside a parent object named twice) counts at the
/// largest of its values, whichever duplicate a backend keeps.
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
    /// The estimate for `body`: `None` when the body sets no bound (absent, empty, no
    /// field or only `null` ones: the rule's `default` applies); `u64::MAX` (the rule's
    /// `max`) when it is too large to read, when `json.loads` would refuse it, when a
    /// field holds something other than a whole number ≥ 0, or when a duplicate key
    /// hides a field from some readers and not from others.
    pub fn estimate(&self, body: RequestBody<'_>) -> Option<u64> {
        let bytes = match body {
            RequestBody::Absent => return None,
            RequestBody::TooLarge => return Some(u64::MAX),
            // No body at all: a backend reads no bound in it (and refuses it).
            RequestBody::Complete([]) => return None,
            RequestBody::Complete(bytes) => bytes,
        };
        let Ok(readings) = read_paths(bytes, &field_paths(&self.fields)) else {
            // A body a reader refuses: one that reads it anyway may find any bound.
            return Some(u64::MAX);
        };
        let output = per_field(&self.fields, &readings)
            .filter_map(|(field, terms)| {
                field.sum(|i| terms.get(i).map_or(TermValue::Unset, |r| r.bound()))
            })
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
    /// What the latest document that had each path said of it: the fields' paths term
    /// by term, field after field (see [`field_paths`]).
    latest: Vec<TermValue>,
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
            latest: vec![TermValue::Unset; fields.iter().map(UsageField::terms).sum()],
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
        let usage = per_field(&self.fields, &self.latest).find_map(|(field, terms)| {
            field.sum(|i| terms.get(i).copied().unwrap_or(TermValue::Unset))
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

    /// Records the values of every field's paths found in one JSON document (read as
    /// [`json`] reads it); false when it is not JSON. A path named twice reads its largest
    /// value; one that holds something other than a count (a fraction, a negative
    /// number, `NaN`, a number beyond `u64`) has no value from then on, so a field that
    /// needs it is not read: the estimate stands rather than an earlier, lower count.
    fn record(&mut self, json: &[u8]) -> bool {
        let Ok(readings) = read_paths(json, &field_paths(&self.fields)) else {
            return false;
        };
        for (latest, reading) in self.latest.iter_mut().zip(readings) {
            match reading.usage() {
                TermValue::Unset => {}
                value => *latest = value,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests;
