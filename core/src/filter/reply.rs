//! A decided request carried out: stats, logs, filter state, then the denial — or the
//! headers the upstream's response will get.

use super::host::{self, Host, LogLevel};
use super::plugin::Plugin;
use crate::engine::{BridgeError, Evaluation, RuleOutcome, Source};
use crate::response::{self, Denial, FilterState, HeaderStyle};
use crate::time::Micros;
use std::fmt::Write as _;

/// What a request is answered, or what the upstream's answer gets.
#[derive(Debug, Default)]
pub struct Reply {
    /// The request's context, for the log.
    context_id: u32,
    /// Headers to add to the upstream's response (RateLimit on allowed requests, the
    /// shadow header, the delay header).
    headers: Vec<(String, String)>,
    /// The request was answered here; its reply already had its headers.
    replied: bool,
}

impl Reply {
    pub fn new(context_id: u32) -> Self {
        Reply {
            context_id,
            ..Reply::default()
        }
    }

    fn log<H: Host>(&self, host: &H, level: LogLevel, message: impl FnOnce() -> String) {
        host::log(host, self.context_id, level, message);
    }

    /// Sets a header for the upstream's response, replacing one of the same name.
    pub fn set_header(&mut self, name: &str, value: String) {
        self.headers.retain(|(n, _)| n != name);
        self.headers.push((name.to_string(), value));
    }

    /// The upstream's response headers are here: they get ours, unless this filter
    /// answered the request itself.
    pub fn on_response_headers<H: Host>(&self, host: &H) {
        if !self.replied {
            for (name, value) in &self.headers {
                let _ = host.add_response_header(name, value);
            }
        }
    }

    /// Carries out a finished evaluation: metrics, logs, filter state, then the denial
    /// or the headers for the upstream's response. Returns whether the request may go
    /// on (false: it was answered here).
    pub fn carry_out<H: Host>(
        &mut self,
        host: &H,
        plugin: &Plugin,
        eval: &Evaluation,
        now: Micros,
    ) -> bool {
        plugin.metrics.record(host, eval, now);
        let engine = &plugin.engine;
        let settings = &engine.config.response;
        if !eval.shadow_limited.is_empty() {
            let names: Vec<&str> = eval
                .shadow_limited
                .iter()
                .map(|&r| engine.rule_name(r))
                .collect();
            let names = names.join(", ");
            self.log(host, LogLevel::Info, || {
                format!("shadow rule(s) {names} would have limited this request")
            });
            if let Some(header) = &settings.shadow_header {
                self.headers.push((header.clone(), names));
            }
        }
        if let Some(error) = &eval.bridge_error {
            self.log(host, LogLevel::Warn, || match error {
                BridgeError::Reply(e) => format!("{e}; failure modes applied"),
                BridgeError::Skipped => {
                    "bridge skipped (calls to it failed in a row less than a second ago); \
                     failure modes applied"
                        .to_string()
                }
            });
        }
        let denied_rule = eval.denied_by.or(eval.unavailable);
        let denied_name = denied_rule.map(|r| engine.rule_name(r));
        match (settings.filter_state, denied_name) {
            (FilterState::All, _) | (FilterState::Denied, Some(_)) => {
                self.set_filter_state(host, plugin, eval, denied_name);
            }
            (FilterState::Rule, Some(rule)) => {
                let _ = host.set_property("weir.rule", rule.as_bytes());
            }
            _ => {}
        }
        // The verdicts (rule names and policies) are only built when headers need them.
        let denial = if let Some(denied_by) = eval.denied_by {
            let verdicts = engine.rule_verdicts(eval);
            let rule = engine.rule_name(denied_by);
            self.log(host, LogLevel::Debug, || format!("limited by rule {rule}"));
            Some(response::denial(settings, &verdicts, is_grpc_request(host)))
        } else if let Some(rule) = eval.unavailable {
            let rule = engine.rule_name(rule);
            self.log(host, LogLevel::Warn, || {
                format!("rule {rule}: bridge unavailable, failure_mode deny")
            });
            Some(response::unavailable(rule, is_grpc_request(host)))
        } else {
            None
        };
        if let Some(denial) = denial {
            if self.send(host, &denial) {
                return false;
            }
            // The host refused the reply: the request goes on to the upstream, so what
            // the rules counted for it (a concurrency place, an estimate) stays counted
            // until its response ends, as for an admitted request.
        }
        if settings.headers_on_allowed && settings.header_style != HeaderStyle::None {
            let verdicts = engine.rule_verdicts(eval);
            for (name, value) in response::rate_limit_headers(settings.header_style, &verdicts) {
                self.headers.push((name.to_string(), value));
            }
        }
        true
    }

    /// `wasm.weir.rule`: the rule that denied (empty when none did); `wasm.weir.decisions`:
    /// `rule:outcome:source:cost:decided_at_us` for every rule decided, comma-separated.
    fn set_filter_state<H: Host>(
        &self,
        host: &H,
        plugin: &Plugin,
        eval: &Evaluation,
        denied: Option<&str>,
    ) {
        let mut decisions = String::new();
        for report in &eval.reports {
            let outcome = match report.outcome {
                RuleOutcome::NotMatched | RuleOutcome::KeyMissing => continue,
                RuleOutcome::Allowed => "allowed",
                RuleOutcome::Limited => "limited",
                RuleOutcome::ShadowLimited => "shadow_limited",
                RuleOutcome::StoreFailed(_) => "store_failed",
                RuleOutcome::BridgeFailed(_) => "bridge_failed",
            };
            let source = match report.source {
                Some(Source::Slot) => "slot",
                Some(Source::Reservoir) => "reservoir",
                Some(Source::Lease) => "lease",
                Some(Source::DenialCache) => "cache",
                Some(Source::Bridge) => "bridge",
                Some(Source::Fallback) => "fallback",
                Some(Source::Refused) => "refused",
                None => "none",
            };
            let sep = if decisions.is_empty() { "" } else { "," };
            let _ = write!(
                decisions,
                "{sep}{}:{outcome}:{source}:{}:{}",
                plugin.engine.rule_name(report.rule),
                report.cost,
                report.decided_at_us
            );
        }
        let _ = host.set_property("weir.rule", denied.unwrap_or("").as_bytes());
        let _ = host.set_property("weir.decisions", decisions.as_bytes());
    }

    /// Answers the request with `denial`; false if the host refused (the request then
    /// goes on: a reply we cannot send must not hang it).
    fn send<H: Host>(&mut self, host: &H, denial: &Denial) -> bool {
        let mut headers: Vec<(&str, &str)> = denial
            .headers
            .iter()
            .map(|(n, v)| (*n, v.as_str()))
            .collect();
        for (name, value) in &self.headers {
            headers.push((name.as_str(), value.as_str()));
        }
        let (body, grpc_status) = match (denial.grpc_status, &denial.grpc_message) {
            (Some(code), Some(message)) => (message.as_bytes(), code as i32),
            _ => (denial.body.as_slice(), -1),
        };
        match host.send_local_response(u32::from(denial.status), &headers, body, grpc_status) {
            Ok(()) => {
                self.replied = true;
                true
            }
            Err(e) => {
                self.log(host, LogLevel::Error, || {
                    format!("cannot send the denial ({e}); letting the request through")
                });
                false
            }
        }
    }
}

fn is_grpc_request<H: Host>(host: &H) -> bool {
    let content_type = host.request_header("content-type").ok().flatten();
    response::is_grpc(content_type.as_deref())
}
