//! The second property of issue 19, for costs a client chooses (CONFORMANCE.md, "Costs
//! the client chooses"): **no client-chosen input makes a request cost less than its
//! estimate unless its response really reported a usage** — or the upstream answered an
//! error status (5xx), which settles at the rule's `on_error`, as documented.
//!
//! Each case draws a request body (which max-token fields, written how, how much prompt,
//! JSON or not, over `max_bytes` or not), then a response (status, `content-type`,
//! `content-encoding`, OpenAI / Anthropic / Responses API / Gemini / no-usage bodies and
//! event streams, LF / CR / CRLF line ends, JSON over several `data:` lines, padding past
//! `max_bytes`, the chunks it arrives in, a cut where the client left). The estimate comes
//! from the compiled rule (`Rule::cost` over `BodyEstimate::estimate`), the usage from the
//! real scanner (`UsageScanner`), the cost from `Settlement::of`: the three pieces the
//! filter chains, without Envoy.
//!
//! Judged per case:
//! - the estimate is at least what any field the body sets could let the backend
//!   generate (a lenient backend reads `"8000"` and `8000.0` as 8,000; a fraction may be
//!   rounded up), capped at the rule's `max`;
//! - a cost below the estimate is a 5xx's `on_error`, or a usage the upstream sent whole
//!   before the cut; a usage settled is always one the upstream sent whole;
//! - any other cost is the estimate;
//! - and, so that the scanner is not vacuously safe: a whole, uncompressed, correctly
//!   labelled response within `max_bytes` settles at its last usage.

// Test code: a failed expectation is meant to panic, helpers included.
#![cfg(not(target_arch = "wasm32"))]

use proptest::prelude::*;
use weir_core::config::{self, Config};
use weir_core::rules::{CommitSource, Fact, FactSource, Facts};
use weir_core::usage::settlement::{ResponseSeen, SettleReason, Settlement};
use weir_core::usage::{RequestBody, Unread, UsageScanner};

const MAX: u64 = 8_000;
const DEFAULT: u64 = 4_000;
/// Both `max_bytes` of the rule: the smallest the config takes, so bodies cross it.
const MAX_BYTES: usize = 1_024;

fn config(on_error: u64) -> Config {
    let json = format!(
        r#"{{"rules":[{{"name":"tokens",
            "limit":{{"algorithm":"token_bucket","capacity":100000,"refill":100000,"period":"1m"}},
            "cost":{{"body":{{"max_bytes":{MAX_BYTES}}},"default":{DEFAULT},"max":{MAX}}},
            "commit":{{"body":{{"max_bytes":{MAX_BYTES}}},"on_error":{on_error}}}}}]}}"#
    );
    config::parse(json.as_bytes()).unwrap()
}

/// A request whose only fact is its body, read as the filter reads it.
struct Body<'a>(&'a [u8]);

impl FactSource for Body<'_> {
    fn fetch(&mut self, fact: &Fact) -> Option<Vec<u8>> {
        let Fact::RequestBodyEstimate(estimate) = fact else {
            return None;
        };
        let body = if self.0.len() > estimate.max_bytes {
            RequestBody::TooLarge
        } else {
            RequestBody::Complete(self.0)
        };
        estimate.estimate(body).map(|n| n.to_string().into_bytes())
    }
}

/// How a client writes a max-token field.
#[derive(Debug, Clone)]
enum Written {
    Int(u64),
    /// `N.0`, `Ne0`, `N.0E+0`: a whole number in float syntax.
    Float(u64, u8),
    Fraction(u64),
    Negative(u64),
    Text(u64),
    Null,
    Huge,
    Bool,
}

impl Written {
    fn json(&self) -> String {
        match self {
            Written::Int(n) => n.to_string(),
            Written::Float(n, 0) => format!("{n}.0"),
            Written::Float(n, 1) => format!("{n}e0"),
            Written::Float(n, _) => format!("{n}.0E+0"),
            Written::Fraction(n) => format!("{n}.5"),
            Written::Negative(n) => format!("-{n}"),
            Written::Text(n) => format!("\"{n}\""),
            Written::Null => "null".to_string(),
            Written::Huge => "1e30".to_string(),
            Written::Bool => "true".to_string(),
        }
    }

    /// The most tokens a lenient backend may read from it (`None`: not set, or refused;
    /// `u64::MAX`: no bound).
    fn backend_reads(&self) -> Option<u64> {
        match self {
            Written::Int(n) | Written::Float(n, _) | Written::Text(n) => Some(*n),
            Written::Fraction(n) => Some(n + 1),
            Written::Huge => Some(u64::MAX),
            Written::Negative(_) | Written::Null | Written::Bool => None,
        }
    }
}

fn written() -> impl Strategy<Value = Written> {
    let n = || prop_oneof![0..20u64, 0..20_000u64, Just(u64::MAX)];
    prop_oneof![
        4 => n().prop_map(Written::Int),
        2 => (0..20_000u64, 0..3u8).prop_map(|(n, s)| Written::Float(n, s)),
        1 => (0..20_000u64).prop_map(Written::Fraction),
        1 => (1..20_000u64).prop_map(Written::Negative),
        1 => (0..20_000u64).prop_map(Written::Text),
        1 => Just(Written::Null),
        1 => Just(Written::Huge),
        1 => Just(Written::Bool),
    ]
}

/// A request body: each default max-token field set or not, a prompt, maybe not JSON.
#[derive(Debug, Clone)]
struct Request {
    fields: [Option<Written>; 4],
    prompt: usize,
    json: bool,
}

impl Request {
    fn body(&self) -> Vec<u8> {
        if !self.json {
            return format!("max_tokens=5&prompt={}", "p".repeat(self.prompt)).into_bytes();
        }
        let mut parts = vec![format!("\"prompt\":\"{}\"", "p".repeat(self.prompt))];
        let names = ["max_tokens", "max_completion_tokens", "max_output_tokens"];
        for (name, value) in names.iter().zip(&self.fields) {
            if let Some(v) = value {
                parts.push(format!("\"{name}\":{}", v.json()));
            }
        }
        if let Some(v) = &self.fields[3] {
            parts.push(format!(
                "\"generationConfig\":{{\"maxOutputTokens\":{}}}",
                v.json()
            ));
        }
        format!("{{{}}}", parts.join(",")).into_bytes()
    }
}

fn request() -> impl Strategy<Value = Request> {
    let field = || proptest::option::weighted(0.4, written());
    (
        [field(), field(), field(), field()],
        prop_oneof![0..200usize, 0..1_500usize],
        proptest::bool::weighted(0.9),
    )
        .prop_map(|(fields, prompt, json)| Request {
            fields,
            prompt,
            json,
        })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    JsonOpenai,
    JsonAnthropic,
    JsonWithoutUsage,
    /// OpenAI chat chunks, with or without the `include_usage` event.
    StreamOpenai(bool),
    StreamAnthropic,
    StreamResponses,
    /// Cumulative `usageMetadata` in every event.
    StreamGemini,
    StreamWithoutUsage,
}

impl Shape {
    fn is_stream(self) -> bool {
        !matches!(
            self,
            Shape::JsonOpenai | Shape::JsonAnthropic | Shape::JsonWithoutUsage
        )
    }
}

/// A response as the upstream sends it.
#[derive(Debug, Clone)]
struct Response {
    status: Option<u16>,
    encoding: Option<&'static str>,
    shape: Shape,
    usage: u64,
    /// `\n`, `\r` or `\r\n`.
    line_end: &'static str,
    split_data: bool,
    /// Padding in one event (or the JSON body), and which: past `max_bytes` or not.
    pad: usize,
    padded_event: usize,
    /// The content type says JSON for a stream, or a stream for JSON.
    mislabelled: bool,
    chunk: usize,
    /// Where the body was cut (a fraction of its length), if it was.
    cut: Option<proptest::sample::Index>,
    /// Whether the response ended (an upstream may end a short body) or was cut.
    ended: bool,
    /// Envoy made this reply itself (a route timeout's 504, a reset upstream's 503):
    /// its body is Envoy's text, with no usage.
    local: bool,
}

/// A rendered body and the usages it reports: (offset just past the report's last
/// byte, the usage a reader of the bytes up to there may read).
struct Rendered {
    bytes: Vec<u8>,
    reports: Vec<(usize, u64)>,
}

impl Response {
    fn render(&self) -> Rendered {
        if self.local {
            return Rendered {
                bytes: b"upstream request timeout".to_vec(),
                reports: Vec::new(),
            };
        }
        let u = self.usage;
        let input = u / 3;
        let pad = |i: usize| -> String {
            if i == self.padded_event {
                format!(",\"pad\":\"{}\"", "x".repeat(self.pad))
            } else {
                String::new()
            }
        };
        if !self.shape.is_stream() {
            let body = match self.shape {
                Shape::JsonOpenai => format!(
                    r#"{{"id":"c","choices":[]{},"usage":{{"prompt_tokens":{input},"completion_tokens":{},"total_tokens":{u}}}}}"#,
                    pad(0),
                    u - input
                ),
                Shape::JsonAnthropic => format!(
                    r#"{{"type":"message"{},"usage":{{"input_tokens":{input},"output_tokens":{}}}}}"#,
                    pad(0),
                    u - input
                ),
                _ => format!(r#"{{"id":"c","choices":[]{}}}"#, pad(0)),
            };
            let reports = match self.shape {
                Shape::JsonWithoutUsage => vec![],
                _ => vec![(body.len(), u)],
            };
            return Rendered {
                bytes: body.into_bytes(),
                reports,
            };
        }
        // Events: (event name, JSON, the usage a reader has once this event is in).
        let words = 4;
        let mut events: Vec<(Option<&str>, String, Option<u64>)> = Vec::new();
        match self.shape {
            Shape::StreamOpenai(with_usage) => {
                for i in 0..words {
                    events.push((
                        None,
                        format!(r#"{{"choices":[{{"delta":{{"content":"w"}}}}]{}}}"#, pad(i)),
                        None,
                    ));
                }
                if with_usage {
                    events.push((
                        None,
                        format!(
                            r#"{{"choices":[]{},"usage":{{"prompt_tokens":{input},"total_tokens":{u}}}}}"#,
                            pad(words)
                        ),
                        Some(u),
                    ));
                }
                events.push((None, "[DONE]".to_string(), None));
            }
            Shape::StreamAnthropic => {
                events.push((
                    Some("message_start"),
                    format!(
                        r#"{{"type":"message_start","message":{{"usage":{{"input_tokens":{input},"output_tokens":1}}}}{}}}"#,
                        pad(0)
                    ),
                    None,
                ));
                for i in 1..words {
                    events.push((
                        Some("content_block_delta"),
                        format!(r#"{{"type":"content_block_delta"{}}}"#, pad(i)),
                        None,
                    ));
                }
                events.push((
                    Some("message_delta"),
                    format!(
                        r#"{{"type":"message_delta","usage":{{"output_tokens":{}}}{}}}"#,
                        u - input,
                        pad(words)
                    ),
                    Some(u),
                ));
            }
            Shape::StreamResponses => {
                events.push((
                    Some("response.created"),
                    format!(
                        r#"{{"type":"response.created","response":{{"id":"r","usage":null}}{}}}"#,
                        pad(0)
                    ),
                    None,
                ));
                for i in 1..words {
                    events.push((
                        Some("response.output_text.delta"),
                        format!(
                            r#"{{"type":"response.output_text.delta","delta":"w"{}}}"#,
                            pad(i)
                        ),
                        None,
                    ));
                }
                events.push((
                    Some("response.completed"),
                    format!(
                        r#"{{"type":"response.completed","response":{{"id":"r","usage":{{"input_tokens":{input},"output_tokens":{},"total_tokens":{u}}}}}{}}}"#,
                        u - input,
                        pad(words)
                    ),
                    Some(u),
                ));
            }
            Shape::StreamGemini => {
                for i in 0..=words {
                    let so_far = u * (i as u64 + 1) / (words as u64 + 1);
                    events.push((
                        None,
                        format!(
                            r#"{{"candidates":[]{},"usageMetadata":{{"promptTokenCount":{input},"totalTokenCount":{so_far}}}}}"#,
                            pad(i)
                        ),
                        Some(so_far),
                    ));
                }
            }
            _ => {
                for i in 0..words {
                    events.push((None, format!(r#"{{"choices":[]{}}}"#, pad(i)), None));
                }
            }
        }
        let mut bytes = String::new();
        let mut reports = Vec::new();
        let end = self.line_end;
        for (name, json, usage) in events {
            if let Some(name) = name {
                bytes += &format!("event: {name}{end}");
            }
            let lines: Vec<String> = match json.split_once(',') {
                Some((head, tail)) if self.split_data => {
                    vec![format!("data: {head},"), format!("data:{tail}")]
                }
                _ => vec![format!("data: {json}")],
            };
            let mut last_line_end = bytes.len();
            for line in lines {
                bytes += &line;
                last_line_end = bytes.len();
                bytes += end;
            }
            bytes += end;
            // The event is whole once its last data line is (its line end may be cut).
            if let Some(u) = usage {
                reports.push((last_line_end, u));
            }
        }
        Rendered {
            bytes: bytes.into_bytes(),
            reports,
        }
    }

    fn content_type(&self) -> &'static str {
        match (self.shape.is_stream(), self.mislabelled) {
            (true, false) | (false, true) => "text/event-stream; charset=utf-8",
            _ => "application/json",
        }
    }
}

fn response() -> impl Strategy<Value = Response> {
    let status = prop_oneof![
        6 => Just(Some(200u16)),
        1 => proptest::sample::select(vec![
            None,
            Some(101),
            Some(201),
            Some(204),
            Some(206),
            Some(301),
            Some(304),
        ]),
        2 => proptest::sample::select(vec![
            Some(400u16),
            Some(401),
            Some(404),
            Some(413),
            Some(422),
            Some(429),
            Some(499),
        ]),
        2 => proptest::sample::select(vec![Some(500u16), Some(502), Some(503), Some(504), Some(599)]),
    ];
    let encoding = prop_oneof![
        6 => Just(None),
        1 => proptest::sample::select(vec![
            Some("identity"),
            Some(""),
            Some("gzip"),
            Some("GZIP"),
            Some("br"),
            Some("deflate, gzip"),
            Some("identity, gzip"),
            Some("zstd"),
        ]),
    ];
    let shape = proptest::sample::select(vec![
        Shape::JsonOpenai,
        Shape::JsonAnthropic,
        Shape::JsonWithoutUsage,
        Shape::StreamOpenai(true),
        Shape::StreamOpenai(false),
        Shape::StreamAnthropic,
        Shape::StreamResponses,
        Shape::StreamGemini,
        Shape::StreamWithoutUsage,
    ]);
    (
        (status, encoding, shape, prop_oneof![0..50u64, 0..20_000u64]),
        (
            proptest::sample::select(vec!["\n", "\r", "\r\n"]),
            any::<bool>(),
            prop_oneof![3 => 0..200usize, 1 => 900..1_500usize],
            0..6usize,
            proptest::bool::weighted(0.1),
        ),
        (
            prop_oneof![1..8usize, 1..300usize],
            proptest::option::weighted(0.4, any::<proptest::sample::Index>()),
            proptest::bool::weighted(0.2),
            proptest::bool::weighted(0.2),
        ),
    )
        .prop_map(
            |(
                (status, encoding, shape, usage),
                (line_end, split_data, pad, padded_event, mislabelled),
                (chunk, cut, ended_anyway, local),
            )| Response {
                local,
                status,
                encoding,
                shape,
                usage,
                line_end,
                split_data,
                pad,
                padded_event,
                mislabelled,
                chunk,
                ended: cut.is_none() || ended_anyway,
                cut,
            },
        )
}

/// What the filter does with a response for a body commit: a 5xx is not read; else
/// the scanner reads what arrived.
fn seen(config: &Config, response: &Response, delivered: &[u8]) -> ResponseSeen {
    let rule = &config.rules[0];
    let Some(commit) = &rule.commit else {
        panic!("the rule has a commit")
    };
    let CommitSource::Body { fields, max_bytes } = &commit.source else {
        panic!("a body commit")
    };
    let usage = if response.status.is_some_and(|s| s >= 500) {
        Err(Unread::NoUsage)
    } else {
        let mut scanner = UsageScanner::for_response(
            fields,
            *max_bytes,
            Some(response.content_type().as_bytes()),
            response.encoding.map(str::as_bytes),
        );
        for chunk in delivered.chunks(response.chunk) {
            scanner.feed(chunk);
        }
        scanner.finish()
    };
    ResponseSeen {
        status: response.status,
        from_upstream: !response.local,
        ended: response.ended,
        usage,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_048, ..ProptestConfig::default() })]

    #[test]
    fn no_client_chosen_input_costs_less_than_its_estimate_without_a_usage(
        request in request(),
        response in response(),
        on_error in prop_oneof![Just(0u64), 0..MAX],
    ) {
        let config = config(on_error);
        let rule = &config.rules[0];
        let body = request.body();
        let reserved = rule.cost(&mut Facts::new(&config.facts, Body(&body)));

        // The estimate covers what the body lets the backend generate.
        if request.json && body.len() <= MAX_BYTES {
            for field in request.fields.iter().flatten() {
                if let Some(n) = field.backend_reads() {
                    prop_assert!(
                        reserved >= n.min(MAX),
                        "{field:?} may generate {n}, estimated {reserved}"
                    );
                }
            }
        } else if request.json {
            prop_assert_eq!(reserved, MAX, "a body too large to read");
        }

        let rendered = response.render();
        let delivered_len = response
            .cut
            .map_or(rendered.bytes.len(), |i| i.index(rendered.bytes.len() + 1));
        let delivered = &rendered.bytes[..delivered_len];
        let seen = seen(&config, &response, delivered);
        let settled = Settlement::of(reserved, on_error, &seen);
        let whole_reports: Vec<u64> = rendered
            .reports
            .iter()
            .filter(|(at, _)| *at <= delivered_len)
            .map(|(_, u)| *u)
            .collect();
        let is_5xx = response.status.is_some_and(|s| (500..=599).contains(&s));
        let identity = UsageScanner::is_identity(response.encoding.map(str::as_bytes));

        match settled.reason {
            SettleReason::UpstreamError => {
                prop_assert!(is_5xx && !response.local, "only the upstream's own 5xx");
                prop_assert_eq!(settled.cost, on_error);
            }
            SettleReason::Usage => {
                prop_assert!(!is_5xx && identity);
                prop_assert!(
                    whole_reports.contains(&settled.cost),
                    "settled at {} but the upstream sent only {:?} whole (of {:?}) in {:?}",
                    settled.cost,
                    whole_reports,
                    rendered.reports,
                    String::from_utf8_lossy(delivered)
                );
            }
            other => {
                prop_assert_eq!(settled.cost, reserved, "{:?}", other);
                prop_assert!(other != SettleReason::NotForwarded);
            }
        }
        if settled.cost < reserved {
            prop_assert!(
                settled.reason == SettleReason::Usage || settled.reason == SettleReason::UpstreamError
            );
        }
        // Not vacuous: a whole, readable response is settled at its last usage.
        let readable = !is_5xx
            && !response.local
            && identity
            && !response.mislabelled
            && response.cut.is_none()
            && response.pad < 900;
        if readable {
            match rendered.reports.last() {
                Some((_, last)) => prop_assert_eq!(
                    (settled.cost, settled.reason),
                    (*last, SettleReason::Usage),
                    "{}",
                    String::from_utf8_lossy(delivered)
                ),
                None => prop_assert_eq!(settled.reason, SettleReason::NoUsage),
            }
        }
        let upstream_5xx = is_5xx && !response.local;
        // A 5xx's body is not read, so its encoding does not matter.
        if !identity && !is_5xx {
            prop_assert_eq!(settled.reason, SettleReason::Compressed);
        }
        if !response.ended && !upstream_5xx && identity && settled.reason != SettleReason::Usage {
            prop_assert_eq!(settled.reason, SettleReason::Aborted);
        }
        if response.local && response.ended && identity && response.status.is_some() {
            prop_assert_eq!(
                (settled.cost, settled.reason),
                (reserved, SettleReason::LocalReply),
                "a reply Envoy made keeps the estimate"
            );
        }
    }
}

/// The request a client picks to make its estimate small, from issue 19.
#[test]
fn the_issues_request_is_estimated_from_its_largest_field() {
    let config = config(0);
    let body = br#"{"max_tokens":1,"max_completion_tokens":8000}"#;
    let reserved = config.rules[0].cost(&mut Facts::new(&config.facts, Body(body)));
    assert_eq!(reserved, MAX.min(8_000 + (body.len() as u64).div_ceil(4)));
}
