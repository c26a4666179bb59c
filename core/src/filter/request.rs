//! One request's decision, carried out.
//!
//! A request passes through the states of [`Stage`]: its rules are evaluated when its
//! headers are in, or once its body is (a rule estimates its cost from it); a rule that
//! needs Redis makes it wait on a bridge call, and a delaying rule holds it; in the end
//! it is admitted, with what its rules counted settling as its response ends, or
//! answered here.
//!
//! `on_request_headers` asks the core's engine. Local rules and global rules served from
//! what this Envoy holds (a lease, a reservation, a cached denial) are decided at once.
//! Global rules that need Redis either wait for a call of this VM already asking about
//! their keys (single flight, see `crate::flight`), or go to weir-bridge in one call
//! of their own; the request is paused meanwhile. The call's answer arrives through
//! [`super::Vm`], which completes the evaluation and hands it back here
//! ([`Request::on_own_call_answered`]), then wakes the requests that waited on it
//! ([`Request::on_flight_landed`]). Envoy bounds each call by the bridge timeout (a
//! timed-out call arrives as a 504), so a paused request always moves on.

use super::facts::{ReadFacts, RequestFacts};
use super::host::{self, Host, LogLevel};
use super::plugin::Plugin;
use super::reply::Reply;
use super::settling::Settlements;
use crate::buffers::Buffered;
use crate::engine::Evaluation;
use crate::flight::Join;
use crate::time::Micros;
use crate::usage::RequestBody;
use std::rc::Rc;

/// The response header of a request that was held: how long, in ms.
pub const DELAY_HEADER: &str = "x-weir-delay-ms";

/// What to tell Envoy after a headers or trailers callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Action {
    Continue = 0,
    Pause = 1,
}

/// What to tell Envoy after a request body callback (proxy-wasm's `FilterDataStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum BodyAction {
    /// The body goes on to the upstream.
    Continue = 0,
    /// Envoy buffers the body until its end, for a rule to read it, or to rewrite it
    /// once decided (`StopIterationAndBuffer`; past its buffer limit Envoy answers 413).
    /// Only after this may a later callback touch the body.
    Read = 1,
    /// Envoy keeps the body, however long, and stops reading from the client while it
    /// has too much (`StopIterationAndWatermark`): the request is not decided yet, and
    /// no byte of its body goes on before every rule has admitted it.
    Hold = 2,
}

/// One request's context: where it is on its way to a decision ([`Stage`]), what it read
/// ahead of it, and what it does with the response.
pub struct Request {
    context_id: u32,
    plugin: Option<Rc<Plugin>>,
    stage: Stage,
    /// What the request read before its rules were decided, kept until they are: from
    /// the moment its headers go on to wait for its body.
    read_ahead: Option<ReadAhead>,
    /// What the request is answered, or the headers the upstream's response gets.
    reply: Reply,
}

/// Where a request is on its way to a decision. Each state holds what only it needs:
///
/// ```text
/// Deciding ─▶ ReadingBody ─▶ Deciding
/// Deciding ─▶ Calling | Waiting | Held ─▶ Deciding     (an answer, a landed call, a due slot)
/// Deciding ─▶ Admitted (settles as its response ends) | Answered (denied here)
/// ```
enum Stage {
    /// Its rules are about to be evaluated, or are being evaluated: the state a request
    /// starts in, and passes through between the others.
    Deciding,
    /// A rule estimates its cost from its body: the decision waits for the body,
    /// buffered by Envoy up to `max_bytes`.
    ReadingBody { max_bytes: usize },
    /// Its own bridge call is in flight (the evaluation travels with the call).
    Calling,
    /// It waits on another request's bridge call, `flight`, for its pending rules.
    Waiting { flight: u32, eval: Evaluation },
    /// A rule holds it (`on_limit.delay`) until its slot is due.
    Held(Evaluation),
    /// Admitted: what its rules counted settles as its response ends.
    Admitted(Settlements),
    /// Denied, answered here: nothing of it reached the upstream, nothing is left to settle.
    Answered,
}

/// What a request read ahead of its decision, while the host still had it: its facts as
/// its headers stood, and its body for a cost estimate.
struct ReadAhead {
    facts: ReadFacts,
    body: BodySeen,
    /// What the body keeps of its VM's `max_buffered_bytes`.
    kept: Buffered,
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

impl Request {
    pub fn new(context_id: u32, plugin: Option<Rc<Plugin>>) -> Self {
        Request {
            context_id,
            plugin,
            stage: Stage::Deciding,
            read_ahead: None,
            reply: Reply::new(context_id),
        }
    }

    /// Its rules are not all decided yet: it waits for a bridge call (its own or
    /// another's), or a rule holds it.
    fn undecided(&self) -> bool {
        matches!(
            self.stage,
            Stage::Calling | Stage::Waiting { .. } | Stage::Held(_)
        )
    }

    /// The evaluation a rule holds, taken out (the request is deciding again).
    fn take_held(&mut self) -> Option<Evaluation> {
        match std::mem::replace(&mut self.stage, Stage::Deciding) {
            Stage::Held(eval) => Some(eval),
            other => {
                self.stage = other;
                None
            }
        }
    }

    /// The evaluation waiting on another request's call, taken out.
    fn take_waiting(&mut self) -> Option<Evaluation> {
        match std::mem::replace(&mut self.stage, Stage::Deciding) {
            Stage::Waiting { eval, .. } => Some(eval),
            other => {
                self.stage = other;
                None
            }
        }
    }

    /// This request's facts: from the host, or as read before its headers went on.
    fn facts<'a, H: Host>(&'a self, host: &'a H) -> RequestFacts<'a, H> {
        RequestFacts {
            host,
            body: self
                .read_ahead
                .as_ref()
                .map_or(RequestBody::Absent, |read| read.body.as_request_body()),
            read: self.read_ahead.as_ref().map(|read| &read.facts),
        }
    }

    fn log<H: Host>(&self, host: &H, level: LogLevel, message: impl FnOnce() -> String) {
        host::log(host, self.context_id, level, message);
    }

    pub fn on_request_headers<H: Host>(&mut self, host: &H, end_of_stream: bool) -> Action {
        // A VM without a valid configuration never gets traffic (Envoy refused the
        // config); if it does, the filter stays out of the way.
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        let (read_response, body_wanted, may_clamp) = {
            let mut facts = plugin.engine.facts(self.facts(host));
            let read_response = plugin.engine.reads_response_body(&mut facts);
            let body_wanted = if end_of_stream {
                None
            } else {
                plugin.engine.request_body_wanted(&mut facts)
            };
            let may_clamp = body_wanted.is_some() && plugin.engine.may_clamp(&mut facts);
            (read_response, body_wanted, may_clamp)
        };
        if may_clamp {
            // The headers go on before the body is decided, and a clamped body is not
            // as long as the original: the upstream gets it chunked (HTTP/1.1) or
            // framed (HTTP/2) instead.
            if let Err(e) = host.remove_request_header("content-length") {
                self.log(host, LogLevel::Warn, || {
                    format!("cannot remove content-length for a clamp ({e})")
                });
            }
        }
        if read_response {
            // A compressed body cannot be read (it keeps its estimate): ask the upstream
            // for the body as it is.
            if let Err(e) = host.replace_request_header("accept-encoding", "identity") {
                self.log(host, LogLevel::Warn, || {
                    format!("cannot set accept-encoding: identity ({e})")
                });
            }
        }
        if let Some(max_bytes) = body_wanted {
            // Decided when the body is in. The headers go on: Envoy's Wasm host turns a
            // paused header callback into "stop everything", body callbacks included, so
            // the body could never be read. The upstream sees the headers; a request
            // denied on its body is reset before its body is sent.
            self.stage = Stage::ReadingBody { max_bytes };
            self.read_ahead = Some(ReadAhead {
                facts: ReadFacts::now(host, &plugin.engine.config.facts),
                body: BodySeen::Absent,
                kept: Buffered::default(),
            });
            return Action::Continue;
        }
        self.decide(host, &plugin)
    }

    /// The request body so far (Envoy holds `size` bytes of it). While a rule waits for
    /// it to estimate the cost, Envoy buffers it until the end, or until `max_bytes`,
    /// past which the rule charges its `max`: decided before any byte of it goes on.
    /// While the request is undecided (a bridge call, a hold), Envoy keeps it: a request
    /// denied then never reaches the upstream with its body.
    pub fn on_request_body<H: Host>(
        &mut self,
        host: &H,
        size: usize,
        end_of_stream: bool,
    ) -> BodyAction {
        let Some(plugin) = self.plugin.clone() else {
            return BodyAction::Continue;
        };
        let Stage::ReadingBody { max_bytes } = self.stage else {
            return if self.undecided() {
                BodyAction::Hold
            } else {
                BodyAction::Continue
            };
        };
        if size > max_bytes {
            self.set_body(BodySeen::TooLarge);
        } else if end_of_stream {
            self.read_request_body(host, &plugin, size, max_bytes);
        } else {
            return BodyAction::Read;
        }
        self.stage = Stage::Deciding;
        let action = self.decide(host, &plugin);
        // Still undecided, the body read whole (a decided request has dropped it).
        let body_read = matches!(
            self.read_ahead,
            Some(ReadAhead {
                body: BodySeen::Complete(_),
                ..
            })
        );
        match action {
            Action::Continue => BodyAction::Continue,
            // Waiting on the bridge, with the whole body read: Envoy keeps buffering it,
            // for a clamp may rewrite it when the answer comes. Envoy's Wasm host lets a
            // later callback reach the body only when the last body callback buffered
            // it: after `StopIterationAndWatermark` it points at a piece that is gone,
            // and rewriting it crashes Envoy (1.40, a segmentation fault).
            Action::Pause if body_read => BodyAction::Read,
            // Waiting or held with a body too large to read (it is never touched
            // again), or answered here: the body stays where it is.
            Action::Pause => BodyAction::Hold,
        }
    }

    /// What was read of the body, for the estimate.
    fn set_body(&mut self, body: BodySeen) {
        if let Some(read) = &mut self.read_ahead {
            read.body = body;
        }
    }

    /// The request body (Envoy holds `size` bytes), copied into the VM if its budget has
    /// room: else it is estimated as a body over `max_bytes` (at the cost's `max`).
    fn read_request_body<H: Host>(
        &mut self,
        host: &H,
        plugin: &Plugin,
        size: usize,
        max_bytes: usize,
    ) {
        let Some(read) = &mut self.read_ahead else {
            return;
        };
        if !plugin.keep(&mut read.kept, size) {
            plugin.metrics.buffer_full();
            read.body = BodySeen::TooLarge;
            return;
        }
        read.body = match host.request_body(size) {
            Ok(Some(bytes)) if bytes.len() > max_bytes => BodySeen::TooLarge,
            Ok(Some(bytes)) => BodySeen::Complete(bytes),
            _ => BodySeen::Absent,
        };
        let kept = match &read.body {
            BodySeen::Complete(bytes) => bytes.len(),
            _ => 0,
        };
        plugin.keep(&mut read.kept, kept);
    }

    /// Forgets what was read ahead of the decision, and gives the body's bytes back.
    fn drop_read_ahead(&mut self) {
        if let (Some(mut read), Some(plugin)) = (self.read_ahead.take(), &self.plugin) {
            plugin.give_back(&mut read.kept);
        }
    }

    /// Trailers end a request whose body a rule was waiting for; they wait too while
    /// the request is undecided.
    pub fn on_request_trailers<H: Host>(&mut self, host: &H) -> Action {
        let Some(plugin) = self.plugin.clone() else {
            return Action::Continue;
        };
        let Stage::ReadingBody { max_bytes } = self.stage else {
            return if self.undecided() {
                Action::Pause
            } else {
                Action::Continue
            };
        };
        self.read_request_body(host, &plugin, max_bytes.saturating_add(1), max_bytes);
        self.stage = Stage::Deciding;
        self.decide(host, &plugin)
    }

    /// Evaluates the request's rules now.
    fn decide<H: Host>(&mut self, host: &H, plugin: &Rc<Plugin>) -> Action {
        let Ok(now) = host.now() else {
            return Action::Continue;
        };
        let engine = &plugin.engine;
        let mut facts = engine.facts(self.facts(host));
        let eval = plugin.evaluate(host, &mut facts, now);
        self.go_on(host, plugin, eval, now)
    }

    /// The request this filter holds is due (called from the root context's tick): the
    /// rules go on from the one that held it, and the request is resumed, answered, or
    /// held again (its release came too late for its slot).
    pub fn on_hold_due<H: Host>(&mut self, host: &H, now: Micros) {
        let (Some(plugin), Some(mut eval)) = (self.plugin.clone(), self.take_held()) else {
            return;
        };
        let engine = &plugin.engine;
        let mut facts = engine.facts(self.facts(host));
        plugin.release(&mut eval, host, &mut facts, now);
        if let Some(delayed) = &eval.delayed {
            plugin.metrics.delay_released(delayed);
            self.reply
                .set_header(DELAY_HEADER, delayed.waited.as_millis().to_string());
        }
        if self.go_on(host, &plugin, eval, now) == Action::Continue {
            self.resume(host);
        }
    }

    /// Another key's request took this one's place in a full queue: it is answered as
    /// limited, with the time it would have waited as its retry.
    pub fn on_pushed_out<H: Host>(&mut self, host: &H, now: Micros) {
        self.deny_held(host, now, |eval, _| eval.push_out(now));
    }

    /// The plugin goes away while this request is held: it is answered as limited, with
    /// the time it would have waited as its retry.
    pub fn on_plugin_done<H: Host>(&mut self, host: &H, now: Micros) {
        self.deny_held(host, now, |eval, plugin| {
            if let Some(held) = &eval.held {
                plugin.metrics.delay_abandoned(held.rule);
            }
            eval.deny_held(now);
        });
    }

    /// Answers this held request as limited, its evaluation turned into a denial by
    /// `deny`.
    fn deny_held<H: Host>(
        &mut self,
        host: &H,
        now: Micros,
        deny: impl FnOnce(&mut Evaluation, &Plugin),
    ) {
        let (Some(plugin), Some(mut eval)) = (self.plugin.clone(), self.take_held()) else {
            return;
        };
        deny(&mut eval, &plugin);
        if self.finish(host, &plugin, &eval, now) {
            self.resume(host);
        }
    }

    /// Holds the request until its rule's slot is due.
    fn hold<H: Host>(
        &mut self,
        host: &H,
        plugin: &Plugin,
        mut eval: Evaluation,
        now: Micros,
    ) -> Action {
        let Some(held) = eval.held else {
            return Action::Continue;
        };
        let queued = plugin.hold(self.context_id, &held);
        if !queued {
            // The engine holds only when the worker has room; should that ever not be
            // so, the request is denied (its slot is lost, never admitted early).
            eval.deny_held(now);
            return if self.finish(host, plugin, &eval, now) {
                Action::Continue
            } else {
                Action::Pause
            };
        }
        plugin.metrics.delay_held(held.rule);
        self.stage = Stage::Held(eval);
        plugin.adjust_tick(host);
        Action::Pause
    }

    /// The answer to this request's own bridge call, with its evaluation completed. The
    /// request is paused: resume it, unless it was answered here.
    pub fn on_own_call_answered<H: Host>(&mut self, host: &H, eval: Evaluation, now: Micros) {
        self.stage = Stage::Deciding;
        let Some(plugin) = self.plugin.clone() else {
            return;
        };
        if self.finish(host, &plugin, &eval, now) {
            self.resume(host);
        }
    }

    /// The call this request waited on has landed: what it brought is in the lease
    /// table. Look again; ask the bridge only if this request still misses, then for the
    /// `waiting` requests of that call that have not looked again yet, itself included.
    pub fn on_flight_landed<H: Host>(&mut self, host: &H, now: Micros, waiting: u64) {
        let (Some(plugin), Some(mut eval)) = (self.plugin.clone(), self.take_waiting()) else {
            return;
        };
        plugin.engine.revisit(&mut eval, host, now, waiting);
        if self.go_on(host, &plugin, eval, now) == Action::Continue {
            self.resume(host);
        }
    }

    /// The request is gone: stop waiting on a call, or leave the held requests (the
    /// slot it was given is not handed back: it counts as admitted).
    pub fn on_delete<H: Host>(&mut self, host: &H) {
        self.drop_read_ahead();
        let Some(plugin) = &self.plugin else {
            return;
        };
        match &mut self.stage {
            // A response that never ended (reset, aborted): what is still open settles
            // with the usage its body reported before it was cut, or else keeps its
            // estimate (the client chooses when it hangs up).
            Stage::Admitted(settlements) if !settlements.is_empty() => {
                settlements.settle_all(host, plugin, false);
            }
            Stage::Waiting { flight, eval } => {
                plugin.leave_flight(*flight, self.context_id);
                // What rules before the global ones counted: the request never reached
                // the upstream (a concurrency rule's place is given back).
                for commit in &eval.commits {
                    plugin.settle(host, self.context_id, commit, None);
                }
            }
            Stage::Held(eval) => {
                let forgotten = plugin.forget_held(self.context_id);
                if let Some(rule) = forgotten {
                    plugin.metrics.delay_abandoned(rule);
                }
                // Its units stay counted in the key's schedule, never admitted.
                if let Some(held) = &eval.held {
                    let units = i64::try_from(held.units()).unwrap_or(i64::MAX);
                    plugin.metrics.outstanding(held.rule, -units);
                }
            }
            // Its own call's answer finds it gone (`Vm::on_http_call_response`).
            _ => {}
        }
    }

    /// Takes an evaluation as far as it can go now: wait on another call for its
    /// pending rules, send its own, or finish it. `Pause` while it waits or when the
    /// filter answered the request.
    fn go_on<H: Host>(
        &mut self,
        host: &H,
        plugin: &Plugin,
        mut eval: Evaluation,
        now: Micros,
    ) -> Action {
        // Each step's changes to units outstanding count now, not when the request ends:
        // a request may be held, or wait on a call, for a while.
        plugin.metrics.drain_outstanding(host, &mut eval);
        if eval.held.is_some() {
            return self.hold(host, plugin, eval, now);
        }
        let engine = &plugin.engine;
        if !eval.pending.is_empty() {
            let joined = plugin.join_flight(self.context_id, &eval.pending);
            match joined {
                Join::Waiting(flight) => {
                    plugin.metrics.bridge_joined();
                    self.stage = Stage::Waiting { flight, eval };
                    return Action::Pause;
                }
                Join::Alone => match plugin.call_bridge(host, self.context_id, eval, now) {
                    Ok(()) => {
                        self.stage = Stage::Calling;
                        return Action::Pause;
                    }
                    Err(failed) => {
                        let (back, error) = *failed;
                        eval = back;
                        engine.complete(&mut eval, host, now, now, Err(error));
                    }
                },
            }
        }
        if self.finish(host, plugin, &eval, now) {
            Action::Continue
        } else {
            Action::Pause
        }
    }

    fn resume<H: Host>(&self, host: &H) {
        if let Err(e) = host.resume_request() {
            self.log(host, LogLevel::Error, || {
                format!("cannot resume the request: {e}")
            });
        }
    }

    /// Carries out a finished evaluation (see [`Reply::carry_out`]); an admitted request
    /// settles what its rules counted when its response ends, a denied one at once (it
    /// never reached the upstream: it cost nothing). Returns whether it may go on.
    fn finish<H: Host>(
        &mut self,
        host: &H,
        plugin: &Plugin,
        eval: &Evaluation,
        now: Micros,
    ) -> bool {
        let clamped = match &self.read_ahead {
            Some(ReadAhead {
                body: BodySeen::Complete(body),
                ..
            }) if !eval.denied() => plugin
                .engine
                .clamped_body(eval, body)
                .map(|clamped| (body.len(), clamped)),
            _ => None,
        };
        // Decided: what was read ahead of the decision is not needed any more.
        self.drop_read_ahead();
        if !self.reply.carry_out(host, plugin, eval, now) {
            for commit in &eval.commits {
                plugin.settle(host, self.context_id, commit, None);
            }
            self.stage = Stage::Answered;
            return false;
        }
        plugin.metrics.clamped(eval);
        if let Some((size, body)) = clamped {
            // Should the host refuse, the upstream gets the body as sent: its usage above
            // the reservation is charged when the response ends, as a debt.
            if let Err(e) = host.replace_request_body(size, &body) {
                self.log(host, LogLevel::Error, || {
                    format!("cannot write the clamped request body ({e})")
                });
            }
        }
        // Also when the host refused to send a denial: the request goes on to the
        // upstream, so what the rules counted stays counted until its response ends.
        self.stage = Stage::Admitted(Settlements::new(self.context_id, &eval.commits));
        true
    }

    pub fn on_response_headers<H: Host>(&mut self, host: &H, end_of_stream: bool) -> Action {
        self.reply.on_response_headers(host);
        if let (Some(plugin), Stage::Admitted(settlements)) = (&self.plugin, &mut self.stage) {
            settlements.on_response_headers(host, plugin, end_of_stream);
        }
        Action::Continue
    }

    /// A piece of the response body: rules reading their cost from it read it.
    pub fn on_response_body<H: Host>(
        &mut self,
        host: &H,
        size: usize,
        end_of_stream: bool,
    ) -> Action {
        if let (Some(plugin), Stage::Admitted(settlements)) = (&self.plugin, &mut self.stage) {
            settlements.on_response_body(host, plugin, size, end_of_stream);
        }
        Action::Continue
    }

    /// Trailers end a response: what its body said settles now.
    pub fn on_response_trailers<H: Host>(&mut self, host: &H) -> Action {
        if let (Some(plugin), Stage::Admitted(settlements)) = (&self.plugin, &mut self.stage) {
            if !settlements.is_empty() {
                settlements.settle_all(host, plugin, true);
            }
        }
        Action::Continue
    }
}
