//! The HTTP context: one request's decision, carried out.
//!
//! `on_http_request_headers` asks the core's engine. Local rules and global rules
//! served from a lease or a cached denial are decided at once. Global rules that need
//! Redis are sent to weir-bridge in one `dispatch_http_call`; the request is paused and
//! `on_http_call_response` hands `(status, body)` to the pure decoder, completes the
//! evaluation and resumes the request or answers it. Envoy bounds the wait with the
//! configured timeout (a timed-out call arrives as a 504).

use crate::host::{self, LogLevel};
use crate::plugin::Plugin;
use crate::store::{RequestFacts, SharedData};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;
use weir_core::bounds::MAX_BODY_BYTES;
use weir_core::engine::Evaluation;
use weir_core::response::{self, Denial, HeaderStyle};
use weir_core::rules::Facts;
use weir_core::wire::v2;
use weir_core::wire::{ReplyError, SECRET_HEADER};

pub struct Filter {
    context_id: u32,
    plugin: Option<Rc<Plugin>>,
    /// The evaluation waiting for the bridge, and when the call left (µs).
    waiting: Option<(Evaluation, u64)>,
    /// Headers to add to the upstream's response (RateLimit on allowed requests, the
    /// shadow header).
    response_headers: Vec<(String, String)>,
    /// This filter answered the request itself; its reply already has its headers.
    replied: bool,
}

impl Filter {
    pub fn new(context_id: u32, plugin: Option<Rc<Plugin>>) -> Self {
        Filter {
            context_id,
            plugin,
            waiting: None,
            response_headers: Vec::new(),
            replied: false,
        }
    }

    fn log(&self, level: LogLevel, message: impl FnOnce() -> String) {
        if host::log_enabled(level) {
            host::log(level, &format!("#{}: {}", self.context_id, message()));
        }
    }

    /// Sends the bridge call for `eval.pending`; `Ok(())` means the request must wait.
    fn call_bridge(&mut self, plugin: &Plugin, eval: &Evaluation) -> Result<(), ReplyError> {
        let Some(bridge) = &plugin.engine.config.bridge else {
            return Err(ReplyError::Unavailable);
        };
        let body = plugin.engine.bridge_request(&eval.pending);
        let mut headers = vec![
            (":method", "POST"),
            (":path", v2::ACQUIRE_PATH),
            (":authority", bridge.authority.as_str()),
            ("content-type", "application/json"),
        ];
        if let Some(secret) = &bridge.secret {
            headers.push((SECRET_HEADER, secret.as_str()));
        }
        match host::http_call(&bridge.cluster, headers, &body, bridge.timeout_ms) {
            Ok(_token) => {
                plugin.metrics.bridge_call();
                Ok(())
            }
            Err(e) => {
                self.log(LogLevel::Warn, || {
                    format!("cannot call the bridge cluster {:?}: {e}", bridge.cluster)
                });
                Err(ReplyError::Unavailable)
            }
        }
    }

    /// Carries out a finished evaluation: metrics, logs, then the denial or the headers
    /// for the upstream's response. Returns whether the request may go on.
    fn finish(&mut self, plugin: &Plugin, eval: &Evaluation, now_us: u64) -> bool {
        plugin.metrics.record(eval, now_us);
        let engine = &plugin.engine;
        let settings = &engine.config.response;
        if !eval.shadow_limited.is_empty() {
            let names: Vec<&str> = eval
                .shadow_limited
                .iter()
                .map(|&r| engine.rule_name(r))
                .collect();
            let names = names.join(", ");
            self.log(LogLevel::Info, || {
                format!("shadow rule(s) {names} would have limited this request")
            });
            if let Some(header) = &settings.shadow_header {
                self.response_headers.push((header.clone(), names));
            }
        }
        if let Some(error) = &eval.bridge_error {
            self.log(LogLevel::Debug, || {
                format!("bridge: {error:?}; failure modes applied")
            });
        }
        // The verdicts (rule names and policies) are only built when headers need them.
        let denial = if let Some(denied_by) = eval.denied_by {
            let verdicts = engine.rule_verdicts(eval);
            let grpc = is_grpc_request();
            let rule = engine.rule_name(denied_by);
            self.log(LogLevel::Debug, || format!("limited by rule {rule}"));
            Some(response::denial(settings, &verdicts, grpc))
        } else if let Some(rule) = eval.unavailable {
            let rule = engine.rule_name(rule);
            self.log(LogLevel::Warn, || {
                format!("rule {rule}: bridge unavailable, failure_mode deny")
            });
            Some(response::unavailable(rule, is_grpc_request()))
        } else {
            None
        };
        if let Some(denial) = denial {
            return !self.send(&denial);
        }
        if settings.headers_on_allowed && settings.header_style != HeaderStyle::None {
            let verdicts = engine.rule_verdicts(eval);
            for (name, value) in response::rate_limit_headers(settings.header_style, &verdicts) {
                self.response_headers.push((name.to_string(), value));
            }
        }
        true
    }

    /// Answers the request with `denial`; false if the host refused (the request then
    /// goes on: a reply we cannot send must not hang it).
    fn send(&mut self, denial: &Denial) -> bool {
        let mut headers: Vec<(&str, &str)> = denial
            .headers
            .iter()
            .map(|(n, v)| (*n, v.as_str()))
            .collect();
        for (name, value) in &self.response_headers {
            headers.push((name.as_str(), value.as_str()));
        }
        let (body, grpc_status) = match (denial.grpc_status, &denial.grpc_message) {
            (Some(code), Some(message)) => (message.as_bytes(), code as i32),
            _ => (denial.body.as_slice(), -1),
        };
        match host::send_local_response(u32::from(denial.status), &headers, body, grpc_status) {
            Ok(()) => {
                self.replied = true;
                true
            }
            Err(e) => {
                self.log(LogLevel::Error, || {
                    format!("cannot send the denial ({e}); letting the request through")
                });
                false
            }
        }
    }
}

fn is_grpc_request() -> bool {
    let content_type = host::request_header("content-type").ok().flatten();
    response::is_grpc(content_type.as_deref())
}

impl Context for Filter {
    fn on_http_call_response(
        &mut self,
        _token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        let Some(plugin) = self.plugin.clone() else {
            return;
        };
        let Some((mut eval, sent_at)) = self.waiting.take() else {
            return;
        };
        let now_us = host::now_us().unwrap_or(sent_at);
        plugin
            .metrics
            .bridge_latency(now_us.saturating_sub(sent_at));
        let status = host::http_call_response_header(":status")
            .ok()
            .flatten()
            .and_then(|s| {
                std::str::from_utf8(&s)
                    .ok()
                    .and_then(|s| s.parse::<u16>().ok())
            })
            // No `:status` at all: the connection failed before a response.
            .unwrap_or(0);
        let reply = if body_size > MAX_BODY_BYTES {
            Err(ReplyError::BadBody(format!("{body_size} bytes")))
        } else {
            let body = host::http_call_response_body(body_size)
                .ok()
                .flatten()
                .unwrap_or_default();
            v2::decode_reply(status, &body, &plugin.engine.sent(&eval.pending))
        };
        if let Err(error) = &reply {
            self.log(LogLevel::Warn, || format!("{error}"));
        }
        plugin
            .engine
            .complete(&mut eval, &SharedData, sent_at, now_us, reply);
        if self.finish(&plugin, &eval, now_us) {
            if let Err(e) = host::resume_http_request() {
                self.log(LogLevel::Error, || {
                    format!("cannot resume the request: {e}")
                });
            }
        }
    }
}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        // A VM without a valid configuration never gets traffic (Envoy refused the
        // config); if it does, the filter stays out of the way.
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        let Ok(now_us) = host::now_us() else {
            return Action::Continue;
        };
        let engine = &plugin.engine;
        let mut facts = Facts::new(&engine.config.facts, RequestFacts);
        let mut eval = engine.evaluate(&SharedData, &plugin.seed.get(), &mut facts, now_us);
        if !eval.pending.is_empty() {
            match self.call_bridge(&plugin, &eval) {
                Ok(()) => {
                    self.waiting = Some((eval, now_us));
                    return Action::Pause;
                }
                Err(error) => {
                    engine.complete(&mut eval, &SharedData, now_us, now_us, Err(error));
                }
            }
        }
        if self.finish(&plugin, &eval, now_us) {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if !self.replied {
            for (name, value) in &self.response_headers {
                let _ = host::add_response_header(name, value);
            }
        }
        Action::Continue
    }
}
