//! `docs/benchmarks.md` from the run's [`Results`]: every table is built as data first
//! ([`Table`]: a header and rows of cells), then written as Markdown; each section is a
//! small function. Nothing here measures.

use crate::accuracy::{self, Mode, PacedRun};
use crate::cost::{Sample, DISTURBED_PCT, RETRIES_PER_RUN, RETRIES_PER_SAMPLE};
use crate::report::{num, AccuracyResults, Results, Summary, Target};
use crate::scenario::Scenario;
use crate::wrk;

/// A Markdown table: a header and rows of the same width.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    pub head: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(head: &[&str]) -> Table {
        Table {
            head: head.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; panics when its width is not the header's (a bug in this file).
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(
            cells.len(),
            self.head.len(),
            "row {cells:?} for {:?}",
            self.head
        );
        self.rows.push(cells);
    }

    /// The table as Markdown, followed by a blank line.
    pub fn markdown(&self) -> String {
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        let mut out = line(&self.head);
        out.push_str(&format!("|{}\n", "---|".repeat(self.head.len())));
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out.push('\n');
        out
    }
}

fn ratio(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}×")).unwrap_or_else(|| "–".into())
}

fn met(m: Option<bool>) -> &'static str {
    match m {
        Some(true) => "**met**",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

/// The whole page.
pub fn markdown(r: &Results, png_name: Option<&str>) -> String {
    [
        header(r),
        machine_table(r).markdown(),
        cost_section(r),
        counted_section(r),
        bridge_call_section(r),
        accuracy_section(r, png_name),
        targets_section(&r.targets),
        running_section(),
        limits_section(r),
    ]
    .concat()
}

fn header(r: &Results) -> String {
    let how = if r.command == "weir-bench" {
        "`just bench` (`weir-bench` with its default settings)".to_string()
    } else {
        format!("`{}`", r.command)
    };
    format!(
        "# Benchmarks\n\nWritten by {how} on {} UTC, commit {}, in {:.0} s. Every figure on \
         this page comes from that run; every sample is in [bench/results.json](bench/results.json). \
         Re-running `just bench` regenerates the page, the picture and the JSON.\n\n## The machine\n\n",
        r.generated_utc, r.machine.commit, r.settings.wall_s
    )
}

fn machine_table(r: &Results) -> Table {
    let m = &r.machine;
    let mut t = Table::new(&["", ""]);
    for (k, v) in [
        ("CPU", format!("{} × {}", m.cores, m.cpu_model)),
        ("memory", format!("{} GiB", m.memory_gib)),
        ("kernel", m.kernel.clone()),
        ("Envoy", m.envoy.clone()),
        ("load generator", m.wrk.clone()),
        ("Redis", m.redis.clone()),
        ("Rust", m.rustc.clone()),
    ] {
        t.row(vec![k.to_string(), v]);
    }
    t
}

fn cost_section(r: &Results) -> String {
    let s = &r.settings;
    let mut o = format!(
        "## Cost per request\n\nOne Envoy per scenario, `--concurrency 1`, every thread pinned \
         to core {} (checked: `Cpus_allowed_list` {}); wrk (1 thread, {} keep-alive \
         connections), weir-bridge (release build) and a Redis Cluster of 3 masters + 3 \
         replicas pinned to core {}. All Envoys run the whole time; each scenario is warmed up \
         for {} s, then the {} scenarios are measured in turn, {} s each, for {} rounds, the \
         order rotated every round. Same listener, same route (`direct_response` 200), same \
         requests: `GET {}` with `x-user` cycling over {} users and `x-tenant` over {} tenants.\n\n\
         Figures are medians over the rounds with (min–max). **Envoy CPU** is utime + stime of \
         the Envoy process (`/proc/PID/stat`) over the measured interval divided by the requests \
         Envoy counted (`http.ingress.downstream_rq_total`). **Bridge calls** are weir's \
         `weir.PLUGIN.bridge.calls`; **Redis commands** are the `INFO commandstats` calls summed \
         over the masters (the commands the Lua scripts run included; *scripts* counts \
         EVALSHA/EVAL alone). Ratios divide the medians.\n\n",
        s.envoy_core,
        s.envoy_cpus_allowed.join(", "),
        s.connections,
        s.load_core,
        s.warmup_s,
        r.scenarios.len(),
        s.duration_s,
        s.rounds,
        wrk::PATH,
        wrk::USERS,
        wrk::TENANTS
    );
    o.push_str(&cost_table(r).markdown());
    o.push_str(&ratio_table(r).markdown());
    o.push_str("The scenarios:\n\n");
    for x in &r.scenarios {
        o.push_str(&format!("- **{}**: {}.\n", x.id, x.description));
    }
    o.push('\n');
    o.push_str(&saturation_note(r));
    o.push_str(&run_health(r));
    o
}

/// What the saturated scenario measured: wrk runs a closed loop, so the key is over its
/// limit only in rounds where weir answers faster than the limit admits.
fn saturation_note(r: &Results) -> String {
    let id = Scenario::WeirGlobalSaturated.id();
    let (Some(x), Some((_, samples))) = (
        r.scenarios.iter().find(|x| x.id == id),
        r.samples.iter().find(|(s, _)| s == id),
    ) else {
        return String::new();
    };
    let without = samples
        .iter()
        .filter(|s| s.limited_fraction() == 0.0)
        .count();
    format!(
        "In this run **{id}** answered no 429 at all in {without} of {} rounds; its median \
         requests/s, {}, is about the key's limit of 1,000/s, and its median p50 answer took {} µs: wrk's connections waited for them, so the offered load fell to about \
         what was admitted. Its figures are mostly those of a key at its limit, decided with \
         {} bridge calls per request, not of requests denied locally (non-2xx {} % in the \
         median round, at most {} %).\n\n",
        samples.len(),
        num(x.rps.median, 0),
        num(x.p50_us.median, 0),
        num(x.bridge_calls_per_request.median, 2),
        num(x.non_2xx_pct.median, 1),
        num(x.non_2xx_pct.max, 1),
    )
}

fn cost_table(r: &Results) -> Table {
    let mut t = Table::new(&[
        "scenario",
        "requests/s",
        "p50 µs",
        "p99 µs",
        "Envoy CPU µs/request",
    ]);
    for x in &r.scenarios {
        t.row(vec![
            x.id.clone(),
            x.rps.show(0),
            x.p50_us.show(0),
            x.p99_us.show(0),
            x.cpu_us_per_request.show(2),
        ]);
    }
    t
}

fn ratio_table(r: &Results) -> Table {
    let mut t = Table::new(&[
        "scenario",
        "CPU vs native",
        "CPU vs empty wasm",
        "CPU − empty wasm µs",
        "req/s vs native",
        "req/s vs empty wasm",
        "bridge calls/request",
        "host calls/request",
        "Redis commands/request, median (of which scripts)",
        "non-2xx %",
    ]);
    for x in &r.scenarios {
        t.row(vec![
            x.id.clone(),
            ratio(x.cpu_vs_native),
            ratio(x.cpu_vs_empty_wasm),
            x.cpu_over_empty_wasm_us
                .map(|d| format!("{d:+.2}"))
                .unwrap_or_else(|| "–".into()),
            ratio(x.rps_vs_native),
            ratio(x.rps_vs_empty_wasm),
            x.bridge_calls_per_request.show(4),
            host_calls(x),
            format!(
                "{} ({})",
                num(x.redis_commands_per_request.median, 3),
                num(x.redis_scripts_per_request.median, 3)
            ),
            x.non_2xx_pct.show(1),
        ]);
    }
    // Runs before the filter counted its VM entries (`vm.entries`) have no such column.
    if r.scenarios
        .iter()
        .any(|x| x.vm_entries_per_request.median > 0.0)
    {
        t.head.push("VM entries/request".into());
        for (row, x) in t.rows.iter_mut().zip(&r.scenarios) {
            row.push(if x.id.starts_with("weir-") {
                x.vm_entries_per_request.show(2)
            } else {
                "–".into()
            });
        }
    }
    t
}

/// weir's calls into Envoy per request; the empty filter of `host-call-floor` makes
/// the 4 of an exact local decision by construction, the other filters none of weir's.
fn host_calls(x: &Summary) -> String {
    if x.id == Scenario::HostCallFloor.id() {
        "4 (by construction)".into()
    } else if x.id.starts_with("weir-") {
        x.host_calls_per_request.show(2)
    } else {
        "–".into()
    }
}

/// The counted cost (no Envoy, the same on any machine) next to what Envoy counted.
fn counted_section(r: &Results) -> String {
    if r.counted.is_empty() {
        return String::new();
    }
    format!(
        "## Counted cost per request\n\nWhat a request of each weir scenario costs in units no \
         machine changes: callbacks Envoy makes into the VM and calls the VM makes into Envoy, by \
         kind. Counted on a scripted Envoy (`weir_core::filter::scripted`: the callbacks Envoy \
         makes for a request answered by a direct response, bridge calls answered at once by \
         weir-bridge's model), {} requests per scenario after a warm-up, with the scenario's \
         configuration and traffic; `weir-bench counted` prints this table, and CI holds it to \
         `bench/counted-ceilings.json`. The host calls and VM entries Envoy itself counted in the \
         runs above (`vm.host_calls`, `vm.entries`) are in the table before.{}\n\n{}\n",
        r.counted.first().map_or(0, |c| c.requests),
        r.empty_wasm_entries.map_or(String::new(), |n| format!(
            " The empty filter pays {n} VM entries per request: the per-request callbacks its \
             module exports (it hands nothing into the VM), read from its export section; the \
             smoke run checks that weir's local scenarios pay no more, as Envoy counted them."
        )),
        crate::counted::table(&r.counted)
    )
}

// What a bridge call costs (issue 21, item 4).

/// The exact bridge call split into Envoy's HTTP client and weir's VM share, with what
/// weir's request does across its VM boundary, and what that leaves to cut.
fn bridge_call_section(r: &Results) -> String {
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
         these figures. Each figure is the difference of the two scenarios within each \
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
it. weir-global-exact makes 11 host calls per request (`cargo test -p weir-bench` checks \
the count), 8 more than the floor:\n\n\
- *on_request_headers*: the **clock** (time enters once); the **`x-tenant` header** (the \
key); a **shared-data get of the rule's lease slot set** (a cached denial would answer \
the request; an exact rule writes nothing there when it asks); the **dispatch**. A worker \
also reads the bridge-down key (skip the bridge for a second after a failure), and writes \
the instant Envoy last took a call of the plugin (a call Envoy then refuses is a full \
circuit breaker, not a cluster without hosts), each at most every 10 ms, not per call.\n\
- *on_http_call_response*: the **clock** (the call's latency, and the instants a grant \
is anchored on); a **stats record** (the bridge latency histogram); the answer's \
**`:status` header** and **body**; **set_effective_context** to the request, its \
**resume**, and **set_effective_context** back to the root context. An allowed answer \
that leaves nothing held writes nothing to shared data (a denial is cached; a rule with \
leases or `failure_mode: local` records what Redis said).\n\n\
Cut so far (issue 21): the CAS of the lease slot on every ask (the demand it wrote is \
read only by leases), the get and CAS recording an allowed exact answer, and the \
bridge-down get on every call: 15 host calls to 11, and 864 of the about 2,000 bytes \
per request across the VM boundary (a lease slot set is 288 bytes, copied in by each \
get and out by each set). Left: the **switch back to the root context** (Envoy's host \
restores the effective context when the callback returns, but a waiter's own call must \
leave from the root context, and that was not proven here), the **latency record** on \
every call (sampling would cut most of it), and **bytes** of the wire (the body's \
`\"reserve\":0,\"hold_us\":0,\"horizon_us\":0,\"shadow\":false`, 54 of 228 bytes, \
are the bridge's defaults; the answer's zero `due_ns`, `spacing_ns`, `valid_ns` are \
required by the filter's decoder). One more difference is not weir's: the empty \
filter's SDK exports `proxy_on_log` and `proxy_on_done` and weir does not, so the floor \
pays two VM entries per request that weir does not, and **exact − floor** understates \
weir's share by that much.\n\n";

fn run_health(r: &Results) -> String {
    let failures: u64 = r.scenarios.iter().map(|x| x.bridge_failures).sum();
    let socket: u64 = r.scenarios.iter().map(|x| x.socket_errors).sum();
    let noisy = r
        .scenarios
        .iter()
        .map(|x| x.envoy_core_other_pct.max)
        .fold(0.0, f64::max);
    let all: Vec<&Sample> = r.samples.iter().flat_map(|(_, v)| v).collect();
    let disturbed = all
        .iter()
        .filter(|x| x.envoy_core_other_pct > DISTURBED_PCT)
        .count();
    let retried = all.iter().filter(|x| x.retries > 0).count();
    let clocks_agree = all
        .iter()
        .filter(|x| x.runtime_us_per_request > 0.0)
        .map(|x| (x.cpu_us_per_request / x.runtime_us_per_request - 1.0).abs() * 100.0)
        .fold(0.0, f64::max);
    format!(
        "Health of the run: {failures} failed or skipped bridge calls, {socket} wrk socket errors \
         or timeouts. A sample in which more than {DISTURBED_PCT} % of the Envoy core's busy time \
         was not Envoy's (softirq, processes we cannot see, such as another build) is measured \
         again, up to {RETRIES_PER_SAMPLE} times (at most {RETRIES_PER_RUN} times per run), keeping \
         the least disturbed attempt: {retried} of {} samples were measured again, and {disturbed} \
         kept more than {DISTURBED_PCT} % all the same (at most {noisy:.1} %). A slower host (a \
         neighbour on the same physical core) does not show up there, only in the spread between \
         rounds. utime + stime agree with the scheduler's ns clock (`schedstat`, in the JSON) to \
         within {clocks_agree:.1} % in every sample.\n\n",
        all.len(),
    )
}

fn accuracy_section(r: &Results, png_name: Option<&str>) -> String {
    let a = &r.accuracy;
    let mut o = accuracy_intro(a);
    o.push_str(&slow_bridge_intro(a));
    o.push_str(&accuracy_table(a).markdown());
    o.push_str(&accuracy_notes(a));
    if let Some(png) = png_name {
        o.push_str(&format!(
            "![Admitted requests per second against the limit, one line per mode]({png})\n\n"
        ));
    }
    o.push_str(
        "Admitted per second, by the second in which each request was sent (the first second \
         includes the burst):\n\n",
    );
    o.push_str(&per_second_table(a).markdown());
    o.push_str(&format!(
        "CPU used during each accuracy run, in % of one core (the machine has {}), and the \
         schedule: the slowest client thread fell at most this far behind.\n\n",
        r.machine.cores
    ));
    o.push_str(&accuracy_cpu_table(a).markdown());
    o
}

fn accuracy_intro(a: &AccuracyResults) -> String {
    format!(
        "## Accuracy\n\nA GCRA limit of {} requests/s with burst {} (so {} at once, then one \
         every {} ms) on one key, scheduled at {} requests/s (5× the limit) for {} s by a paced load generator \
         (`bench/src/accuracy.rs`: {} threads, each with one keep-alive connection, sending on a \
         fixed schedule); the 20× run offers the same load to a limit of {}/s, burst {}; the \
         idle-then-burst run offers twice the rate, stops for 0.5 s (longer than the key's \
         tolerance, shorter than leases used to live) and then sends as fast as every thread \
         can for 0.2 s. Global modes: two Envoys with 2 workers each, weir-bridge and the Redis \
         Cluster, the load split evenly over the two Envoys, `expected_instances` 2; leased \
         modes with `lease.max` {}, `lease.ttl` {} (the hold, paid with {} units of the burst) \
         and `lease.horizon` {}. Local mode: one Envoy with 4 workers. Nothing is pinned here.\n\n\
         **Conformance**: every Envoy logs every decision (`response.filter_state: all`), and \
         the core's `conformance::check` judges all admissions of the run's key, at the instants \
         they were decided, against the GCRA bound in every interval (docs/global.md, \"What \
         the limit guarantees\"). The **exact bound** is burst + 1 + rate × the time from the \
         first request sent to the last answer received, the most a conformant limiter can \
         admit when offered more than its rate all along; over- and under-admission are \
         against it (not meaningful for the idle-then-burst run, which is offered nothing for \
         a while). **Envoy CPU** is utime + stime of the run's Envoys over the run, per request \
         sent; it is not pinned and not comparable with the cost table's.\n\n",
        num(a.rate_per_s as f64, 0),
        a.burst,
        a.burst + 1,
        num(1000.0 / a.rate_per_s as f64, 0),
        num(a.offered_rps, 0),
        a.runs.first().map(|x| x.seconds).unwrap_or(0),
        a.threads,
        num(accuracy::RATE_20X as f64, 0),
        accuracy::BURST_20X,
        a.lease_max,
        a.lease_ttl,
        accuracy::HOLD_PAID,
        a.horizon
    )
}

/// How the slowed runs differ from the others; nothing when the run had none.
fn slow_bridge_intro(a: &AccuracyResults) -> String {
    let mut delays: Vec<u64> = a
        .runs
        .iter()
        .map(|x| x.bridge_delay_ms)
        .filter(|&ms| ms > 0)
        .collect();
    delays.sort_unstable();
    delays.dedup();
    if delays.is_empty() {
        return String::new();
    }
    let delays: Vec<String> = delays.iter().map(|ms| format!("{ms} ms")).collect();
    format!(
        "**A slow bridge** (the rows marked *bridge +N ms*): the leased 5× and 20× runs again, \
         with {} added to every bridge round trip. Two fresh global Envoys (2 workers each) per \
         delay, whose bridge cluster points at a delaying TCP proxy (`tests/src/slow_proxy.rs`: \
         half the delay on each leg, every chunk written at its own deadline, so calls in \
         flight together are not serialised) in front of the same weir-bridge and Redis \
         Cluster; same rules, same schedule, `bridge.timeout` 250 ms. The proxy runs in the \
         load generator's process: its CPU is in that column.\n\n",
        delays.join(" and ")
    )
}

fn accuracy_table(a: &AccuracyResults) -> Table {
    let mut t = Table::new(&[
        "mode",
        "sent req/s",
        "× limit (sent)",
        "admitted",
        "exact bound",
        "over",
        "under",
        "conformance",
        "bridge calls/request",
        "Envoy CPU µs/request",
        "Redis granted (unused)",
        "p50 / p99 ms",
        "other statuses",
    ]);
    for x in &a.runs {
        let global = x.mode.is_global();
        let bounded = x.mode != Mode::GlobalIdleThenBurst;
        let dash = || "–".to_string();
        let pct = |v: f64| if bounded { format!("{v:.2} %") } else { dash() };
        t.row(vec![
            x.title(),
            num(x.sent_rps, 0),
            format!("{}×", num(x.sent_rps / x.rate as f64, 1)),
            num(x.admitted as f64, 0),
            if bounded {
                num(x.exact_bound, 0)
            } else {
                dash()
            },
            pct(x.over_pct),
            pct(x.under_pct),
            match &x.violation {
                None => format!("kept ({} admissions)", num(x.checked_admissions as f64, 0)),
                Some(_) => "**violated**".into(),
            },
            if global {
                num(x.bridge_calls as f64 / x.sent.max(1) as f64, 4)
            } else {
                dash()
            },
            num(x.envoy_cpu_us_per_request, 1),
            if global {
                format!(
                    "{} ({})",
                    num(x.redis_granted as f64, 0),
                    num(x.redis_granted.saturating_sub(x.admitted) as f64, 0)
                )
            } else {
                dash()
            },
            format!("{} / {}", num(x.p50_ms, 2), num(x.p99_ms, 2)),
            x.failed.to_string(),
        ]);
    }
    t
}

fn accuracy_notes(a: &AccuracyResults) -> String {
    let mut o = String::new();
    for x in a.runs.iter().filter(|x| behind_schedule(x)) {
        o.push_str(&format!(
            "- **{}**: the generator fell behind its schedule (by up to {} ms): it sent {} \
             requests/s, {}× the limit, not the {}× its name says.\n",
            x.label(),
            num(x.max_lag_ms, 0),
            num(x.sent_rps, 0),
            num(x.sent_rps / x.rate as f64, 1),
            num(x.multiple, 0),
        ));
    }
    for x in a.runs.iter().filter(|x| x.violation.is_some()) {
        o.push_str(&format!(
            "- **{}**: {}\n",
            x.label(),
            x.violation.as_deref().unwrap_or_default()
        ));
    }
    for x in a.runs.iter().filter(|x| x.mode.is_global()) {
        let get = |k: &str| num(x.rule_stats.get(k).copied().unwrap_or(0) as f64, 0);
        o.push_str(&format!(
            "- {}: of {} requests, {} were decided by Redis through the bridge, {} from units \
             held (leases and reservations, allowed or not yet due), {} from a cached denial.\n",
            x.label(),
            num(x.sent as f64, 0),
            get("bridge_decisions"),
            get("lease_hits"),
            get("denial_cache_hits")
        ));
        // Runs before the slowed ones never met the failure mode; say it only when it acted.
        let failed = x.failure_mode_decisions();
        if failed > 0 {
            o.push_str(&format!(
                "  **{} requests were decided by the failure mode** (the bridge failed, or the \
                 call they would have waited on held all the waiters it may): {} allowed \
                 without an admission of the limit (they count among the 200s, not among the \
                 admissions checked), {} denied, {} decided locally.\n",
                num(failed as f64, 0),
                get("failure_allowed"),
                get("failure_denied"),
                get("failure_local")
            ));
        }
    }
    o.push('\n');
    o
}

/// Whether a run sent less than 90 % of what its schedule offered.
fn behind_schedule(x: &PacedRun) -> bool {
    x.sent_rps < 0.9 * x.multiple * x.rate as f64
}

fn per_second_table(a: &AccuracyResults) -> Table {
    let labels: Vec<String> = a.runs.iter().map(PacedRun::label).collect();
    let mut head = vec!["second"];
    head.extend(labels.iter().map(String::as_str));
    let mut t = Table::new(&head);
    let n = a.runs.iter().map(|x| x.seconds).max().unwrap_or(0) as usize;
    for i in 0..n {
        let mut row = vec![(i + 1).to_string()];
        row.extend(
            a.runs
                .iter()
                .map(|x| num(x.admitted_per_second.get(i).copied().unwrap_or(0) as f64, 0)),
        );
        t.row(row);
    }
    t
}

fn accuracy_cpu_table(a: &AccuracyResults) -> Table {
    let mut t = Table::new(&[
        "mode",
        "Envoys",
        "weir-bridge",
        "Redis (6 nodes)",
        "load generator",
        "max lag ms",
    ]);
    for x in &a.runs {
        let c = |k: &str| {
            x.cpu_pct
                .get(k)
                .map(|v| format!("{v:.0} %"))
                .unwrap_or_else(|| "–".into())
        };
        t.row(vec![
            x.label(),
            c("envoys"),
            c("bridge"),
            c("redis"),
            c("generator"),
            num(x.max_lag_ms, 1),
        ]);
    }
    t
}

fn targets_section(targets: &[Target]) -> String {
    let mut t = Table::new(&["target", "this run", ""]);
    for x in targets {
        t.row(vec![
            x.target.clone(),
            x.measured.clone(),
            met(x.met).to_string(),
        ]);
    }
    format!("## Targets (issues 4, 10 and 21)\n\n{}", t.markdown())
}

fn running_section() -> String {
    "## Running it\n\n`just bench` builds `weir.wasm`, the empty filter and `weir-bridge \
     --release`, runs `weir-bench` (about 12 minutes) and rewrites this page, \
     `docs/bench/results.json` and the picture (drawn by `bench/plot.py`; matplotlib is \
     installed into `.tools/venv` when missing). `weir-bench --render docs/bench/results.json` \
     writes the page again from the JSON alone. `just bench-smoke` runs every part for a second \
     or two into a temp dir and only checks that numbers came out and that no admission broke \
     its bound (CI runs it; it asserts no performance). `weir-bench --help` lists the settings \
     (`--rounds`, `--duration`, `--warmup`, `--connections`, `--accuracy-secs`, `--out`, \
     `--only`, `--no-accuracy`, `--no-plot`, `--render`); `--only` also takes two diagnostic \
     scenarios that split weir's cost, `weir-no-match` (one rule whose match never holds) and \
     `weir-unkeyed` (one rule without a key). The slowed scenarios \
     (`weir-global-saturated-slow10`, `-slow30`) and the leased accuracy runs marked *bridge \
     +10 ms* and *+30 ms* reach weir-bridge through a delaying TCP proxy \
     (`tests/src/slow_proxy.rs`), to show what a slow bridge does to the global figures \
     (issue 21). `just bench-sim` simulates a fleet against the real \
     bridge and Redis (docs/capacity.md). `just bench` then runs `weir-bench features`: token \
     budgets (costs known after the response) and delay instead of reject, on real Envoys, \
     written to [benchmarks-features.md](benchmarks-features.md), and `weir-bench concurrency`: \
     concurrency limits next to Envoy's `adaptive_concurrency`, written to \
     [benchmarks-concurrency.md](benchmarks-concurrency.md).\n\n"
        .to_string()
}

fn limits_section(r: &Results) -> String {
    let (m, s, a) = (&r.machine, &r.settings, &r.accuracy);
    let max_lag = a.runs.iter().map(|x| x.max_lag_ms).fold(0.0, f64::max);
    let busiest = a
        .runs
        .iter()
        .filter(|x| x.mode.is_global())
        .map(|x: &PacedRun| x.cpu_pct.values().sum::<f64>())
        .fold(0.0, f64::max);
    format!(
        "## What limits these figures\n\n\
         - **Host calls.** A proxy-wasm filter pays for every call into Envoy, and more for \
         those that return data (Envoy calls back into the VM to allocate the copy). A local \
         decision kept in shared data needs at least four: the clock, the key's header, the \
         shared-data get and the CAS set. The `host-call-floor` scenario makes exactly \
         weir-local's four calls from the empty filter and nothing else: what it costs over the \
         empty filter is the price of the design in this Envoy, before any rate-limiting code \
         runs (the targets table splits weir's figures this way). weir makes no other host call \
         on an allowed request: its counters are kept in the VM and handed to Envoy every \
         100 ms, and its headers are only added on denials unless `headers_on_allowed` is set.\n\
         - **{cores} vCPUs for everything.** In the cost runs Envoy has core {envoy_core} to \
         itself, but wrk, weir-bridge and all six Redis nodes share core {load_core}: requests/s \
         and latency are those of that pair of cores, and in the global scenarios the load core \
         also runs the bridge and Redis, so their requests/s fall for reasons that are not \
         Envoy's. CPU µs per request is the figure to compare across scenarios; requests/s and \
         latency are closed-loop figures of this setup.\n\
         - **Loopback.** No network: a bridge call costs a loopback round trip and Redis runs on \
         the same machine; a real network adds latency to exact global decisions, not CPU.{slow}\n\
         - **A virtual machine with neighbours.** These are vCPUs; other engineers' builds may \
         run during a run, and the host itself changes speed between runs (compare `no-filter` \
         across runs before comparing µs). That is why the scenarios are interleaved and \
         repeated and the tables give min–max; the JSON has every sample, with the share of the \
         Envoy core that was not Envoy's in each.\n\
         - **Clock-tick resolution.** `/proc` CPU times count {ticks} ticks per second; over a \
         {duration} s run that is well under 1 % of the figure.\n\
         - **One worker.** Envoy runs one worker in the cost runs; with more workers, weir's \
         shared-data CAS can contend (the accuracy run's local mode has 4 workers).\n\
         - **The accuracy run** is not pinned: two Envoys with 2 workers each, the bridge, Redis \
         and the load generator all share the two cores, so answers can be late; the paced \
         generator catches up after a late answer (the slowest thread fell at most {lag} ms \
         behind schedule), and the processes used up to {busiest} % of the {all} % the machine \
         has: at 5,000 requests/s the global modes run the machine near its limit, which is \
         what the answer times (p50 / p99) show.\n",
        slow = slow_bridge_limits(r),
        cores = m.cores,
        envoy_core = s.envoy_core,
        load_core = s.load_core,
        ticks = crate::sys::clock_ticks(),
        duration = s.duration_s,
        lag = num(max_lag, 1),
        busiest = num(busiest, 0),
        all = m.cores * 100,
    )
}

/// What the delaying proxy does not model, when the run had slowed scenarios or runs.
fn slow_bridge_limits(r: &Results) -> &'static str {
    let slowed_scenario = r
        .scenarios
        .iter()
        .any(|x| Scenario::from_id(&x.id).is_some_and(|s| s.slowed().is_some()));
    let slowed_run = r.accuracy.runs.iter().any(|x| x.bridge_delay_ms > 0);
    if !slowed_scenario && !slowed_run {
        return "";
    }
    " The slowed scenarios and runs put distance back with a proxy that holds bytes: \
     latency alone (no loss, no bandwidth limit, no jitter beyond the scheduler's), and the \
     TCP handshake is not delayed. While a slowed scenario's Envoy waits for the bridge its \
     core is idle, and a neighbour's work that lands there counts against the sample as \
     disturbance."
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_markdown_with_one_separator_and_rows_as_wide_as_the_header() {
        let mut t = Table::new(&["a", "b"]);
        t.row(vec!["1".into(), "2".into()]);
        t.row(vec!["3".into(), "4 | 5".replace(" | ", " / ")]);
        assert_eq!(
            t.markdown(),
            "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 / 5 |\n\n"
        );
    }

    /// The committed results render (`weir-bench --render` keeps working on them), with
    /// every scenario and accuracy mode on the page.
    #[test]
    fn the_committed_results_render() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/bench/results.json");
        let text = std::fs::read_to_string(path).unwrap();
        let results: Results = serde_json::from_str(&text).unwrap();
        let page = markdown(&results, None);
        for x in &results.scenarios {
            assert!(page.contains(&format!("| {} |", x.id)), "{}", x.id);
        }
        for x in &results.accuracy.runs {
            assert!(page.contains(&x.title()), "{}", x.title());
        }
        assert!(page.contains("## Targets"));
    }

    /// `docs/benchmarks.md` is exactly what the committed JSON renders to: every figure on
    /// the page, prose included, is the data's (re-render with `weir-bench --render
    /// docs/bench/results.json` after changing this module).
    #[test]
    fn the_committed_page_is_what_the_committed_results_render() {
        let docs = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs");
        let text = std::fs::read_to_string(format!("{docs}/bench/results.json")).unwrap();
        let results: Results = serde_json::from_str(&text).unwrap();
        let page = std::fs::read_to_string(format!("{docs}/benchmarks.md")).unwrap();
        assert!(
            page == markdown(&results, Some(crate::PNG)),
            "docs/benchmarks.md is not what docs/bench/results.json renders to: \
             run `cargo run -p weir-bench -- --render docs/bench/results.json --no-plot`"
        );
    }

    #[test]
    #[should_panic(expected = "row")]
    fn a_row_of_the_wrong_width_is_a_bug() {
        Table::new(&["a", "b"]).row(vec!["1".into()]);
    }
}
