//! A plugin's calls to the bridge and their answers: a request's call sent, an answer read,
//! sent once more when Envoy could not deliver it, and landed (its evaluation completed)
//! for the VM to hand to the requests.
use super::Plugin;
use crate::bounds::MAX_BODY_BYTES;
use crate::config::BridgeSettings;
use crate::engine::Evaluation;
use crate::filter::host::{self, Host, LogLevel};
use crate::flight::Call;
use crate::time::Micros;
use crate::wire::{v2, ReplyError, SECRET_HEADER};

/// A bridge call answered and landed ([`Plugin::on_call_answer`]): its evaluation,
/// completed with the answer, for the request that made it, and the requests that waited
/// on it, to look again.
pub struct Landed {
    /// The request that made the call (it may be gone).
    pub owner: u32,
    pub eval: Evaluation,
    /// The requests that waited on it, by context id, in the order they joined.
    pub waiters: Vec<u32>,
    /// When the answer came.
    pub now: Micros,
}

impl Plugin {
    /// Sends `eval.pending` to the bridge for the request `owner`; the call is in
    /// flight, holding the evaluation, until its answer comes. Gives the evaluation back
    /// when the call cannot be made.
    pub fn call_bridge<H: Host>(
        &self,
        host: &H,
        owner: u32,
        mut eval: Evaluation,
        now: Micros,
    ) -> Result<(), Box<(Evaluation, ReplyError)>> {
        let Some(bridge) = &self.engine.config.bridge else {
            return Err(Box::new((eval, ReplyError::Unavailable)));
        };
        let body = self.engine.bridge_request(&eval.pending);
        let headers = call_headers(bridge, v2::ACQUIRE_PATH);
        match host.dispatch_call(&bridge.cluster, &headers, &body, bridge.timeout_ms) {
            Ok(token) => {
                self.metrics.bridge_call();
                self.engine.note_call_made(host, now.us());
                self.engine.note_call_sent(&mut eval, host, now);
                let keys = eval
                    .pending
                    .iter()
                    .filter(|item| self.engine.shares_calls(item.rule))
                    .map(|item| (item.rule, item.hash))
                    .collect();
                let call = Call {
                    owner,
                    sent_at: now,
                    eval,
                    keys,
                    waiters: Vec::new(),
                    resent: false,
                };
                self.flights.borrow_mut().start(token, call);
                Ok(())
            }
            // Envoy refused it at once: the cluster's circuit breaker is full, or it has
            // no host (or no such cluster).
            Err(e) => {
                self.metrics.bridge_refused();
                host::log(host, owner, LogLevel::Debug, || {
                    format!("cannot call the bridge cluster {:?}: {e}", bridge.cluster)
                });
                Err(Box::new((eval, ReplyError::Refused)))
            }
        }
    }

    /// The answer of the call `token`, on the plugin's root context. A commit call
    /// settles its commits. A bridge call Envoy could not deliver is sent once more (see
    /// [`Plugin::resend`]). A bridge call that landed has its evaluation completed: what
    /// Redis granted goes into the lease table whether or not its request is still
    /// there, and the call is returned for the VM to hand to its requests. `None` for
    /// every other answer.
    pub fn on_call_answer<H: Host>(
        &self,
        host: &H,
        token: u32,
        body_size: usize,
    ) -> Option<Landed> {
        let commits = self.commits.borrow_mut().land(token);
        if let Some(commits) = commits {
            self.commits_answered(host, commits, body_size);
            return None;
        }
        let (reply, sent_at, clocked) = {
            let flights = self.flights.borrow();
            let call = flights.get(token)?;
            let reply = self.read_bridge_reply(host, call, body_size);
            // The answer's instant is read when something needs it: requests waiting on
            // the call (they look again then), the latency's sample, or what the answer
            // leaves behind (`Engine::answer_needs_instant`). An exact grant of what
            // the request costs needs none: it is decided as at the call's sending.
            let clocked = !call.waiters.is_empty()
                || self.metrics.bridge_latency_due(call.sent_at)
                || self.engine.answer_needs_instant(&call.eval, &reply);
            (reply, call.sent_at, clocked)
        };
        let now = if clocked {
            host.now().unwrap_or(sent_at)
        } else {
            sent_at
        };
        // Envoy could not deliver it: another host of the cluster may answer.
        let reply = match self.resend(host, token, &reply, now) {
            Ok(true) => return None,
            Ok(false) => reply,
            Err(refused) => Err(refused),
        };
        let call = self.flights.borrow_mut().land(token)?;
        let mut eval = call.eval;
        if clocked {
            self.metrics
                .bridge_latency(host, now.saturating_sub(call.sent_at), now);
            self.engine
                .complete(&mut eval, host, call.sent_at, now, reply);
        } else {
            self.engine
                .complete_unclocked(&mut eval, host, call.sent_at, reply);
        }
        if let Ok(mut worker) = self.worker.try_borrow_mut() {
            self.engine.remember_answers(&mut worker, &eval);
        }
        Some(Landed {
            owner: call.owner,
            eval,
            waiters: call.waiters,
            now,
        })
    }

    /// The request of a landed call is gone: what the call decided is still counted, and
    /// what its rules hold for a response that will never come is settled now (a
    /// concurrency rule's place given back; an estimate given back too: the request,
    /// paused for this call, never reached the upstream).
    pub fn on_owner_gone<H: Host>(&self, host: &H, landed: &Landed) {
        self.metrics.record(host, &landed.eval, landed.now);
        for commit in &landed.eval.commits {
            self.settle(host, landed.owner, commit, None);
        }
    }

    /// Sends the call answered as `token` once more, if its `reply` says Envoy could not
    /// deliver it and there is time left (see [`crate::engine::Engine::resend_timeout_ms`]):
    /// it stays in flight with its waiters. Returns whether it was sent, or
    /// [`ReplyError::Refused`] when Envoy refused the second send at once (its circuit
    /// breaker): that, not the first answer, is what the call got.
    fn resend<H: Host>(
        &self,
        host: &H,
        token: u32,
        reply: &Result<v2::Reply, ReplyError>,
        now: Micros,
    ) -> Result<bool, ReplyError> {
        let (Some(bridge), Err(error)) = (&self.engine.config.bridge, reply) else {
            return Ok(false);
        };
        let (body, timeout_ms, owner) = {
            let flights = self.flights.borrow();
            let Some(call) = flights.get(token) else {
                return Ok(false);
            };
            let Some(timeout_ms) =
                self.engine
                    .resend_timeout_ms(error, call.resent, call.sent_at, now)
            else {
                return Ok(false);
            };
            let body = self.engine.bridge_request(&call.eval.pending);
            (body, timeout_ms, call.owner)
        };
        let headers = call_headers(bridge, v2::ACQUIRE_PATH);
        match host.dispatch_call(&bridge.cluster, &headers, &body, timeout_ms) {
            Ok(again) => {
                self.engine.note_call_made(host, now.us());
                self.flights.borrow_mut().resend(token, again);
                self.metrics.bridge_call();
                self.metrics.bridge_resent();
                host::log(host, owner, LogLevel::Debug, || {
                    format!("{error}; the call is sent once more")
                });
                Ok(true)
            }
            Err(_) => {
                self.metrics.bridge_refused();
                Err(ReplyError::Refused)
            }
        }
    }

    /// The answer of the call `call` made, read in the callback of its response, decoded
    /// against what was sent. The body is read first: one that is the reply to the items
    /// sent is the bridge's answer, which it sends only with a 200, and is taken without
    /// reading the status (a host call less on every answer). Anything else is judged by
    /// its status (0: none, the connection failed) as well.
    fn read_bridge_reply<H: Host>(
        &self,
        host: &H,
        call: &Call,
        body_size: usize,
    ) -> Result<v2::Reply, ReplyError> {
        let sent = self.engine.sent(&call.eval.pending);
        let body = if body_size > MAX_BODY_BYTES {
            None
        } else {
            let body = host.call_response_body(body_size).ok().flatten();
            let body = body.unwrap_or_default();
            if let Ok(reply) = v2::decode_reply(200, &body, &sent) {
                return Ok(reply);
            }
            Some(body)
        };
        let status = call_status(host);
        // Envoy's own 503 for a call its circuit breaker turned away once it was taken
        // (a stream over `max_pending_requests` while the connection opens): a full
        // breaker, like a call refused at once, not a bridge that is down.
        let overloaded = status == 503
            && host
                .call_response_header("x-envoy-overloaded")
                .ok()
                .flatten()
                .is_some();
        if overloaded {
            self.metrics.bridge_refused();
            return Err(ReplyError::Refused);
        }
        let Some(body) = body else {
            return Err(ReplyError::BadBody(format!("{body_size} bytes")));
        };
        v2::decode_reply(status, &body, &sent)
    }
}

/// The status of a call's answer, read in its callback: 0 when it has none (the
/// connection failed) or one that is not a number.
pub(super) fn call_status<H: Host>(host: &H) -> u16 {
    host.call_response_header(":status")
        .ok()
        .flatten()
        .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok())
        .unwrap_or(0)
}

/// The headers of a call to the bridge's `path`.
pub(super) fn call_headers<'a>(
    bridge: &'a BridgeSettings,
    path: &'a str,
) -> Vec<(&'a str, &'a str)> {
    let mut headers = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", bridge.authority.as_str()),
        ("content-type", "application/json"),
    ];
    if let Some(secret) = &bridge.secret {
        headers.push((SECRET_HEADER, secret.as_str()));
    }
    headers
}
