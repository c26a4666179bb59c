//! Medians, ratios, targets, and the two outputs: `results.json` (every sample) and
//! `benchmarks.md` (the tables). Nothing here measures; every figure comes from the run.

use std::fmt::Write as _;

use crate::accuracy::{self, Mode, PacedRun};
use crate::cost::{Sample, Samples, DISTURBED_PCT, RETRIES_PER_RUN, RETRIES_PER_SAMPLE};
use crate::scenario::Scenario;
use crate::sys::Machine;
use crate::wrk;

/// Median with min and max.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stat {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Stat {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Stat::default();
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Stat {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }

    /// `median (min–max)` with `d` decimals; just the median when there is one sample.
    pub fn show(&self, d: usize) -> String {
        let (m, lo, hi) = (num(self.median, d), num(self.min, d), num(self.max, d));
        if lo == hi {
            m
        } else {
            format!("{m} ({lo}–{hi})")
        }
    }
}

/// A number with `d` decimals and thin-space-free thousands separators (`12,345.6`).
pub fn num(x: f64, d: usize) -> String {
    let s = format!("{:.*}", d, x.abs());
    let (int, frac) = match s.split_once('.') {
        Some((i, f)) => (i.to_string(), Some(f.to_string())),
        None => (s.clone(), None),
    };
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let sign = if x < 0.0 && s.chars().any(|c| c.is_ascii_digit() && c != '0') {
        "-"
    } else {
        ""
    };
    match frac {
        Some(f) => format!("{sign}{grouped}.{f}"),
        None => format!("{sign}{grouped}"),
    }
}

/// One scenario over all its rounds.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    pub id: String,
    pub description: String,
    pub rounds: usize,
    pub rps: Stat,
    pub p50_us: Stat,
    pub p99_us: Stat,
    pub cpu_us_per_request: Stat,
    pub bridge_calls_per_request: Stat,
    pub redis_commands_per_request: Stat,
    pub redis_scripts_per_request: Stat,
    /// Responses that were not 2xx, % of wrk's requests.
    pub non_2xx_pct: Stat,
    /// Failed bridge calls plus requests that skipped the bridge, over all rounds.
    pub bridge_failures: u64,
    pub socket_errors: u64,
    pub envoy_core_other_pct: Stat,
    /// Median CPU per request ÷ the native filter's, and ÷ the empty wasm filter's.
    pub cpu_vs_native: Option<f64>,
    pub cpu_vs_empty_wasm: Option<f64>,
    /// Median CPU per request − the empty wasm filter's, µs.
    pub cpu_over_empty_wasm_us: Option<f64>,
    pub rps_vs_native: Option<f64>,
    pub rps_vs_empty_wasm: Option<f64>,
}

pub fn summarize(samples: &Samples) -> Vec<Summary> {
    let stat = |v: &[Sample], f: &dyn Fn(&Sample) -> f64| Stat::of(v.iter().map(f));
    let mut out: Vec<Summary> = samples
        .iter()
        .map(|(s, v)| Summary {
            id: s.id().to_string(),
            description: s.describe().to_string(),
            rounds: v.len(),
            rps: stat(v, &|x| x.wrk.rps()),
            p50_us: stat(v, &|x| x.wrk.p50_us),
            p99_us: stat(v, &|x| x.wrk.p99_us),
            cpu_us_per_request: stat(v, &|x| x.cpu_us_per_request),
            bridge_calls_per_request: stat(v, &|x| x.per_request(x.bridge_calls)),
            redis_commands_per_request: stat(v, &|x| x.per_request(x.redis_commands)),
            redis_scripts_per_request: stat(v, &|x| x.per_request(x.redis_scripts)),
            non_2xx_pct: stat(v, &|x| x.limited_fraction() * 100.0),
            bridge_failures: v.iter().map(|x| x.bridge_failures).sum(),
            socket_errors: v.iter().map(|x| x.wrk.socket_errors + x.wrk.timeouts).sum(),
            envoy_core_other_pct: stat(v, &|x| x.envoy_core_other_pct),
            cpu_vs_native: None,
            cpu_vs_empty_wasm: None,
            cpu_over_empty_wasm_us: None,
            rps_vs_native: None,
            rps_vs_empty_wasm: None,
        })
        .collect();
    let find = |out: &[Summary], s: Scenario| {
        out.iter()
            .find(|x| x.id == s.id())
            .map(|x| (x.cpu_us_per_request.median, x.rps.median))
    };
    let native = find(&out, Scenario::Native);
    let empty = find(&out, Scenario::EmptyWasm);
    let ratio = |a: f64, b: f64| (b > 0.0).then(|| a / b);
    for x in &mut out {
        let (cpu, rps) = (x.cpu_us_per_request.median, x.rps.median);
        if let Some((n_cpu, n_rps)) = native {
            x.cpu_vs_native = ratio(cpu, n_cpu);
            x.rps_vs_native = ratio(rps, n_rps);
        }
        if let Some((e_cpu, e_rps)) = empty {
            x.cpu_vs_empty_wasm = ratio(cpu, e_cpu);
            x.rps_vs_empty_wasm = ratio(rps, e_rps);
            x.cpu_over_empty_wasm_us = Some(cpu - e_cpu);
        }
    }
    out
}

/// One target of the issue, judged on this run.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Target {
    pub target: String,
    pub measured: String,
    /// `None` when this run did not measure it (a scenario was left out).
    pub met: Option<bool>,
}

pub fn targets(summaries: &[Summary], accuracy: &[PacedRun]) -> Vec<Target> {
    let get = |s: Scenario| summaries.iter().find(|x| x.id == s.id());
    let mut t = Vec::new();
    let floor = get(Scenario::HostCallFloor).and_then(|x| x.cpu_over_empty_wasm_us);
    // "empty wasm +X µs", and how much of it the host calls alone cost in this run.
    let over_empty = |d: Option<f64>| {
        match (d, floor) {
        (Some(d), Some(f)) => format!(
            "empty wasm {d:+.1} µs, of which the same host calls alone (host-call-floor) {f:+.1} µs and the rest {:+.1} µs",
            d - f
        ),
        (Some(d), None) => format!("empty wasm {d:+.1} µs"),
        (None, _) => "not measured".into(),
    }
    };
    let local = get(Scenario::WeirLocal).and_then(|x| x.cpu_over_empty_wasm_us);
    t.push(Target {
        target: "weir local, one keyed rule: ≤ empty wasm + 4 µs per request".into(),
        measured: over_empty(local),
        met: local.map(|d| d <= 4.0),
    });
    let leases = get(Scenario::WeirGlobalLeases);
    let d = leases.and_then(|x| x.cpu_over_empty_wasm_us);
    t.push(Target {
        target: "weir global with leases, far from the limit: ≤ empty wasm + 6 µs per request"
            .into(),
        measured: over_empty(d),
        met: d.map(|d| d <= 6.0),
    });
    let calls = leases.map(|x| x.bridge_calls_per_request.median);
    t.push(Target {
        target: "weir global with leases: ≤ 1 bridge call per 50 requests".into(),
        measured: calls
            .map(|c| {
                if c > 0.0 {
                    format!("1 per {} requests ({:.4} per request)", num(1.0 / c, 0), c)
                } else {
                    "0 calls".into()
                }
            })
            .unwrap_or_else(|| "not measured".into()),
        met: calls.map(|c| c <= 1.0 / 50.0),
    });
    // Issue 10: the global path at and far from the limit.
    let runs_of = |modes: &[Mode]| -> Vec<&PacedRun> {
        accuracy
            .iter()
            .filter(|r| modes.contains(&r.mode))
            .collect()
    };
    let listed = |runs: &[&PacedRun], f: &dyn Fn(&PacedRun) -> String| {
        if runs.is_empty() {
            "not measured".to_string()
        } else {
            runs.iter()
                .map(|r| format!("{}: {}", r.mode.label(), f(r)))
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    let all: Vec<&PacedRun> = accuracy.iter().collect();
    t.push(Target {
        target: "0 conformance violations in every accuracy run (every admission of every Envoy, checked by `conformance::check`)".into(),
        measured: listed(&all, &|r| match &r.violation {
            None => format!("0 ({} admissions)", num(r.checked_admissions as f64, 0)),
            Some(_) => "**a violation** (in the JSON)".into(),
        }),
        met: (!all.is_empty()).then(|| all.iter().all(|r| r.violation.is_none())),
    });
    let saturated = runs_of(&[Mode::GlobalLeased, Mode::GlobalLeased20x]);
    let calls_per_request = |r: &PacedRun| r.bridge_calls as f64 / r.sent.max(1) as f64;
    t.push(Target {
        target: "at 5× and 20× the limit on one key (leased): ≤ 0.02 bridge calls per request"
            .into(),
        measured: listed(&saturated, &|r| format!("{:.4}", calls_per_request(r))),
        met: (!saturated.is_empty())
            .then(|| saturated.iter().all(|r| calls_per_request(r) <= 0.02)),
    });
    t.push(Target {
        target: "at 5× and 20× the limit on one key (leased): under-admission ≤ 2 %".into(),
        measured: listed(&saturated, &|r| format!("{:.2} %", r.under_pct)),
        met: (!saturated.is_empty()).then(|| saturated.iter().all(|r| r.under_pct <= 2.0)),
    });
    let hot = get(Scenario::WeirGlobalSaturated).and_then(|x| x.cpu_over_empty_wasm_us);
    let native_429 = get(Scenario::NativeLimited).and_then(|x| x.cpu_over_empty_wasm_us);
    t.push(Target {
        target: "a key far over its limit (weir-global-saturated): Envoy CPU ≤ empty wasm + 15 µs per request".into(),
        measured: format!(
            "{}; Envoy's own local rate limit answering 429s (native-local-ratelimit-limited): {}",
            over_empty(hot),
            native_429
                .map(|d| format!("empty wasm {d:+.1} µs"))
                .unwrap_or_else(|| "not measured".into())
        ),
        met: hot.map(|d| d <= 15.0),
    });
    let far = leases.map(|x| x.bridge_calls_per_request.median);
    t.push(Target {
        target: "far from the limit (weir-global-leases): ≤ 1 bridge call per 200 requests".into(),
        measured: far
            .map(|c| format!("{c:.5} per request"))
            .unwrap_or_else(|| "not measured".into()),
        met: far.map(|c| c <= 1.0 / 200.0),
    });
    for scenario in [Scenario::WeirGlobalExact, Scenario::WeirGlobalExactH2] {
        let d = get(scenario).and_then(|x| x.cpu_over_empty_wasm_us);
        t.push(Target {
            target: format!(
                "a bridge call per request ({}): ≤ empty wasm + 60 µs",
                scenario.id()
            ),
            measured: over_empty(d),
            met: d.map(|d| d <= 60.0),
        });
    }
    t
}

/// Everything the run settles on, for the report and the JSON.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Settings {
    pub rounds: usize,
    pub duration_s: u64,
    pub warmup_s: u64,
    pub connections: u32,
    pub accuracy_s: u64,
    pub envoy_core: usize,
    pub load_core: usize,
    /// `Cpus_allowed_list` of the cost Envoys, as checked after pinning.
    pub envoy_cpus_allowed: Vec<String>,
    pub wall_s: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Results {
    pub generated_utc: String,
    pub command: String,
    pub machine: Machine,
    pub settings: Settings,
    pub scenarios: Vec<Summary>,
    pub targets: Vec<Target>,
    pub accuracy: AccuracyResults,
    /// Every measured wrk run, by scenario id.
    pub samples: Vec<(String, Vec<Sample>)>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct AccuracyResults {
    pub algorithm: String,
    pub rate_per_s: u64,
    pub burst: u64,
    pub offered_rps: f64,
    pub threads: usize,
    pub lease_max: u64,
    pub lease_ttl: String,
    pub horizon: String,
    pub runs: Vec<PacedRun>,
}

impl AccuracyResults {
    pub fn new(runs: Vec<PacedRun>) -> AccuracyResults {
        AccuracyResults {
            algorithm: "gcra".into(),
            rate_per_s: accuracy::RATE,
            burst: accuracy::BURST,
            offered_rps: accuracy::OFFERED,
            threads: accuracy::THREADS,
            lease_max: accuracy::LEASE_MAX,
            lease_ttl: accuracy::LEASE_TTL.into(),
            horizon: accuracy::HORIZON.into(),
            runs,
        }
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

/// `docs/benchmarks.md`.
pub fn markdown(r: &Results, png_name: Option<&str>) -> String {
    let m = &r.machine;
    let s = &r.settings;
    let mut o = String::new();
    let w = &mut o;
    let _ = writeln!(w, "# Benchmarks\n");
    let how = if r.command == "weir-bench" {
        "`just bench` (`weir-bench` with its default settings)".to_string()
    } else {
        format!("`{}`", r.command)
    };
    let _ = writeln!(
        w,
        "Written by {how} on {} UTC, commit {}, in {:.0} s. Every figure on this page comes \
         from that run; every sample is in [bench/results.json](bench/results.json). Re-running \
         `just bench` regenerates the page, the picture and the JSON.\n",
        r.generated_utc, m.commit, s.wall_s
    );
    let _ = writeln!(w, "## The machine\n");
    let _ = writeln!(w, "| | |\n|---|---|");
    let _ = writeln!(w, "| CPU | {} × {} |", m.cores, m.cpu_model);
    let _ = writeln!(w, "| memory | {} GiB |", m.memory_gib);
    let _ = writeln!(w, "| kernel | {} |", m.kernel);
    let _ = writeln!(w, "| Envoy | {} |", m.envoy);
    let _ = writeln!(w, "| load generator | {} |", m.wrk);
    let _ = writeln!(w, "| Redis | {} |", m.redis);
    let _ = writeln!(w, "| Rust | {} |", m.rustc);
    let _ = writeln!(w);

    let _ = writeln!(w, "## Cost per request\n");
    let _ = writeln!(
        w,
        "One Envoy per scenario, `--concurrency 1`, every thread pinned to core {} (checked: \
         `Cpus_allowed_list` {}); wrk (1 thread, {} keep-alive connections), weir-bridge (release \
         build) and a Redis Cluster of 3 masters + 3 replicas pinned to core {}. All Envoys run \
         the whole time; each scenario is warmed up for {} s, then the {} scenarios are measured \
         in turn, {} s each, for {} rounds, the order rotated every round. Same listener, same \
         route (`direct_response` 200), same requests: `GET {}` with `x-user` cycling over {} \
         users and `x-tenant` over {} tenants.\n",
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
    let _ = writeln!(
        w,
        "Figures are medians over the rounds with (min–max). **Envoy CPU** is utime + stime of \
         the Envoy process (`/proc/PID/stat`) over the measured interval divided by the requests \
         Envoy counted (`http.ingress.downstream_rq_total`). **Bridge calls** are weir's \
         `weir.PLUGIN.bridge.calls`; **Redis commands** are the `INFO commandstats` calls summed over \
         the masters (the commands the Lua scripts run included; *scripts* counts EVALSHA/EVAL \
         alone). Ratios divide the medians.\n"
    );
    let _ = writeln!(
        w,
        "| scenario | requests/s | p50 µs | p99 µs | Envoy CPU µs/request |\n|---|---|---|---|---|"
    );
    for x in &r.scenarios {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} |",
            x.id,
            x.rps.show(0),
            x.p50_us.show(0),
            x.p99_us.show(0),
            x.cpu_us_per_request.show(2)
        );
    }
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "| scenario | CPU vs native | CPU vs empty wasm | CPU − empty wasm µs | req/s vs native | req/s vs empty wasm | bridge calls/request | Redis commands/request, median (of which scripts) | non-2xx % |\n|---|---|---|---|---|---|---|---|---|"
    );
    for x in &r.scenarios {
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} | {} | {} ({}) | {} |",
            x.id,
            ratio(x.cpu_vs_native),
            ratio(x.cpu_vs_empty_wasm),
            x.cpu_over_empty_wasm_us
                .map(|d| format!("{d:+.2}"))
                .unwrap_or_else(|| "–".into()),
            ratio(x.rps_vs_native),
            ratio(x.rps_vs_empty_wasm),
            x.bridge_calls_per_request.show(4),
            num(x.redis_commands_per_request.median, 3),
            num(x.redis_scripts_per_request.median, 3),
            x.non_2xx_pct.show(1)
        );
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "The scenarios:\n");
    for x in &r.scenarios {
        let _ = writeln!(w, "- **{}**: {}.", x.id, x.description);
    }
    let _ = writeln!(w);
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
    let _ = writeln!(
        w,
        "Health of the run: {} failed or skipped bridge calls, {} wrk socket errors or \
         timeouts. A sample in which more than {} % of the Envoy core's busy time was not \
         Envoy's (softirq, processes we cannot see, such as another build) is measured again, \
         up to {} times (at most {} times per run), keeping the least disturbed attempt: {} of \
         {} samples were measured again, and {} kept more than {} % all the same (at most \
         {:.1} %). A slower host (a neighbour on the same physical core) does not show up \
         there, only in the spread between rounds. utime + stime agree with the scheduler's \
         ns clock (`schedstat`, in the JSON) to within {:.1} % in every sample.\n",
        failures,
        socket,
        DISTURBED_PCT,
        RETRIES_PER_SAMPLE,
        RETRIES_PER_RUN,
        retried,
        all.len(),
        disturbed,
        DISTURBED_PCT,
        noisy,
        all.iter()
            .filter(|x| x.runtime_us_per_request > 0.0)
            .map(|x| (x.cpu_us_per_request / x.runtime_us_per_request - 1.0).abs() * 100.0)
            .fold(0.0, f64::max)
    );

    let _ = writeln!(w, "## Accuracy\n");
    let a = &r.accuracy;
    let _ = writeln!(
        w,
        "A GCRA limit of {} requests/s with burst {} (so {} at once, then one every {} ms) on \
         one key, offered {} requests/s (5×) for {} s by a paced load generator \
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
         sent; it is not pinned and not comparable with the cost table's.\n",
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
        20,
        a.horizon
    );
    let _ = writeln!(
        w,
        "| mode | sent req/s | × limit | admitted | exact bound | over | under | conformance | bridge calls/request | Envoy CPU µs/request | Redis granted (unused) | p50 / p99 ms | other statuses |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for x in &a.runs {
        let global = x.mode.is_global();
        let bounded = x.mode != Mode::GlobalIdleThenBurst;
        let pct = |v: f64| {
            if bounded {
                format!("{v:.2} %")
            } else {
                "–".into()
            }
        };
        let _ = writeln!(
            w,
            "| {} | {} | {:.0}× | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} |",
            x.mode.title(),
            num(x.sent_rps, 0),
            x.multiple,
            num(x.admitted as f64, 0),
            if bounded {
                num(x.exact_bound, 0)
            } else {
                "–".into()
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
                "–".into()
            },
            num(x.envoy_cpu_us_per_request, 1),
            if global {
                format!(
                    "{} ({})",
                    num(x.redis_granted as f64, 0),
                    num(x.redis_granted.saturating_sub(x.admitted) as f64, 0)
                )
            } else {
                "–".into()
            },
            num(x.p50_ms, 2),
            num(x.p99_ms, 2),
            x.failed
        );
    }
    let _ = writeln!(w);
    for x in a.runs.iter().filter(|x| x.violation.is_some()) {
        let _ = writeln!(
            w,
            "- **{}**: {}",
            x.mode.label(),
            x.violation.as_deref().unwrap_or_default()
        );
    }
    for x in a.runs.iter().filter(|x| x.mode.is_global()) {
        let get = |k: &str| x.rule_stats.get(k).copied().unwrap_or(0);
        let _ = writeln!(
            w,
            "- {}: of {} requests, {} were decided by Redis through the bridge, {} from units \
             held (leases and reservations, allowed or not yet due), {} from a cached denial.",
            x.mode.label(),
            num(x.sent as f64, 0),
            num(get("bridge_decisions") as f64, 0),
            num(get("lease_hits") as f64, 0),
            num(get("denial_cache_hits") as f64, 0)
        );
    }
    let _ = writeln!(w);
    if let Some(png) = png_name {
        let _ = writeln!(
            w,
            "![Admitted requests per second against the limit, one line per mode]({png})\n"
        );
    }
    let _ = writeln!(
        w,
        "Admitted per second, by the second in which each request was sent (the first second \
         includes the burst):\n"
    );
    let n = a.runs.iter().map(|x| x.seconds).max().unwrap_or(0);
    let _ = write!(w, "| second |");
    for x in &a.runs {
        let _ = write!(w, " {} |", x.mode.label());
    }
    let _ = writeln!(w);
    let _ = writeln!(w, "|---|{}", "---|".repeat(a.runs.len()));
    for i in 0..n as usize {
        let _ = write!(w, "| {} |", i + 1);
        for x in &a.runs {
            let v = x.admitted_per_second.get(i).copied().unwrap_or(0);
            let _ = write!(w, " {} |", num(v as f64, 0));
        }
        let _ = writeln!(w);
    }
    let _ = writeln!(w);

    let _ = writeln!(
        w,
        "CPU used during each accuracy run, in % of one core (the machine has {}), and the \
         schedule: the slowest client thread fell at most this far behind.\n",
        m.cores
    );
    let _ = writeln!(
        w,
        "| mode | Envoys | weir-bridge | Redis (6 nodes) | load generator | max lag ms |\n|---|---|---|---|---|---|"
    );
    for x in &a.runs {
        let c = |k: &str| {
            x.cpu_pct
                .get(k)
                .map(|v| format!("{v:.0} %"))
                .unwrap_or_else(|| "–".into())
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {} | {} | {} |",
            x.mode.label(),
            c("envoys"),
            c("bridge"),
            c("redis"),
            c("generator"),
            num(x.max_lag_ms, 1)
        );
    }
    let _ = writeln!(w);

    let _ = writeln!(w, "## Targets (issues 4 and 10)\n");
    let _ = writeln!(w, "| target | this run | |\n|---|---|---|");
    for t in &r.targets {
        let _ = writeln!(w, "| {} | {} | {} |", t.target, t.measured, met(t.met));
    }
    let _ = writeln!(w);

    let _ = writeln!(w, "## Running it\n");
    let _ = writeln!(
        w,
        "`just bench` builds `weir.wasm`, the empty filter and `weir-bridge --release`, runs \
         `weir-bench` (about 5 minutes) and rewrites this page, `docs/bench/results.json` and \
         the picture (drawn by `bench/plot.py`; matplotlib is installed into `.tools/venv` when \
         missing). `just bench-smoke` runs every part for a second or two into a temp dir and \
         only checks that numbers came out (CI runs it; it asserts no performance). \
         `weir-bench --help` lists the settings (`--rounds`, `--duration`, `--warmup`, \
         `--connections`, `--accuracy-secs`, `--out`, `--only`, `--no-accuracy`, `--no-plot`); \
         `--only` also takes two diagnostic scenarios that split weir's cost, `weir-no-match` \
         (one rule whose match never holds) and `weir-unkeyed` (one rule without a key).\n"
    );

    let _ = writeln!(w, "## What limits these figures\n");
    let _ = writeln!(
        w,
        "- **Host calls.** A proxy-wasm filter pays for every call into Envoy, and more for \
         those that return data (Envoy calls back into the VM to allocate the copy). A local \
         decision kept in shared data needs at least four: the clock, the key's header, the \
         shared-data get and the CAS set. The `host-call-floor` scenario makes exactly weir-local's \
         four calls from the empty filter and nothing else: what it costs over the empty filter \
         is the price of the design in this Envoy, before any rate-limiting code runs \
         (the targets table splits weir's figures this way). weir makes no other host call \
         on an allowed request: its counters are kept in the VM and handed to Envoy every \
         100 ms, and its headers are only added on denials unless `headers_on_allowed` is set.");
    let _ = writeln!(
        w,
        "- **{} vCPUs for everything.** In the cost runs Envoy has core {} to itself, but wrk, \
         weir-bridge and all six Redis nodes share core {}: requests/s and latency are those of \
         that pair of cores, and in the global scenarios the load core also runs the bridge and \
         Redis, so their requests/s fall for reasons that are not Envoy's. CPU µs per request \
         is the figure to compare across scenarios; requests/s and latency are closed-loop \
         figures of this setup.\n\
         - **Loopback.** No network: a bridge call costs a loopback round trip and Redis runs on \
         the same machine; a real network adds latency to exact global decisions, not CPU.\n\
         - **A virtual machine with neighbours.** These are vCPUs; other engineers' builds may \
         run during a run. That is why the scenarios are interleaved and repeated and the \
         tables give min–max; the JSON has every sample, with the share of the Envoy core that \
         was not Envoy's in each.\n\
         - **Clock-tick resolution.** `/proc` CPU times count {} ticks per second; over a \
         {} s run that is well under 1 % of the figure.\n\
         - **One worker.** Envoy runs one worker in the cost runs; with more workers, weir's \
         shared-data CAS can contend (the accuracy run's local mode has 4 workers).\n\
         - **The accuracy run** is not pinned: two Envoys with 2 workers each, the bridge, Redis \
         and the load generator all share the two cores, so answers can be late; the paced \
         generator catches up after a late answer (the slowest thread fell at most {} ms \
         behind schedule), and the processes used up to {} % of the {} % the machine has: at \
         5,000 requests/s the global modes run the machine near its limit, which is what the \
         answer times (p50 / p99) show.",
        m.cores,
        s.envoy_core,
        s.load_core,
        crate::sys::clock_ticks(),
        s.duration_s,
        num(a.runs.iter().map(|x| x.max_lag_ms).fold(0.0, f64::max), 1),
        num(
            a.runs
                .iter()
                .filter(|x| x.mode.is_global())
                .map(|x| x.cpu_pct.values().sum::<f64>())
                .fold(0.0, f64::max),
            0
        ),
        m.cores * 100
    );
    o
}

/// Today's date and time in UTC, `YYYY-MM-DD HH:MM`, from the system clock.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mth = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mth <= 2);
    format!(
        "{y:04}-{mth:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        (rem % 3600) / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max() {
        let s = Stat::of([3.0, 1.0, 2.0]);
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = Stat::of([4.0, 1.0, 2.0, 3.0]);
        assert_eq!(s.median, 2.5);
        assert_eq!(Stat::of([]).median, 0.0);
        assert_eq!(Stat::of([5.0]).show(1), "5.0");
        assert_eq!(Stat::of([1.0, 2.0, 3.0]).show(0), "2 (1–3)");
        assert_eq!(Stat::of([4.0, 4.0001]).show(2), "4.00");
    }

    #[test]
    fn numbers_group_thousands() {
        assert_eq!(num(1234567.891, 1), "1,234,567.9");
        assert_eq!(num(999.0, 0), "999");
        assert_eq!(num(-1234.5, 1), "-1,234.5");
        assert_eq!(num(0.0123, 4), "0.0123");
    }
}
