//! The accuracy runs' drivers ([`crate::accuracy`] is the paced generator and its
//! report): the Envoys of each mode, the global ones again behind a slow bridge, each run
//! measured and judged by the conformance checker.

use std::path::Path;
use std::thread;
use std::time::Duration;

use weir_e2e::slow_proxy::SlowProxy;
use weir_e2e::{
    bridge_cluster_yaml, decisions, wasm_filter_yaml, Bootstrap, Bridge, Envoy, RedisCluster,
    Request,
};

use crate::accuracy::{self, Mode, PacedRun};
use crate::scenario::Wasm;
use crate::{cost, log, start_envoys, sys, Opts};

/// A weir stat summed over `envoys`.
fn weir_stat(envoys: &[&Envoy], name: &str) -> u64 {
    envoys.iter().map(|e| e.weir_stat(name)).sum()
}

/// weir's counters of rule `rule` (`wasmcustom.weir.weir.rule.RULE.*`: the harness names
/// the plugin `weir`), summed over `envoys`.
pub(crate) fn rule_stats(envoys: &[&Envoy], rule: &str) -> std::collections::BTreeMap<String, u64> {
    let prefix = format!("wasmcustom.weir.weir.rule.{rule}.");
    // weir sends its counters every 100 ms.
    std::thread::sleep(weir_e2e::envoy::WEIR_STATS_LAG);
    let mut out = std::collections::BTreeMap::new();
    for e in envoys {
        for (name, v) in e.stats() {
            if let Some(short) = name.strip_prefix(&prefix) {
                if !short.starts_with("slots_") {
                    *out.entry(short.to_string()).or_insert(0) += v;
                }
            }
        }
    }
    out
}

pub(crate) fn run_accuracy(
    opts: &Opts,
    wasm: &Wasm,
    bridge: &Bridge,
    redis: &RedisCluster,
    masters: &[u16],
    work: &Path,
) -> Vec<PacedRun> {
    // Nothing is pinned here: four Envoy workers, the bridge, Redis and the generator
    // share both cores.
    let all: Vec<usize> = (0..sys::cores()).collect();
    sys::pin_self(&all);
    sys::pin_process(bridge.pid(), &all);
    for n in redis.nodes() {
        sys::pin_process(n.pid(), &all);
    }
    let nonce = std::process::id();
    let probes = Probes {
        bridge,
        redis,
        masters,
    };
    let fleet = AccuracyFleet::start(wasm, bridge, work);
    fleet.warm_up();
    let mut runs: Vec<PacedRun> = Mode::ALL
        .iter()
        .enumerate()
        .map(|(i, &mode)| {
            let key = format!("key-{nonce}-{i}");
            measure_mode(opts, &fleet.of(mode), &probes, mode, &key)
        })
        .collect();
    // The slowed runs' Envoys replace these: two cores hold one fleet at a time.
    drop(fleet);
    runs.extend(run_slowed_accuracy(opts, wasm, &probes, work));
    runs
}

/// The [`accuracy::SLOWED`] modes again, once per [`Opts::slow_bridge_ms`], each delay
/// on two fresh global Envoys that reach the bridge through a delaying proxy.
fn run_slowed_accuracy(
    opts: &Opts,
    wasm: &Wasm,
    probes: &Probes<'_>,
    work: &Path,
) -> Vec<PacedRun> {
    let nonce = std::process::id();
    let mut runs = Vec::new();
    for &ms in opts.slow_bridge_ms() {
        let slowed = SlowedGlobals::start(wasm, probes.bridge, ms, work);
        for (i, mode) in accuracy::SLOWED.into_iter().enumerate() {
            let key = format!("key-{nonce}-slow{ms}-{i}");
            runs.push(measure_mode(opts, &slowed.serving(), probes, mode, &key));
        }
    }
    runs
}

/// The bootstrap of global Envoy `i` of `logs`: the global rules, the bridge cluster at
/// `bridge_port`.
fn global_bootstrap(logs: &decisions::Logs, i: usize, wasm: &Wasm, bridge_port: u16) -> Bootstrap {
    logs.add_to(
        i,
        Bootstrap::new()
            .http_filter(wasm_filter_yaml(&accuracy::global_config(), &wasm.weir))
            .cluster(bridge_cluster_yaml(bridge_port)),
    )
}

/// Opens the bridge connections and the VMs' paths of `modes` on a key of their own.
fn warm_up_accuracy<'a>(envoys: impl Iterator<Item = &'a Envoy>, modes: &[Mode]) {
    for e in envoys {
        for &mode in modes {
            for _ in 0..4 {
                let _ = weir_e2e::send(
                    e.http_port,
                    Request::get(mode.path()).header("x-key", "warm-up"),
                );
            }
        }
    }
}

/// The Envoys of the accuracy run — two global ones with 2 workers each, a local one with
/// 4 — and the access logs in which each writes every decision, for the conformance check.
struct AccuracyFleet {
    globals: Vec<Envoy>,
    local: Envoy,
    global_logs: decisions::Logs,
    local_log: decisions::Logs,
}

impl AccuracyFleet {
    fn start(wasm: &Wasm, bridge: &Bridge, work: &Path) -> AccuracyFleet {
        log("accuracy: starting 2 Envoys × 2 workers (global) and 1 Envoy × 4 workers (local)");
        let global_logs = decisions::Logs::new(&work.join("acc-global"), 2, "x-key");
        let local_log = decisions::Logs::new(&work.join("acc-local"), 1, "x-key");
        let global = |i| global_bootstrap(&global_logs, i, wasm, bridge.port);
        let local = local_log.add_to(
            0,
            Bootstrap::new().http_filter(wasm_filter_yaml(&accuracy::local_config(), &wasm.weir)),
        );
        let mut envoys = start_envoys(vec![(global(0), 2), (global(1), 2), (local, 4)]);
        let local = envoys.pop().unwrap_or_else(|| unreachable!());
        AccuracyFleet {
            globals: envoys,
            local,
            global_logs,
            local_log,
        }
    }

    fn warm_up(&self) {
        warm_up_accuracy(
            self.globals.iter().chain(std::iter::once(&self.local)),
            &Mode::ALL,
        );
    }

    /// The Envoys, access logs and plugin config that serve `mode`.
    fn of(&self, mode: Mode) -> Served<'_> {
        if mode.is_global() {
            Served {
                envoys: self.globals.iter().collect(),
                logs: &self.global_logs,
                config: accuracy::global_config(),
                bridge_delay_ms: 0,
            }
        } else {
            Served {
                envoys: vec![&self.local],
                logs: &self.local_log,
                config: accuracy::local_config(),
                bridge_delay_ms: 0,
            }
        }
    }
}

/// Two global Envoys (2 workers each) whose bridge cluster points at a delaying proxy in
/// front of the bridge, and their access logs. Fields drop in order: the Envoys go before
/// the proxy they call through.
struct SlowedGlobals {
    envoys: Vec<Envoy>,
    logs: decisions::Logs,
    proxy: SlowProxy,
}

impl SlowedGlobals {
    fn start(wasm: &Wasm, bridge: &Bridge, ms: u64, work: &Path) -> SlowedGlobals {
        let proxy = SlowProxy::start(bridge.port, Duration::from_millis(ms));
        log(format!(
            "accuracy: starting 2 Envoys × 2 workers (global) calling the bridge through a \
             proxy that adds {ms} ms to every round trip"
        ));
        let logs = decisions::Logs::new(&work.join(format!("acc-global-slow{ms}")), 2, "x-key");
        let envoys = start_envoys(
            (0..2)
                .map(|i| (global_bootstrap(&logs, i, wasm, proxy.port), 2))
                .collect(),
        );
        warm_up_accuracy(envoys.iter(), &accuracy::SLOWED);
        SlowedGlobals {
            envoys,
            logs,
            proxy,
        }
    }

    fn serving(&self) -> Served<'_> {
        Served {
            envoys: self.envoys.iter().collect(),
            logs: &self.logs,
            config: accuracy::global_config(),
            bridge_delay_ms: self.proxy.delay.as_millis() as u64,
        }
    }
}

/// The Envoys that serve a mode, the access logs in which they write every decision, their
/// plugin config, and what a delaying proxy adds to their bridge round trips (ms, 0: none).
struct Served<'a> {
    envoys: Vec<&'a Envoy>,
    logs: &'a decisions::Logs,
    config: String,
    bridge_delay_ms: u64,
}

/// What the accuracy run reads besides the Envoys.
struct Probes<'a> {
    bridge: &'a Bridge,
    redis: &'a RedisCluster,
    masters: &'a [u16],
}

/// Runs one mode on key `key` and fills in what the Envoys, the bridge, Redis and the
/// conformance checker say of it; logs it, then pauses so that leases and late answers
/// settle before the next mode.
fn measure_mode(
    opts: &Opts,
    served: &Served<'_>,
    probes: &Probes<'_>,
    mode: Mode,
    key: &str,
) -> PacedRun {
    let rule = &mode.rule();
    let envoys = &served.envoys;
    let ports: Vec<u16> = envoys.iter().map(|e| e.http_port).collect();
    let rule0 = rule_stats(envoys, rule);
    // A local mode's plugin has no `bridge`, so no `bridge.*` stats to read.
    let calls0 = if mode.is_global() {
        weir_stat(envoys, "bridge.calls")
    } else {
        0
    };
    let scripts0 = cost::redis_commands(probes.masters).1;
    let granted = || {
        probes
            .bridge
            .metric_sum("weir_bridge_units_granted_total", &[("rule", rule)])
    };
    let granted0 = granted();
    let groups: Vec<(&str, Vec<u32>)> = vec![
        ("envoys", envoys.iter().map(|e| e.pid()).collect()),
        ("bridge", vec![probes.bridge.pid()]),
        (
            "redis",
            probes.redis.nodes().iter().map(|n| n.pid()).collect(),
        ),
        ("generator", vec![std::process::id()]),
    ];
    log(format!(
        "accuracy: {} for {} s",
        accuracy::with_bridge_delay(mode.title(), served.bridge_delay_ms),
        opts.accuracy_secs
    ));
    let mut run = accuracy::paced_with_cpu(mode, &ports, opts.accuracy_secs, key, &groups);
    run.bridge_delay_ms = served.bridge_delay_ms;
    // Let leases expire and late answers land before reading the counters.
    thread::sleep(Duration::from_millis(300));
    run.rule_stats = rule_stats(envoys, rule)
        .into_iter()
        .map(|(k, v)| {
            let before = rule0.get(&k).copied().unwrap_or(0);
            (k, v.saturating_sub(before))
        })
        .collect();
    let (checked, violation) = check_conformance(served.logs, &served.config, rule, key, run.sent);
    run.checked_admissions = checked;
    run.violation = violation;
    if mode.is_global() {
        run.bridge_calls = weir_stat(envoys, "bridge.calls").saturating_sub(calls0);
        run.redis_scripts = cost::redis_commands(probes.masters)
            .1
            .saturating_sub(scripts0);
        run.redis_granted = (granted() - granted0).max(0.0) as u64;
    }
    log_accuracy_run(&run);
    thread::sleep(Duration::from_millis(700));
    run
}

fn log_accuracy_run(run: &PacedRun) {
    let label = run.label();
    log(format!(
        "accuracy: {label}: sent {:.0}/s, admitted {} of bound {:.0} (over {:.2} %, under {:.2} %), {} bridge calls, Redis granted {}, max lag {:.1} ms",
        run.sent_rps,
        run.admitted,
        run.exact_bound,
        run.over_pct,
        run.under_pct,
        run.bridge_calls,
        run.redis_granted,
        run.max_lag_ms
    ));
    log(format!(
        "accuracy: {label}: {} admissions checked: {}; Envoy CPU {:.1} µs per request",
        run.checked_admissions,
        run.violation.as_deref().unwrap_or("conformant"),
        run.envoy_cpu_us_per_request
    ));
    log(format!(
        "accuracy: {label}: weir counters {:?}; CPU % of a core {:?}",
        run.rule_stats, run.cpu_pct
    ));
}

/// Judges the admissions of `rule` for `key` in `logs` (every Envoy of the run) with the
/// core's conformance checker, once the `sent` requests of the run are logged. Returns how
/// many admissions it judged and the violation, if any.
fn check_conformance(
    logs: &decisions::Logs,
    config: &str,
    rule: &str,
    key: &str,
    sent: u64,
) -> (u64, Option<String>) {
    let of_key = |logs: &[Vec<decisions::Logged>]| {
        logs.iter().flatten().filter(|l| l.key == key).count() as u64
    };
    let logged = logs.read_until(|l| of_key(l) >= sent);
    let refs: Vec<&[decisions::Logged]> = logged.iter().map(Vec::as_slice).collect();
    let judge = decisions::Judge::configured(config, rule);
    let admissions = judge
        .admissions(&refs)
        .per_key
        .remove(key)
        .unwrap_or_default();
    let violation = weir_core::conformance::check(&judge.limit, &admissions)
        .err()
        .map(|v| format!("{v:?}"));
    (admissions.len() as u64, violation)
}
