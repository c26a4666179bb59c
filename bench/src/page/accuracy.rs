//! The accuracy section: how close to its bound each run admitted, its pacing and the CPU
//! it took.

use super::Table;
use crate::accuracy::{self, Mode, PacedRun};
use crate::report::{num, AccuracyResults, Results};

pub(super) fn accuracy_section(r: &Results, png_name: Option<&str>) -> String {
    let a = &r.accuracy;
    let mut o = accuracy_intro(a);
    o.push_str(&slow_bridge_intro(a));
    o.push_str(&accuracy_table(a).markdown());
    o.push_str(&accuracy_notes(a));
    if let Some(png) = png_name {
        o.push_str(&format!(
            "![Admitted requests per second against the limit, one line per mode]({png})\n\n"
        ));
        o.push_str(
            "One limit shared by many keys, over time: an organisation's 100 a second with \
             one user offering 1,000 a second and nine offering 5, without a share and with \
             one (local, and global on two Envoys); drawn by `weir-bench features`, whose \
             figures are in [benchmarks-features.md](benchmarks-features.md#fair-shares).\n\n\
             ![Admitted per second: the heavy user, the new heavy user and each light user, \
             per limiter](benchmarks-shares.png)\n\n",
        );
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
    o.push_str(&peers_section(a, png_name.is_some()));
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
         Cluster, the load split evenly over the two Envoys (but in the uneven runs: twice the \
         limit, 90 % of it on one Envoy, then all of it), `expected_instances` 2; leased \
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

/// weir's global runs beside the peers' on the same loads (issue 35): one row per limiter
/// and load. Nothing when the run had no peer.
fn peers_section(a: &AccuracyResults, picture: bool) -> String {
    if a.peers.is_empty() {
        return String::new();
    }
    let mut t = Table::new(&[
        "load",
        "limiter",
        "admitted",
        "exact bound",
        "over %",
        "under %",
        "p50 ms",
        "p99 ms",
        "Envoy CPU µs/request",
        "conformance",
    ]);
    let weir_name = |m: Mode| {
        if m.rule() == "acc-exact" {
            "weir exact (lease 1)"
        } else {
            "weir leased"
        }
    };
    for load in Mode::PEERS.map(Mode::load_label) {
        let weir = a.runs.iter().filter(|x| {
            x.bridge_delay_ms == 0
                && x.mode.is_global()
                && x.mode != Mode::GlobalIdleThenBurst
                && x.mode.load_label() == load
        });
        let peers = a.peers.iter().filter(|x| x.mode.load_label() == load);
        for x in weir.chain(peers) {
            let limiter = x
                .limiter
                .clone()
                .unwrap_or_else(|| weir_name(x.mode).to_string());
            let conformance = match (&x.limiter, &x.violation) {
                (Some(_), _) => "not judged (no decision log)".to_string(),
                (None, None) => format!(
                    "0 violations ({} checked)",
                    num(x.checked_admissions as f64, 0)
                ),
                (None, Some(_)) => "**violated**".to_string(),
            };
            t.row(vec![
                load.to_string(),
                limiter,
                num(x.admitted as f64, 0),
                num(x.exact_bound, 0),
                format!("{:.2}", x.over_pct),
                format!("{:.2}", x.under_pct),
                num(x.p50_ms, 1),
                num(x.p99_ms, 1),
                num(x.envoy_cpu_us_per_request, 1),
                conformance,
            ]);
        }
    }
    format!(
        "### Beside the peers\n\nThe same paced loads on two Envoys (2 workers each) for what \
         an Envoy user runs instead of weir for one limit over a fleet: \
         **envoy-local-cluster-rate-limit**, Envoy's `local_ratelimit` with \
         `local_cluster_rate_limit` (each Envoy takes its share of one token bucket, {} tokens \
         refilled at {}/s, from the membership of its local cluster, which lists both; no \
         Redis); and **rls-limitador-async** / **rls-limitador-cached**, Envoy's global rate \
         limit filter calling, on every request, Kuadrant's limitador engine \
         (bench/peers/limitador-rls; not envoyproxy/ratelimit), each Envoy its own replica over \
         one standalone redis-server, {} per fixed 1 s window (20×: {}). weir's rows are the \
         global runs above. A peer's admissions are counted against the same exact bound; the \
         conformance checker judges weir's from the decisions weir logs, and a peer logs \
         none. The peers' Envoys route to an upstream they serve themselves (their rate limit \
         filter does nothing on a `direct_response` route), so their Envoy CPU includes that \
         hop.\n\n{}{}",
        a.burst + 1,
        num(a.rate_per_s as f64, 0),
        num(a.rate_per_s as f64, 0),
        num(accuracy::RATE_20X as f64, 0),
        t.markdown(),
        if picture {
            format!(
                "![Own CPU per request of each limiter (the cost run) and under-admission \
                 on each load (this run)]({})\n\n",
                crate::output::PEERS_PNG
            )
        } else {
            String::new()
        }
    )
}
