//! One request's decision, carried out.
//!
//! `on_request_headers` asks the core's engine. Local rules and global rules served from
//! what this Envoy holds (a lease, a reservation, a cached denial) are decided at once.
//! Global rules that need Redis either wait for a call of this VM already asking about
//! their keys (single flight, see `weir_core::flight`), or go to weir-bridge in one call
//! of their own; the request is paused meanwhile. The call's answer arrives through
//! [`crate::abi`], which completes the evaluation and hands it back here
//! ([`Filter::on_own_call_answered`]), then wakes the requests that waited on it
//! ([`Filter::on_flight_landed`]). Envoy bounds each call by the bridge timeout (a
//! timed-out call arrives as a 504), so a paused request always moves on.

use crate::host::{self, LogLevel};
use crate::plugin::Plugin;
use crate::store::{ReadFacts, RequestFacts, SharedData};
use std::fmt::Write as _;
use std::rc::Rc;
use weir_core::adaptive::Response;
use weir_core::buffers::Buffered;
use weir_core::engine::{BridgeError, Evaluation, PendingCommit, RuleOutcome, Source};
use weir_core::flight::Join;
use weir_core::response::{self, Denial, FilterState, HeaderStyle};
use weir_core::rules::CommitSource;
use weir_core::rules::Facts;
use weir_core::usage::settlement::ResponseSeen;
use weir_core::usage::{RequestBody, Unread, UsageScanner};

/// The response header of a request that was held: how long, in ms.
pub const DELAY_HEADER: &str = "x-weir-delay-ms";

/// What to tell Envoy after a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Action {
    Continue = 0,
    Pause = 1,
}

pub struct Filter {
    context_id: u32,
    plugin: Option<Rc<Plugin>>,
    /// The evaluation of a request waiting on another request's call, and that call.
    waiting: Option<(u32, Evaluation)>,
    /// Headers to add to the upstream's response (RateLimit on allowed requests, the
    /// shadow header).
    response_headers: Vec<(String, String)>,
    /// This filter answered the request itself; its reply already has its headers.
    replied: bool,
    /// The evaluation of a request a rule holds (`on_limit.delay`) until it is due.
    held: Option<Evaluation>,
    /// Costs to settle when the response ends (`commit`), with how far their reading got.
    settling: Vec<Settling>,
    /// The response's status, once its headers came.
    status: Option<u16>,
    /// A rule estimates this request's cost from its body: the decision waits for the
    /// body, buffered by Envoy up to this many bytes.
    reading_body: Option<usize>,
    /// What was read of the request body, kept until the request is decided.
    request_body: BodySeen,
    /// What the request body read for an estimate keeps of its VM's
    /// `max_buffered_bytes`.
    request_body_kept: Buffered,
    /// What the response body read for a usage keeps of it.
    response_body_kept: Buffered,
    /// The request's facts, read before its headers went on to wait for its body.
    read_facts: Option<ReadFacts>,
}

/// The request body as read for a cost estimate.
enum BodySeen {
    Absent,
    Complete(Vec<u8>),
    TooLarge,
}

impl BodySeen {
    fn as_request_body(&self) -> RequestBody<'_> {
        match self {
            BodySeen::Absent => RequestBody::Absent,
            BodySeen::Complete(bytes) => RequestBody::Complete(bytes),
            BodySeen::TooLarge => RequestBody::TooLarge,
        }
    }
}

/// A rule's cost to settle with the response, and the usage read so far from its body.
struct Settling {
    commit: PendingCommit,
    scanner: Option<UsageScanner>,
}

impl Filter {
    pub fn new(context_id: u32, plugin: Option<Rc<Plugin>>) -> Self {
        Filter {
            context_id,
            plugin,
            waiting: None,
            response_headers: Vec::new(),
            replied: false,
            held: None,
            settling: Vec::new(),
            status: None,
            reading_body: None,
            request_body: BodySeen::Absent,
            request_body_kept: Buffered::default(),
            response_body_kept: Buffered::default(),
            read_facts: None,
        }
    }

    /// This request's facts: from the host, or as read before its headers went on.
    fn facts(&self) -> RequestFacts<'_> {
        RequestFacts {
            body: self.request_body.as_request_body(),
            read: self.read_facts.as_ref(),
        }
    }

    fn log(&self, level: LogLevel, message: impl FnOnce() -> String) {
        if host::log_enabled(level) {
            host::log(level, &format!("#{}: {}", self.context_id, message()));
        }
    }

    pub fn on_request_headers(&mut self, end_of_stream: bool) -> Action {
        // A VM without a valid configuration never gets traffic (Envoy refused the
        // config); if it does, the filter stays out of the way.
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        let (read_response, body_wanted) = {
            let mut facts = Facts::new(&plugin.engine.config.facts, self.facts());
            let read_response = plugin.engine.reads_response_body(&mut facts);
            let body_wanted = if end_of_stream {
                None
            } else {
                plugin.engine.request_body_wanted(&mut facts)
            };
            (read_response, body_wanted)
        };
        if read_response {
            // A compressed body cannot be read (it keeps its estimate): ask the upstream
            // for the body as it is.
            if let Err(e) = host::replace_request_header("accept-encoding", "identity") {
                self.log(LogLevel::Warn, || {
                    format!("cannot set accept-encoding: identity ({e})")
                });
            }
        }
        if let Some(max_bytes) = body_wanted {
            // Decided when the body is in. The headers go on: Envoy's Wasm host turns a
            // paused header callback into "stop everything", body callbacks included, so
            // the body could never be read. The upstream sees the headers; a request
            // denied on its body is reset before its body is sent.
            self.reading_body = Some(max_bytes);
            self.read_facts = Some(ReadFacts::now(&plugin.engine.config.facts));
            return Action::Continue;
        }
        self.decide(&plugin)
    }

    /// A piece of the request body, while a rule waits for it to estimate the cost:
    /// Envoy buffers it until the end (or `max_bytes`, past which the rule charges its
    /// `max`).
    pub fn on_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        let (Some(plugin), Some(max_bytes)) = (self.plugin.clone(), self.reading_body) else {
            return Action::Continue;
        };
        if size > max_bytes {
            self.request_body = BodySeen::TooLarge;
        } else if end_of_stream {
            self.request_body = self.read_request_body(&plugin, size, max_bytes);
        } else {
            return Action::Pause;
        }
        self.reading_body = None;
        self.decide(&plugin)
    }

    /// The request body (Envoy holds `size` bytes), copied into the VM if its budget has
    /// room: else it is estimated as a body over `max_bytes` (at the cost's `max`).
    fn read_request_body(&mut self, plugin: &Plugin, size: usize, max_bytes: usize) -> BodySeen {
        let mut budget = plugin.buffers.borrow_mut();
        if !self.request_body_kept.grow_to(&mut budget, size) {
            plugin.metrics.buffer_full();
            return BodySeen::TooLarge;
        }
        let body = match host::request_body(size) {
            Ok(Some(bytes)) if bytes.len() > max_bytes => BodySeen::TooLarge,
            Ok(Some(bytes)) => BodySeen::Complete(bytes),
            _ => BodySeen::Absent,
        };
        let kept = match &body {
            BodySeen::Complete(bytes) => bytes.len(),
            _ => 0,
        };
        self.request_body_kept.grow_to(&mut budget, kept);
        body
    }

    /// Forgets the request body read for an estimate, and gives its bytes back.
    fn drop_request_body(&mut self) {
        self.request_body = BodySeen::Absent;
        if let Some(plugin) = &self.plugin {
            self.request_body_kept
                .release(&mut plugin.buffers.borrow_mut());
        }
    }

    /// Trailers end a request whose body a rule was waiting for.
    pub fn on_request_trailers(&mut self) -> Action {
        let (Some(plugin), Some(max_bytes)) = (self.plugin.clone(), self.reading_body) else {
            return Action::Continue;
        };
        self.request_body = self.read_request_body(&plugin, max_bytes.saturating_add(1), max_bytes);
        self.reading_body = None;
        self.decide(&plugin)
    }

    /// Evaluates the request's rules now.
    fn decide(&mut self, plugin: &Rc<Plugin>) -> Action {
        let Ok(now_us) = host::now_us() else {
            return Action::Continue;
        };
        let engine = &plugin.engine;
        let mut facts = Facts::new(&engine.config.facts, self.facts());
        let eval = {
            let mut worker = plugin.worker.borrow_mut();
            let seed = plugin.seed.get();
            engine.evaluate(&SharedData, &mut worker, &seed, &mut facts, now_us)
        };
        self.go_on(plugin, eval, now_us)
    }

    /// The request this filter holds is due (called from the root context's tick): the
    /// rules go on from the one that held it, and the request is resumed, answered, or
    /// held again (its release came too late for its slot).
    pub fn on_hold_due(&mut self, now_us: u64) {
        let (Some(plugin), Some(mut eval)) = (self.plugin.clone(), self.held.take()) else {
            return;
        };
        let engine = &plugin.engine;
        let mut facts = Facts::new(&engine.config.facts, self.facts());
        {
            let mut worker = plugin.worker.borrow_mut();
            let seed = plugin.seed.get();
            engine.release(
                &mut eval,
                &SharedData,
                &mut worker,
                &seed,
                &mut facts,
                now_us,
            );
        }
        if let Some(delayed) = &eval.delayed {
            plugin.metrics.delay_released(delayed);
            self.response_headers
                .retain(|(name, _)| name != DELAY_HEADER);
            self.response_headers.push((
                DELAY_HEADER.to_string(),
                (delayed.waited_us / 1_000).to_string(),
            ));
        }
        if self.go_on(&plugin, eval, now_us) == Action::Continue {
            self.resume();
        }
    }

    /// The plugin goes away while this request is held: it is answered as limited, with
    /// the time it would have waited as its retry.
    pub fn on_plugin_done(&mut self, now_us: u64) {
        let (Some(plugin), Some(mut eval)) = (self.plugin.clone(), self.held.take()) else {
            return;
        };
        if let Some(held) = &eval.held {
            plugin.metrics.delay_abandoned(held.rule);
        }
        eval.deny_held(now_us);
        if self.finish(&plugin, &eval, now_us) {
            self.resume();
        }
    }

    /// Holds the request until its rule's slot is due.
    fn hold(&mut self, plugin: &Plugin, mut eval: Evaluation, now_us: u64) -> Action {
        let Some(held) = eval.held else {
            return Action::Continue;
        };
        let queued =
            plugin
                .worker
                .borrow_mut()
                .waiting
                .hold(self.context_id, held.rule, held.hold.due_us);
        if !queued {
            // The engine holds only when the worker has room; should that ever not be
            // so, the request is denied (its slot is lost, never admitted early).
            eval.deny_held(now_us);
            return if self.finish(plugin, &eval, now_us) {
                Action::Continue
            } else {
                Action::Pause
            };
        }
        plugin.metrics.delay_held(held.rule);
        self.held = Some(eval);
        plugin.adjust_tick();
        Action::Pause
    }

    pub fn on_response_headers(&mut self, end_of_stream: bool) -> Action {
        if !self.replied {
            for (name, value) in &self.response_headers {
                let _ = host::add_response_header(name, value);
            }
        }
        if !self.settling.is_empty() {
            self.read_usage_headers(end_of_stream);
        }
        Action::Continue
    }

    /// A piece of the response body: rules reading their cost from it read it.
    pub fn on_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
        if self.settling.iter().any(|s| s.scanner.is_some()) {
            let chunk = host::response_body(size).ok().flatten().unwrap_or_default();
            self.keep_within_budget(chunk.len());
            for s in &mut self.settling {
                if let Some(scanner) = s.scanner.as_mut() {
                    scanner.feed(&chunk);
                }
            }
            self.keep_within_budget(0);
            if end_of_stream {
                self.settle_all(true);
            }
        }
        Action::Continue
    }

    /// Trailers end a response: what its body said settles now.
    pub fn on_response_trailers(&mut self) -> Action {
        if !self.settling.is_empty() {
            self.settle_all(true);
        }
        Action::Continue
    }

    /// The response's headers: an upstream error and a header source settle now, a
    /// body source starts reading.
    fn read_usage_headers(&mut self, end_of_stream: bool) {
        let Some(plugin) = self.plugin.clone() else {
            return;
        };
        let status = host::response_header(":status")
            .ok()
            .flatten()
            .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok())
            .unwrap_or(0);
        let status = (status != 0).then_some(status);
        self.status = status;
        let content_type = host::response_header("content-type").ok().flatten();
        let content_encoding = host::response_header("content-encoding").ok().flatten();
        let mut now_known = Vec::new();
        // Adaptive rules sample the latency of what measures the service: the core
        // decides which responses do (`weir_core::adaptive::measures_service`).
        let mut seen = None;
        for s in &self.settling {
            if plugin.engine.is_adaptive(s.commit.rule) {
                let Some((now, response)) = seen.or_else(|| {
                    let response = Response {
                        status: status.unwrap_or(0),
                        from_upstream: from_upstream(),
                    };
                    Some((host::now_us().ok()?, response))
                }) else {
                    continue;
                };
                seen = Some((now, response));
                let latency = now.saturating_sub(s.commit.counted_at_us);
                plugin.engine.observe_response(
                    &mut plugin.worker.borrow_mut(),
                    &s.commit,
                    response,
                    latency,
                );
            }
        }
        for s in &mut self.settling {
            let Some(commit) = plugin
                .engine
                .config
                .rule(s.commit.rule)
                .and_then(|r| r.commit.as_ref())
            else {
                continue;
            };
            let usage = match &commit.source {
                // An upstream error settles at `on_error` whatever its body says.
                _ if status.is_some_and(|s| s >= 500) => Err(Unread::NoUsage),
                CommitSource::Header(name) => host::response_header(name)
                    .ok()
                    .flatten()
                    .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse::<u64>().ok())
                    .ok_or(Unread::NoUsage),
                CommitSource::Body { fields, max_bytes } => {
                    s.scanner = Some(UsageScanner::for_response(
                        fields,
                        *max_bytes,
                        content_type.as_deref(),
                        content_encoding.as_deref(),
                    ));
                    continue;
                }
            };
            let seen = ResponseSeen {
                status,
                ended: true,
                usage,
            };
            now_known.push((s.commit.clone(), seen));
        }
        self.settling
            .retain(|s| !now_known.iter().any(|(c, _)| c.rule == s.commit.rule));
        for (commit, seen) in now_known {
            self.settle(&plugin, &commit, Some(&seen));
        }
        if end_of_stream {
            self.settle_all(true);
        }
    }

    /// Settles every cost still open with what its body said: the response `ended`, or
    /// was cut (the client went away, a reset) before its end.
    /// Takes room in the VM's `max_buffered_bytes` for what the scanners keep and
    /// `incoming` more bytes each; without room, they stop reading (each request keeps
    /// its estimate, as for a body over `max_bytes`) and give their bytes back.
    fn keep_within_budget(&mut self, incoming: usize) {
        let Some(plugin) = self.plugin.clone() else {
            return;
        };
        let scanners = || self.settling.iter().filter_map(|s| s.scanner.as_ref());
        let wanted = scanners().fold(0usize, |sum, scanner| {
            sum.saturating_add(scanner.buffered().saturating_add(incoming))
        });
        let mut budget = plugin.buffers.borrow_mut();
        if self.response_body_kept.grow_to(&mut budget, wanted) {
            return;
        }
        plugin.metrics.buffer_full();
        for s in &mut self.settling {
            if let Some(scanner) = s.scanner.as_mut() {
                scanner.give_up();
            }
        }
        self.response_body_kept.release(&mut budget);
    }

    fn settle_all(&mut self, ended: bool) {
        let Some(plugin) = self.plugin.clone() else {
            return;
        };
        self.response_body_kept
            .release(&mut plugin.buffers.borrow_mut());
        for mut s in std::mem::take(&mut self.settling) {
            let seen = ResponseSeen {
                status: self.status,
                ended,
                usage: s
                    .scanner
                    .take()
                    .map_or(Err(Unread::NoUsage), UsageScanner::finish),
            };
            self.settle(&plugin, &s.commit, Some(&seen));
        }
    }

    /// Settles one rule's cost as the core decides from what was `seen` of the response
    /// (`None`: the request never reached the upstream); a concurrency rule gives its
    /// place back.
    fn settle(&self, plugin: &Plugin, commit: &PendingCommit, seen: Option<&ResponseSeen>) {
        let settled = plugin.settle(commit, seen);
        self.log(LogLevel::Debug, || match settled {
            Some(s) => format!(
                "rule {}: cost {} settled as {} ({:?})",
                plugin.engine.rule_name(commit.rule),
                commit.reserved,
                s.cost,
                s.reason
            ),
            None => format!(
                "rule {}: place given back",
                plugin.engine.rule_name(commit.rule)
            ),
        });
    }

    /// The answer to this request's own bridge call, with its evaluation completed. The
    /// request is paused: resume it, unless it was answered here.
    pub fn on_own_call_answered(&mut self, eval: Evaluation, now_us: u64) {
        let Some(plugin) = self.plugin.clone() else {
            return;
        };
        if self.finish(&plugin, &eval, now_us) {
            self.resume();
        }
    }

    /// The call this request waited on has landed: what it brought is in the lease
    /// table. Look again; ask the bridge only if this request still misses.
    pub fn on_flight_landed(&mut self, now_us: u64) {
        let (Some(plugin), Some((_, mut eval))) = (self.plugin.clone(), self.waiting.take()) else {
            return;
        };
        plugin.engine.revisit(&mut eval, &SharedData, now_us);
        if self.go_on(&plugin, eval, now_us) == Action::Continue {
            self.resume();
        }
    }

    /// The request is gone: stop waiting on a call, or leave the held requests (the
    /// slot it was given is not handed back: it counts as admitted).
    pub fn on_delete(&mut self) {
        self.drop_request_body();
        // A response that never ended (reset, aborted): what is still open settles with
        // the usage its body reported before it was cut, or else keeps its estimate (the
        // client chooses when it hangs up).
        if !self.settling.is_empty() {
            self.settle_all(false);
        }
        if let (Some(plugin), Some((token, eval))) = (&self.plugin, &self.waiting) {
            plugin
                .flights
                .borrow_mut()
                .forget_waiter(*token, self.context_id);
            // What rules before the global ones counted: the request never reached the
            // upstream (a concurrency rule's place is given back).
            for commit in &eval.commits {
                self.settle(plugin, commit, None);
            }
        }
        if let (Some(plugin), Some(_)) = (&self.plugin, &self.held) {
            let forgotten = plugin.worker.borrow_mut().waiting.forget(self.context_id);
            if let Some(rule) = forgotten {
                plugin.metrics.delay_abandoned(rule);
            }
        }
    }

    /// Takes an evaluation as far as it can go now: wait on another call for its
    /// pending rules, send its own, or finish it. `Pause` while it waits or when the
    /// filter answered the request.
    fn go_on(&mut self, plugin: &Plugin, mut eval: Evaluation, now_us: u64) -> Action {
        if eval.held.is_some() {
            return self.hold(plugin, eval, now_us);
        }
        let engine = &plugin.engine;
        if !eval.pending.is_empty() {
            let joined = plugin
                .flights
                .borrow_mut()
                .join(self.context_id, &eval.pending, |rule| {
                    engine.shares_calls(rule)
                });
            match joined {
                Join::Waiting(token) => {
                    plugin.metrics.bridge_joined();
                    self.waiting = Some((token, eval));
                    return Action::Pause;
                }
                Join::Full => {
                    engine.fail_now(&mut eval, &SharedData, now_us, BridgeError::Busy);
                }
                Join::Alone => match plugin.call_bridge(self.context_id, eval, now_us) {
                    Ok(()) => return Action::Pause,
                    Err(failed) => {
                        let (back, error) = *failed;
                        eval = back;
                        engine.complete(&mut eval, &SharedData, now_us, now_us, Err(error));
                    }
                },
            }
        }
        if self.finish(plugin, &eval, now_us) {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn resume(&self) {
        if let Err(e) = host::resume_http_request() {
            self.log(LogLevel::Error, || {
                format!("cannot resume the request: {e}")
            });
        }
    }

    /// Carries out a finished evaluation: metrics, logs, filter state, then the denial
    /// or the headers for the upstream's response. Returns whether the request may go on.
    fn finish(&mut self, plugin: &Plugin, eval: &Evaluation, now_us: u64) -> bool {
        // Decided: what was read for an estimate is not needed any more.
        self.drop_request_body();
        self.read_facts = None;
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
            self.log(LogLevel::Warn, || match error {
                BridgeError::Reply(e) => format!("{e}; failure modes applied"),
                BridgeError::Skipped => {
                    "bridge skipped (it failed less than a second ago); failure modes applied"
                        .to_string()
                }
                BridgeError::Busy => {
                    "too many requests wait on one bridge call; failure modes applied".to_string()
                }
            });
        }
        let denied_rule = eval.denied_by.or(eval.unavailable);
        match (settings.filter_state, denied_rule) {
            (FilterState::All, _) | (FilterState::Denied, Some(_)) => {
                self.set_filter_state(plugin, eval, denied_rule.map(|r| engine.rule_name(r)));
            }
            _ => {}
        }
        // The verdicts (rule names and policies) are only built when headers need them.
        let denial = if let Some(denied_by) = eval.denied_by {
            let verdicts = engine.rule_verdicts(eval);
            let rule = engine.rule_name(denied_by);
            self.log(LogLevel::Debug, || format!("limited by rule {rule}"));
            Some(response::denial(settings, &verdicts, is_grpc_request()))
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
            if self.send(&denial) {
                // Rules that admitted the request before another denied it: it never
                // reached the upstream, so it cost nothing.
                for commit in &eval.commits {
                    self.settle(plugin, commit, None);
                }
                return false;
            }
            // The host refused the reply: the request goes on to the upstream, so what
            // the rules counted for it (a concurrency place, an estimate) stays counted
            // until its response ends, as for an admitted request.
        }
        self.settling = eval
            .commits
            .iter()
            .map(|commit| Settling {
                commit: commit.clone(),
                scanner: None,
            })
            .collect();
        if settings.headers_on_allowed && settings.header_style != HeaderStyle::None {
            let verdicts = engine.rule_verdicts(eval);
            for (name, value) in response::rate_limit_headers(settings.header_style, &verdicts) {
                self.response_headers.push((name.to_string(), value));
            }
        }
        true
    }

    /// `wasm.weir.rule`: the rule that denied (empty when none did); `wasm.weir.decisions`:
    /// `rule:outcome:source:cost:decided_at_us` for every rule decided, comma-separated.
    fn set_filter_state(&self, plugin: &Plugin, eval: &Evaluation, denied: Option<&str>) {
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
        let _ = host::set_property("weir.rule", denied.unwrap_or("").as_bytes());
        let _ = host::set_property("weir.decisions", decisions.as_bytes());
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

/// Whether the upstream sent the response (Envoy's `response.code_details` is
/// `via_upstream`) or a local reply did; `None` when the host does not say.
fn from_upstream() -> Option<bool> {
    let path = ["response".to_string(), "code_details".to_string()];
    let details = host::property(&path).ok().flatten()?;
    Some(details == b"via_upstream")
}

fn is_grpc_request() -> bool {
    let content_type = host::request_header("content-type").ok().flatten();
    response::is_grpc(content_type.as_deref())
}
