//! The HTTP context: one request's decision, carried out.

use crate::host::{self, LogLevel};
use crate::root::Plugin;
use crate::store::{RequestFacts, SharedData};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;
use weir_core::response::{self, HeaderStyle};
use weir_core::rules::Facts;

pub struct Filter {
    context_id: u32,
    plugin: Option<Rc<Plugin>>,
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
            response_headers: Vec::new(),
            replied: false,
        }
    }
}

impl Context for Filter {}

impl HttpContext for Filter {
    fn on_http_request_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        // A VM without a valid configuration never gets here with traffic (Envoy refused
        // the config); if it does, the filter stays out of the way.
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        let Ok(now_us) = host::now_us() else {
            return Action::Continue;
        };
        let engine = &plugin.engine;
        let settings = &engine.config.response;
        let mut facts = Facts::new(&engine.config.facts, RequestFacts);
        let eval = engine.evaluate(&SharedData, &plugin.seed, &mut facts, now_us);
        plugin.metrics.record(&eval);

        if !eval.shadow_limited.is_empty() {
            host::log(
                LogLevel::Info,
                &format!(
                    "weir #{}: shadow rule(s) {} would have limited this request",
                    self.context_id,
                    eval.shadow_limited.join(", ")
                ),
            );
            if let Some(name) = &settings.shadow_header {
                self.response_headers
                    .push((name.clone(), eval.shadow_limited.join(", ")));
            }
        }

        if let Some(denied_by) = eval.denied_by {
            let content_type = host::request_header("content-type").ok().flatten();
            let grpc = response::is_grpc(content_type.as_deref());
            let denial = response::denial(settings, &eval.verdicts, denied_by, grpc);
            let mut headers: Vec<(&str, &str)> = denial
                .headers
                .iter()
                .map(|(n, v)| (*n, v.as_str()))
                .collect();
            if let Some((name, value)) = self.response_headers.first() {
                headers.push((name.as_str(), value.as_str()));
            }
            let (body, grpc_status) = match (denial.grpc_status, &denial.grpc_message) {
                (Some(code), Some(message)) => (message.as_bytes(), code as i32),
                _ => (denial.body.as_slice(), -1),
            };
            if host::log_enabled(LogLevel::Debug) {
                let rule = eval.verdicts.get(denied_by).map_or("", |v| v.rule);
                host::log(
                    LogLevel::Debug,
                    &format!("weir #{}: limited by rule {rule}", self.context_id),
                );
            }
            match host::send_local_response(u32::from(denial.status), &headers, body, grpc_status) {
                Ok(()) => {
                    self.replied = true;
                    return Action::Pause;
                }
                Err(e) => {
                    host::log(
                        LogLevel::Error,
                        &format!(
                            "weir #{}: cannot send the denial ({e}); letting the request through",
                            self.context_id
                        ),
                    );
                    return Action::Continue;
                }
            }
        }

        if settings.headers_on_allowed && settings.header_style != HeaderStyle::None {
            for (name, value) in
                response::rate_limit_headers(settings.header_style, &eval.verdicts, None)
            {
                self.response_headers.push((name.to_string(), value));
            }
        }
        Action::Continue
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
