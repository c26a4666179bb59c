//! A stand-in for an LLM API, for the tests of costs known after the response: it
//! answers every request with the token usage the request asks for, the way OpenAI,
//! Anthropic or a plain header would report it, as one JSON body or as a server-sent
//! event stream spread over time.
//!
//! The request says what to answer (so one upstream serves every case of a test):
//! - `x-llm-usage: N` — the tokens the response reports (default 0);
//! - `x-llm-format`: `openai` (default: `usage.total_tokens`), `anthropic`
//!   (`input_tokens` + `output_tokens`, in a stream split between `message_start` and
//!   `message_delta`; `x-llm-input: N` sets `input_tokens`, `x-llm-cache-creation: N`
//!   adds `cache_creation_input_tokens`, both within the usage: the output is what is
//!   left), `responses` (OpenAI's Responses API: in a stream, the usage under
//!   `response.usage` of the `response.completed` event), or `header` (an
//!   `x-tokens-used: N` response header, body `ok`);
//! - `x-llm-stream: 1` — `text/event-stream`, chunked, events spread over the duration;
//! - `x-llm-usage-event: 0` — an OpenAI stream without its usage event (a request
//!   without `stream_options.include_usage`);
//! - `x-llm-line-end: cr` or `crlf` — the stream's lines end so (default LF);
//! - `x-llm-split-data: 1` — each event's JSON spread over two `data:` lines;
//! - `x-llm-content-encoding: E` — a `content-encoding: E` response header (the body is
//!   not encoded: enough to see that weir does not read it);
//! - `x-llm-duration-ms: D` — how long the response takes (default 0);
//! - `x-llm-pad: N` — an OpenAI JSON answer's content is N bytes longer, and its body is
//!   sent in two halves with the duration between them (a large body the filter keeps
//!   while it comes);
//! - `x-llm-status: S` — answer status `S` with an error body and no usage;
//! - `x-llm-output: N` — a model that would write N tokens and honours the body's
//!   bound: it writes the least of N and the body's largest max-token field
//!   (`max_tokens`, `max_completion_tokens`, `max_output_tokens`,
//!   `generationConfig.maxOutputTokens`), and reports `x-llm-usage` (then the prompt's
//!   tokens) plus that. A body that is not a JSON object, or a field that is not a whole
//!   number, gets 400. The bound each such request carried is recorded
//!   ([`LlmUpstream::bounds_received`]).
//!
//! Every 200 answer echoes the request's `accept-encoding` in `x-llm-accept-encoding`,
//! and says the tokens it reports in `x-llm-used` (an access log can key its lines by
//! what a model really used, bounded by the body it received).
//!
//! Plain blocking std code, a thread per connection, keep-alive. It counts the requests
//! it answered and those whose client went away before the end (a write failed), and
//! records what it received of every request ([`LlmUpstream::witness`]: headers, body
//! bytes, whether the body came whole).

use std::io::{self, BufReader, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use crate::loopback::{read_witnessed, Loopback, Witness};
use crate::{bridge_cluster_yaml, Bootstrap};

/// The response header carrying the usage in the `header` format.
pub const USAGE_HEADER: &str = "x-tokens-used";

#[derive(Default)]
struct Counters {
    answered: AtomicU64,
    cut_short: AtomicU64,
    /// The max-token bound of each request asking for `x-llm-output` (`None`: the body
    /// set none), in the order they came.
    bounds: Mutex<Vec<Option<u64>>>,
    witness: Witness,
}

/// The running upstream; stops accepting when dropped.
pub struct LlmUpstream {
    pub port: u16,
    counters: Arc<Counters>,
    listening: Loopback,
}

impl LlmUpstream {
    pub fn start() -> LlmUpstream {
        let counters = Arc::new(Counters::default());
        let shared = counters.clone();
        let listening = Loopback::serve("LLM upstream", move |conn| serve(conn, &shared));
        LlmUpstream {
            port: listening.port,
            counters,
            listening,
        }
    }

    /// Responses written to the end.
    pub fn answered(&self) -> u64 {
        self.counters.answered.load(Ordering::Relaxed)
    }

    /// Responses whose client (Envoy) went away before the end.
    pub fn cut_short(&self) -> u64 {
        self.counters.cut_short.load(Ordering::Relaxed)
    }

    /// The max-token bound each request asking for `x-llm-output` carried (`None`: its
    /// body set none), in the order they came.
    pub fn bounds_received(&self) -> Vec<Option<u64>> {
        self.counters
            .bounds
            .lock()
            .map(|b| b.clone())
            .unwrap_or_default()
    }

    /// What it received of every request, in the order their headers came.
    pub fn witness(&self) -> &Witness {
        &self.counters.witness
    }

    /// The Envoy cluster `llm` pointing here.
    pub fn cluster_yaml(&self) -> String {
        self.listening.cluster_yaml("llm", "")
    }

    /// An Envoy bootstrap with the HTTP filter `filter` (a YAML list item) in front of
    /// this upstream, and the `weir_bridge` cluster when a bridge port is given.
    pub fn bootstrap(&self, filter: String, bridge_port: Option<u16>) -> Bootstrap {
        let mut bootstrap = Bootstrap::new()
            .http_filter(filter)
            .cluster(self.cluster_yaml())
            .routes(LlmUpstream::routes_yaml());
        if let Some(port) = bridge_port {
            bootstrap = bootstrap.cluster(bridge_cluster_yaml(port));
        }
        bootstrap
    }

    /// Routes every path to the `llm` cluster, with a timeout long enough for streams.
    pub fn routes_yaml() -> String {
        "- match: { prefix: \"/\" }\n  route: { cluster: llm, timeout: 30s }\n".to_string()
    }
}

/// What one request asked for.
#[derive(Debug, Default, Clone)]
struct Ask {
    usage: u64,
    format: String,
    stream: bool,
    duration_ms: u64,
    status: u16,
    /// The OpenAI stream's usage event is sent.
    usage_event: bool,
    line_end: String,
    split_data: bool,
    /// Bytes added to a JSON answer's content.
    pad: usize,
    /// `x-llm-output`: the tokens the model would write, within the body's bound.
    output: Option<u64>,
    /// Anthropic's `input_tokens` (default: a third of the usage).
    input: Option<u64>,
    /// Anthropic's `cache_creation_input_tokens` (0: the field is not sent).
    cache_creation: u64,
    /// Response headers: `content-encoding` and the `accept-encoding` echo.
    extra_headers: String,
}

fn serve(conn: TcpStream, counters: &Counters) {
    let Ok(mut writer) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    while let Some(ask) = read_witnessed(&mut reader, &counters.witness)
        .and_then(|(headers, body)| Ask::from_request(&headers, &body, counters))
    {
        match answer(&mut writer, &ask) {
            Ok(()) => {
                counters.answered.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                counters.cut_short.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }
}

impl Ask {
    /// What the request asks for: its headers, and with `x-llm-output` the bound its
    /// body sets (recorded in `counters`).
    fn from_request(headers: &[(String, String)], body: &[u8], counters: &Counters) -> Option<Ask> {
        let mut ask = Ask::from_headers(headers)?;
        let Some(output) = ask.output else {
            return Some(ask);
        };
        match body_bound(body) {
            Ok(bound) => {
                if let Ok(mut bounds) = counters.bounds.lock() {
                    bounds.push(bound);
                }
                ask.usage += bound.map_or(output, |b| b.min(output));
            }
            Err(()) => ask.status = 400,
        }
        Some(ask)
    }

    /// What the headers ask for; `None` (the connection is closed) for a value that is
    /// not a number where one is expected.
    fn from_headers(headers: &[(String, String)]) -> Option<Ask> {
        let mut ask = Ask {
            format: "openai".to_string(),
            status: 200,
            usage_event: true,
            line_end: "lf".to_string(),
            ..Ask::default()
        };
        let mut accept_encoding = String::new();
        for (name, value) in headers {
            match name.as_str() {
                "x-llm-usage" => ask.usage = value.parse().ok()?,
                "x-llm-format" => ask.format = value.clone(),
                "x-llm-stream" => ask.stream = value == "1",
                "x-llm-duration-ms" => ask.duration_ms = value.parse().ok()?,
                "x-llm-status" => ask.status = value.parse().ok()?,
                "x-llm-usage-event" => ask.usage_event = value != "0",
                "x-llm-line-end" => ask.line_end = value.clone(),
                "x-llm-split-data" => ask.split_data = value == "1",
                "x-llm-pad" => ask.pad = value.parse().ok()?,
                "x-llm-output" => ask.output = Some(value.parse().ok()?),
                "x-llm-input" => ask.input = Some(value.parse().ok()?),
                "x-llm-cache-creation" => ask.cache_creation = value.parse().ok()?,
                "x-llm-content-encoding" => {
                    ask.extra_headers += &format!("content-encoding: {value}\r\n");
                }
                "accept-encoding" => accept_encoding = value.clone(),
                _ => {}
            }
        }
        ask.extra_headers += &format!("x-llm-accept-encoding: {accept_encoding}\r\n");
        Some(ask)
    }
}

/// The response header saying what a 200 answer reports as its usage.
pub const USED_HEADER: &str = "x-llm-used";

impl Ask {
    /// Anthropic's `input_tokens` and `output_tokens`: the usage less the cache tokens,
    /// split as asked.
    fn anthropic_split(&self) -> (u64, u64) {
        let uncached = self.usage.saturating_sub(self.cache_creation);
        let input = self.input.unwrap_or(uncached / 3).min(uncached);
        (input, uncached - input)
    }

    /// `"cache_creation_input_tokens":N,` when asked for, else nothing.
    fn cache_field(&self) -> String {
        if self.cache_creation == 0 {
            return String::new();
        }
        format!(r#""cache_creation_input_tokens":{},"#, self.cache_creation)
    }
}

/// The largest max-token field of a request body (`None`: it sets none); `Err` for a
/// body that is not a JSON object or a field that is not a whole number — what an LLM
/// API answers 400.
fn body_bound(body: &[u8]) -> Result<Option<u64>, ()> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|_| ())?;
    if !value.is_object() {
        return Err(());
    }
    let fields = [
        value.get("max_tokens"),
        value.get("max_completion_tokens"),
        value.get("max_output_tokens"),
        value
            .get("generationConfig")
            .and_then(|g| g.get("maxOutputTokens")),
    ];
    let mut bound = None;
    for field in fields.into_iter().flatten().filter(|v| !v.is_null()) {
        let n = field.as_u64().ok_or(())?;
        bound = Some(bound.map_or(n, |b: u64| b.max(n)));
    }
    Ok(bound)
}

fn answer(w: &mut TcpStream, ask: &Ask) -> io::Result<()> {
    if ask.status != 200 {
        thread::sleep(Duration::from_millis(ask.duration_ms));
        let body = r#"{"error":{"message":"the test asked for an error"}}"#;
        return write!(
            w,
            "HTTP/1.1 {} Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            ask.status,
            body.len()
        );
    }
    let ask = &Ask {
        extra_headers: format!("{}{USED_HEADER}: {}\r\n", ask.extra_headers, ask.usage),
        ..ask.clone()
    };
    if !ask.stream {
        if ask.pad == 0 {
            thread::sleep(Duration::from_millis(ask.duration_ms));
        }
        let (content_type, extra, body) = match ask.format.as_str() {
            "header" => (
                "text/plain",
                format!("{USAGE_HEADER}: {}\r\n", ask.usage),
                "ok".to_string(),
            ),
            "anthropic" => {
                let (input, output) = ask.anthropic_split();
                (
                    "application/json",
                    String::new(),
                    format!(
                        r#"{{"type":"message","content":[{{"type":"text","text":"hi"}}],"usage":{{"input_tokens":{input},{}"output_tokens":{output}}}}}"#,
                        ask.cache_field()
                    ),
                )
            }
            _ => {
                let prompt = ask.usage / 3;
                (
                    "application/json",
                    String::new(),
                    format!(
                        r#"{{"id":"chatcmpl-test","object":"chat.completion","choices":[{{"index":0,"message":{{"role":"assistant","content":"hi{}"}}}}],"usage":{{"prompt_tokens":{prompt},"completion_tokens":{},"total_tokens":{}}}}}"#,
                        "x".repeat(ask.pad),
                        ask.usage - prompt,
                        ask.usage
                    ),
                )
            }
        };
        write!(
            w,
            "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\n{extra}{}content-length: {}\r\n\r\n",
            ask.extra_headers,
            body.len()
        )?;
        if ask.pad == 0 {
            return w.write_all(body.as_bytes());
        }
        let (first, second) = body.as_bytes().split_at(body.len() / 2);
        w.write_all(first)?;
        w.flush()?;
        thread::sleep(Duration::from_millis(ask.duration_ms));
        w.write_all(second)?;
        return w.flush();
    }
    write!(
        w,
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{}transfer-encoding: chunked\r\n\r\n",
        ask.extra_headers
    )?;
    let events: Vec<String> = stream_events(ask)
        .iter()
        .map(|event| shape(event, ask))
        .collect();
    let pause = Duration::from_millis(ask.duration_ms / events.len().max(1) as u64);
    for event in &events {
        thread::sleep(pause);
        write!(w, "{:x}\r\n{event}\r\n", event.len())?;
        w.flush()?;
    }
    write!(w, "0\r\n\r\n")?;
    w.flush()
}

/// An event (written with LF line ends, one `data:` line) as `ask` wants it: its JSON
/// over two `data:` lines (split after its first comma), its lines ended by CR or CRLF.
fn shape(event: &str, ask: &Ask) -> String {
    let mut event = event.to_string();
    if ask.split_data {
        event = event
            .split('\n')
            .map(
                |line| match line.strip_prefix("data: ").and_then(|d| d.split_once(',')) {
                    Some((head, tail)) => format!("data: {head},\ndata:{tail}"),
                    None => line.to_string(),
                },
            )
            .collect::<Vec<_>>()
            .join("\n");
    }
    match ask.line_end.as_str() {
        "cr" => event.replace('\n', "\r"),
        "crlf" => event.replace('\n', "\r\n"),
        _ => event,
    }
}

/// The events of a streamed answer: a few content deltas, then the usage.
fn stream_events(ask: &Ask) -> Vec<String> {
    let words = ["Rate", " limits", " are", " fun", "."];
    if ask.format == "responses" {
        let input = ask.usage / 3;
        let mut events = vec![
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\",\"usage\":null}}\n\n".to_string(),
        ];
        events.extend(words.iter().map(|w| {
            format!("event: response.output_text.delta\ndata: {{\"type\":\"response.output_text.delta\",\"delta\":\"{w}\"}}\n\n")
        }));
        events.push(format!(
            "event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"id\":\"resp_1\",\"status\":\"completed\",\"usage\":{{\"input_tokens\":{input},\"output_tokens\":{},\"total_tokens\":{}}}}}}}\n\n",
            ask.usage - input,
            ask.usage
        ));
        return events;
    }
    if ask.format == "anthropic" {
        let (input, output) = ask.anthropic_split();
        let mut events = vec![format!(
            "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"usage\":{{\"input_tokens\":{input},{}\"output_tokens\":1}}}}}}\n\n",
            ask.cache_field()
        )];
        events.extend(words.iter().map(|w| {
            format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"delta\":{{\"type\":\"text_delta\",\"text\":\"{w}\"}}}}\n\n")
        }));
        events.push(format!(
            "event: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":{output}}}}}\n\n"
        ));
        events.push("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_string());
        return events;
    }
    let mut events: Vec<String> = words
        .iter()
        .map(|w| {
            format!("data: {{\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{w}\"}}}}]}}\n\n")
        })
        .collect();
    if !ask.usage_event {
        events.push("data: [DONE]\n\n".to_string());
        return events;
    }
    events.push(format!(
        "data: {{\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":{},\"total_tokens\":{}}}}}\n\n",
        ask.usage.saturating_sub(1),
        ask.usage
    ));
    events.push("data: [DONE]\n\n".to_string());
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{Client, Request};

    #[test]
    fn answers_with_the_usage_asked_for_in_every_format() {
        let up = LlmUpstream::start();
        let mut c = Client::connect(up.port).unwrap();
        let ask = |format: &str, stream: bool| {
            Request::post("/v1/chat/completions", "{}")
                .header("x-llm-usage", "42")
                .header("x-llm-format", format)
                .header("x-llm-stream", if stream { "1" } else { "0" })
        };
        let r = c.request(ask("openai", false)).unwrap();
        assert!(String::from_utf8_lossy(&r.body).contains("\"total_tokens\":42"));
        let r = c.request(ask("openai", true)).unwrap();
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        assert!(String::from_utf8_lossy(&r.body).contains("\"total_tokens\":42}"));
        let r = c.request(ask("anthropic", true)).unwrap();
        let body = String::from_utf8_lossy(&r.body).to_string();
        assert!(body.contains("\"input_tokens\":14") && body.contains("\"output_tokens\":28"));
        let r = c.request(ask("header", false)).unwrap();
        assert_eq!(r.header(USAGE_HEADER), Some("42"));
        let r = c
            .request(Request::get("/").header("x-llm-status", "503"))
            .unwrap();
        assert_eq!(r.status, 503);
        // Counted once its write returned, which may be after the client read it (a CI
        // run read 4 here): wait for the count, then hold it to exactly 5.
        crate::process::wait_until(Duration::from_secs(5), Duration::from_millis(5), || {
            up.answered() >= 5
        });
        assert_eq!(up.answered(), 5);
    }
}
