//! The cost section: CPU per request of every scenario, against Envoy's native filter and
//! the empty Wasm filter, the run's health, and what a request costs in VM entries and host
//! calls.

use super::{ratio, Table};
use crate::cost::{Sample, DISTURBED_PCT, RETRIES_PER_RUN, RETRIES_PER_SAMPLE};
use crate::report::{num, Results, Summary};
use crate::scenario::Scenario;
use crate::wrk;

pub(super) fn cost_section(r: &Results) -> String {
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
    o.push_str(&system_section(r));
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

/// The whole system's CPU per request: Envoy, weir-bridge, the peers' rate limit service
/// and Redis, each process's utime + stime over the interval divided by the requests, and
/// a limiter's own cost, that sum less its baseline's (no filter, the same route). Left
/// out for a run that measured Envoy alone.
fn system_section(r: &Results) -> String {
    if !r
        .scenarios
        .iter()
        .any(|x| x.system_cpu_us_per_request.median > 0.0)
    {
        return String::new();
    }
    let peers = r
        .scenarios
        .iter()
        .any(|x| x.rls_cpu_us_per_request.median > 0.0);
    let mut head = vec!["scenario", "Envoy µs/request", "weir-bridge µs/request"];
    if peers {
        head.push("rate limit service µs/request");
    }
    head.extend([
        "Redis µs/request",
        "all µs/request",
        "own cost µs/request (all − its baseline's)",
        "p50 µs",
        "p99 µs",
        "Redis commands/request",
    ]);
    let mut t = Table::new(&head);
    for x in &r.scenarios {
        let mut row = vec![
            x.id.clone(),
            x.cpu_us_per_request.show(2),
            x.bridge_cpu_us_per_request.show(2),
        ];
        if peers {
            row.push(x.rls_cpu_us_per_request.show(2));
        }
        row.extend([
            x.redis_cpu_us_per_request.show(2),
            x.system_cpu_us_per_request.show(2),
            x.own_cpu_us_per_request
                .map_or_else(|| "–".into(), |d| format!("{d:+.2}")),
            num(x.p50_us.median, 0),
            num(x.p99_us.median, 0),
            num(x.redis_commands_per_request.median, 3),
        ]);
        t.row(row);
    }
    let own = |s: Scenario| {
        r.scenarios
            .iter()
            .find(|x| x.id == s.id())
            .and_then(|x| x.own_cpu_us_per_request)
    };
    // Where weir loses, said plainly.
    let loses = match (own(Scenario::WeirGlobalExact), own(Scenario::RlsAsync)) {
        (Some(w), Some(p)) if w > p => format!(
            " **Where weir loses**: its exact mode, a bridge call per request over HTTP/1.1 \
             to weir-bridge and a Redis Cluster with replicas, costs {w:.1} µs of CPU per \
             request of its own, more than Envoy's rate limit filter calling limitador \
             with its exact storage on one Redis ({p:.1} µs){}; leases are what make \
             weir's global limits cheap.",
            own(Scenario::WeirGlobalExactSingleRedis)
                .map(|x| format!(" (over that same one Redis, weir's exact mode costs {x:.1} µs)"))
                .unwrap_or_default()
        ),
        _ => String::new(),
    };
    let peers_note = if peers {
        " The peers (`rls-limitador-*`) are Envoy's global rate limit filter calling \
         Kuadrant's limitador engine (bench/peers/limitador-rls; not envoyproxy/ratelimit) \
         over one standalone redis-server; their route goes to an upstream the same Envoy \
         serves, since Envoy's rate limit filter does nothing on a `direct_response` route, \
         so their baseline is no-filter-upstream, that hop with no filter, for the requests \
         let through, and no-filter for their 429s, which never reach the upstream."
    } else {
        ""
    };
    format!(
        "**Whole-system CPU per request**: the processes a request can cost CPU in, each \
         one's utime + stime (`/proc/PID/stat`) over the same interval divided by the \
         requests Envoy counted: Envoy, weir-bridge, the peers' rate limit services, and \
         Redis (the Redis Cluster's 6 nodes, replication included, and the peers' \
         standalone server) summed; the `*-single-redis` rows call a second weir-bridge \
         over that standalone server, and both bridges are in the weir-bridge column. These services serve one scenario at a time, so what \
         they use in a scenario's interval is that scenario's, plus their idle work, which \
         no-filter's row shows (it makes no call); **own cost** takes the whole system of \
         the scenario's baseline away (no filter, the same route).{peers_note} *all* is \
         each round's sum, then the median, so it need not equal the sum of the medians.{loses}\n\n{}",
        t.markdown()
    )
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
pub(super) fn counted_section(r: &Results) -> String {
    if r.counted.is_empty() {
        return String::new();
    }
    format!(
        "## Counted cost per request\n\nWhat a request of each weir scenario costs in units no \
         machine changes: callbacks Envoy makes into the VM and calls the VM makes into Envoy, by \
         kind. Counted on a scripted Envoy (`weir_scripted::scripted_host`: the callbacks Envoy \
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
