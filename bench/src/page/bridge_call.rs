//! The bridge call section: what one call to weir-bridge costs Envoy, over HTTP/1.1 and
//! HTTP/2, and how to read the figures.

use super::Table;
use crate::report::{num, Results};
use crate::scenario::Scenario;

/// The exact bridge call split into Envoy's HTTP client and weir's VM share, with what
/// weir's request does across its VM boundary, and what that leaves to cut.
pub(super) fn bridge_call_section(r: &Results) -> String {
    let mut o = format!(
        "## What a bridge call costs\n\n**{exact}** asks weir-bridge on every request. \
         **{floor}** makes the same call from the empty filter and nothing else: the same \
         cluster, headers and `/v2/acquire` body (checked byte for byte against weir's by \
         `cargo test -p weir-bench`), the request paused until the answer and resumed then, \
         nothing of the answer read. So, in Envoy CPU per request: **{exact} − empty-wasm** \
         is the whole call; **{floor} − empty-wasm** is what Envoy pays for the call itself \
         (its HTTP client, the upstream connection and codec, the timeout, the pause, the \
         answer's callback into the VM); **{exact} − {floor}** is weir's share (encoding \
         the body, decoding the answer, its bookkeeping, and the host calls it makes beyond \
         the floor's). weir-bridge and Redis run on the load core: their own CPU is not in \
         these figures (the cost section's whole-system table has it). Each figure is the difference of the two scenarios within each \
         round (they are measured interleaved), median (min–max) over the rounds.\n\n",
        exact = Scenario::WeirGlobalExact.id(),
        floor = Scenario::BridgeCallFloor.id(),
    );
    if r.bridge_call.is_empty() {
        o.push_str(&format!(
            "This run measured no split: it needs `--only empty-wasm,{},{},{},{}` (or the \
             default run).\n\n",
            Scenario::WeirGlobalExact.id(),
            Scenario::WeirGlobalExactH2.id(),
            Scenario::BridgeCallFloor.id(),
            Scenario::BridgeCallFloorH2.id(),
        ));
    } else {
        o.push_str(&bridge_call_table(r).markdown());
        o.push_str(&bridge_call_verdict(r));
    }
    if let Some(t) = bridge_call_counted_table(r) {
        o.push_str(&format!(
            "The host calls of one {} request, counted on the scripted Envoy (see the \
             section before), against the floor's, which are so by construction:\n\n{}",
            Scenario::WeirGlobalExact.id(),
            t.markdown()
        ));
    }
    if let Some(trace) = &r.call_trace {
        o.push_str(&call_trace_section(trace));
    }
    o.push_str(BRIDGE_CALL_READING);
    o
}

/// The split per protocol, and weir's own counts of what crossed its VM's boundary.
fn bridge_call_table(r: &Results) -> Table {
    let mut t = Table::new(&[
        "bridge protocol",
        "whole call: exact − empty µs",
        "Envoy's call: floor − empty µs",
        "weir's share: exact − floor µs",
        "weir's host calls/request (Envoy's count)",
        "bytes across weir's VM boundary/request (Envoy's count)",
    ]);
    let show = |s: &Option<crate::report::Stat>| s.map_or("–".into(), |s| s.show(2));
    for c in &r.bridge_call {
        let exact = r.scenarios.iter().find(|x| x.id == c.exact);
        t.row(vec![
            c.protocol.clone(),
            show(&c.whole_us),
            show(&c.client_us),
            show(&c.vm_us),
            exact.map_or("–".into(), |x| x.host_calls_per_request.show(2)),
            exact.map_or("–".into(), |x| x.vm_bytes_per_request.show(0)),
        ]);
    }
    t
}

/// What the split says of the target (the whole call ≤ empty wasm + 60 µs), in this run.
fn bridge_call_verdict(r: &Results) -> String {
    let said: Vec<String> = r
        .bridge_call
        .iter()
        .filter_map(|c| {
            let (client, vm) = (c.client_us?.median, c.vm_us?.median);
            let verdict = if client > 60.0 {
                "more than the whole call's target of +60 µs by itself: no cut of weir's share \
                 alone reaches the target"
            } else {
                "less than the whole call's target of +60 µs"
            };
            Some(format!(
                "Over {}, Envoy's call alone costs {client:+.1} µs, {verdict}. weir's share is \
                 {vm:+.1} µs.",
                c.protocol
            ))
        })
        .collect();
    if said.is_empty() {
        return String::new();
    }
    format!("In this run: {}\n\n", said.join(" "))
}

/// weir-global-exact's counted host calls by kind next to the floor's.
fn bridge_call_counted_table(r: &Results) -> Option<Table> {
    let exact = r
        .counted
        .iter()
        .find(|c| c.scenario == Scenario::WeirGlobalExact.id())?;
    let mut t = Table::new(&[
        "host call",
        Scenario::WeirGlobalExact.id(),
        "bridge-call-floor",
    ]);
    // The empty filter's: one dispatch; the SDK's switch to the request when the answer
    // comes, and the resume.
    let floor = |kind: &str| match kind {
        "dispatch" => 1.0,
        "stream" => 2.0,
        _ => 0.0,
    };
    // Kinds that round to 0.00 (a log line now and then) are left out.
    for (kind, n) in exact.calls.iter().filter(|(_, n)| **n >= 0.005) {
        t.row(vec![kind.clone(), num(*n, 2), num(floor(kind), 0)]);
    }
    t.row(vec!["**all**".into(), num(exact.host_calls, 2), "3".into()]);
    Some(t)
}

/// One request of weir-global-exact, callback by callback, and its call's bytes (also
/// what `weir-bench counted --trace ID` prints).
pub fn call_trace_section(trace: &crate::counted::CallTrace) -> String {
    let mut t = Table::new(&["callbacks", "VM entries", "host calls", "by kind"]);
    for c in &trace.callbacks {
        let by_kind: Vec<String> = c.calls.iter().map(|(k, n)| format!("{k} {n}")).collect();
        t.row(vec![
            c.callback.clone(),
            c.entries.to_string(),
            c.calls.values().sum::<u64>().to_string(),
            by_kind.join(", "),
        ]);
    }
    format!(
        "One {} request after the warm-up, callback by callback (`weir-bench counted --trace \
         {}`); its call carries {} headers and a body of {} bytes, and the answer read back \
         into the VM is {} bytes:\n\n{}```text\n{}\n{}\n```\n\n",
        trace.scenario,
        trace.scenario,
        trace.call_headers.len(),
        trace.call_body.len(),
        trace.reply_body.len(),
        t.markdown(),
        trace.call_body,
        trace.reply_body
    )
}

/// Why weir's request makes each host call beyond the floor's, and what could go: what
/// the code does today (core/src/filter/request.rs, core/src/engine/bridge_call.rs and
/// global.rs, protocol/src/wire/v2.rs), for whoever cuts weir's share.
const BRIDGE_CALL_READING: &str = "How to read it. The floor's 3 host calls (the dispatch, \
the SDK's switch to the request when the answer comes, the resume) and its VM entries \
(the request's callbacks and the answer's) are what any filter pays for a call; what \
remains on top of the floor in **floor − empty-wasm** is Envoy's own HTTP client and \
cannot be cut from the filter: only fewer calls (leases) or a cheaper client would lower \
it. weir-global-exact makes 6 host calls per request and a fraction (`cargo test -p weir-bench` \
checks the count), 3 more than the floor:\n\n\
- *on_request_headers*: the **clock** (time enters once); the **`x-tenant` header** (the \
key); the **dispatch**. The key's lease slot set (where a cached denial would be) is not \
read while Redis's last answer to the worker had units enough left for the request \
(`LastAnswers`: only another worker's denial could be there, and Redis then denies this \
worker's call too). A worker also reads the bridge-down key (skip the bridge for a second \
after a failure), and writes the instant Envoy last took a call of the plugin (a call \
Envoy then refuses is a full circuit breaker, not a cluster without hosts), each at most \
every 10 ms, not per call.\n\
- *on_http_call_response*: the answer's **body** (its `:status` header only when the \
body is not the reply to what was sent: the bridge sends a reply with a 200 alone); \
**set_effective_context** to the request and its **resume**; and, at most once a \
millisecond per worker (every call below 1,000 calls a second per worker, a sample \
above), the **clock** and a **stats record** of the call's latency. The answer's instant \
is read for nothing else: an exact grant of what the request costs is decided as at the \
call's sending; a lease, a reservation, a denial to cache, a local fallback's record, a \
commit, waiting requests or a failure read it. An allowed answer that leaves nothing held \
writes nothing to shared data.\n\n\
Cut so far: issue 21 took the CAS of the lease slot on every ask (the demand it wrote is \
read only by leases), the get and CAS recording an allowed exact answer, and the \
bridge-down get on every call: 15 host calls to 11, and 864 of the about 2,000 bytes \
per request across the VM boundary (a lease slot set is 288 bytes, copied in by each \
get and out by each set). Issue 35 took the `:status` read of an answer that is the \
reply, the switch back to the root context at the callback's end (Envoy's host saves \
and restores the effective context around every callback, and a call always leaves \
from the effective context's root context, so a waiter's own call needs no switch \
either), the latency record on most calls above 1,000 a second, the answer's clock \
when nothing needs it and the lease slot get of a key Redis had units left for: 11 to \
6 and a fraction, two VM entries (the status handed in, the slot's bytes copied in). \
Left beyond the floor's 6 (the call's 3, the key, a clock read, the answer's body): the \
sampled **clock and latency record**; and **bytes** of the wire (the body's \
`\"reserve\":0,\"hold_us\":0,\"horizon_us\":0,\"shadow\":false`, 54 of 228 bytes, \
are the bridge's defaults; the answer's zero `due_ns`, `spacing_ns`, `valid_ns` are \
required by the filter's decoder). One more difference is not weir's: the empty \
filter's SDK exports `proxy_on_log` and `proxy_on_done` and weir does not, so the floor \
pays two VM entries per request that weir does not, and **exact − floor** understates \
weir's share by that much.\n\n";
