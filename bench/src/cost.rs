//! Cost per request: every scenario's Envoy (1 worker, pinned to the Envoy core) runs at
//! once; wrk drives them in turn, interleaved and repeated, and each run is measured
//! from `/proc`, Envoy's stats and Redis `INFO commandstats`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use weir_core::filter::host::CallKind;
use weir_e2e::slow_proxy::SlowProxy;
use weir_e2e::{parse_stats, redis_cli_at, Bridge, Envoy};

use crate::peers::PeerBackends;
use crate::scenario::{Scenario, Wasm};
use crate::sys::{self, ENVOY_CORE, LOAD_CORE};
use crate::wrk::{self, WrkReport};
use crate::{log, start_envoys, Opts};

/// One measured wrk run of one scenario.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    pub round: usize,
    /// Position of the scenario in its round (the order rotates every round).
    pub position: usize,
    pub wrk: WrkReport,
    /// Requests Envoy counted (`http.ingress.downstream_rq_total`) over the interval.
    pub requests: u64,
    /// utime + stime of the Envoy process over the interval.
    pub envoy_cpu_us: u64,
    /// utime + stime of weir-bridge over the interval (0 when the run has none).
    #[serde(default)]
    pub bridge_cpu_us: u64,
    /// utime + stime of the Redis Cluster's nodes and the peers' standalone Redis over the
    /// interval, summed (0 when the run has none).
    #[serde(default)]
    pub redis_cpu_us: u64,
    /// utime + stime of the peers' rate limit services over the interval, summed (0 when
    /// the run has none).
    #[serde(default)]
    pub rls_cpu_us: u64,
    pub interval_us: u64,
    pub cpu_us_per_request: f64,
    /// The same from the scheduler's ns run time (`schedstat`), as a cross-check.
    pub runtime_us_per_request: f64,
    pub bridge_calls: u64,
    /// Calls weir's VMs made into Envoy (`vm.host_calls`; 0 for the other filters).
    #[serde(default)]
    pub host_calls: u64,
    /// Callbacks Envoy made into weir's VMs (`vm.entries`; 0 for the other filters).
    #[serde(default)]
    pub vm_entries: u64,
    /// weir's calls into Envoy by kind (`vm.calls.<kind>`).
    #[serde(default)]
    pub vm_calls: BTreeMap<String, u64>,
    /// Bytes copied across weir's VM boundary, both ways (`vm.bytes_in` + `vm.bytes_out`).
    #[serde(default)]
    pub vm_bytes: u64,
    /// Bridge calls that failed, and requests that skipped the bridge after a failure.
    pub bridge_failures: u64,
    /// Every command on the Redis masters (commands run by scripts included).
    pub redis_commands: u64,
    /// EVALSHA/EVAL calls on the Redis masters: one per global decision.
    pub redis_scripts: u64,
    /// Busy time of the Envoy core that was not Envoy's (softirq, other processes), % of
    /// the interval: high values mean the run was disturbed.
    pub envoy_core_other_pct: f64,
    /// Disturbed measurements of this sample that were thrown away and run again.
    pub retries: u32,
}

impl Sample {
    pub fn per_request(&self, n: u64) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            n as f64 / self.requests as f64
        }
    }

    pub fn limited_fraction(&self) -> f64 {
        if self.wrk.requests == 0 {
            0.0
        } else {
            self.wrk.status_errors as f64 / self.wrk.requests as f64
        }
    }
}

/// The processes a scenario's requests may cost CPU in beyond Envoy: weir-bridge, the
/// Redis Cluster's nodes (none when the run starts no bridge), the peers' rate limit
/// services and their standalone Redis (none without the peers). They serve every scenario,
/// one scenario at a time: what they use over a sample's interval is that scenario's (and
/// their idle work: the no-filter scenario shows it).
#[derive(Clone, Debug, Default)]
pub struct Services {
    /// weir-bridge over the Redis Cluster, and the one over the standalone Redis.
    pub bridges: Vec<u32>,
    pub redis: Vec<u32>,
    /// The peers' rate limit services (limitador-rls).
    pub rls: Vec<u32>,
}

impl Services {
    /// (weir-bridge, Redis, rate limit services) CPU time so far, µs.
    fn cpu_us(&self) -> (u64, u64, u64) {
        let sum = |pids: &[u32]| pids.iter().map(|&pid| sys::process_cpu_us(pid)).sum();
        (sum(&self.bridges), sum(&self.redis), sum(&self.rls))
    }
}

/// One Envoy per scenario, all pinned to the Envoy core.
pub struct Fleet {
    pub envoys: Vec<(Scenario, Envoy)>,
}

impl Fleet {
    pub fn envoy(&self, s: Scenario) -> &Envoy {
        self.envoys
            .iter()
            .find(|(x, _)| *x == s)
            .map(|(_, e)| e)
            .unwrap_or_else(|| panic!("no Envoy for {}", s.id()))
    }
}

/// Counters read from one Envoy.
#[derive(Clone, Debug, Default)]
struct EnvoyCounters {
    requests: u64,
    bridge_calls: u64,
    host_calls: u64,
    vm_entries: u64,
    vm_calls: BTreeMap<String, u64>,
    vm_bytes: u64,
    bridge_failures: u64,
    /// Envoy's own counts of the bridge cluster's calls: all, and those answered 2xx.
    cluster_calls: u64,
    cluster_calls_2xx: u64,
}

fn envoy_counters(envoy: &Envoy) -> EnvoyCounters {
    let r = envoy.admin(
        "GET",
        // ^(http\.ingress\.downstream_rq_total|wasmcustom\.weir\.weir\.(bridge|vm)\..*
        //   |cluster\.weir_bridge\.upstream_rq_(total|2xx))$
        "/stats?filter=%5E%28http%5C.ingress%5C.downstream_rq_total%7Cwasmcustom%5C.weir%5C.weir%5C.%28bridge%7Cvm%29%5C..%2A%7Ccluster%5C.weir_bridge%5C.upstream_rq_%28total%7C2xx%29%29%24",
    );
    let stats = parse_stats(&r.text());
    let get = |name: &str| stats.get(name).copied().unwrap_or(0);
    EnvoyCounters {
        requests: get("http.ingress.downstream_rq_total"),
        // The harness names the plugin `weir` (weir_e2e::wasm_filter_yaml).
        bridge_calls: get("wasmcustom.weir.weir.bridge.calls"),
        host_calls: get("wasmcustom.weir.weir.vm.host_calls"),
        vm_entries: get("wasmcustom.weir.weir.vm.entries"),
        vm_calls: CallKind::ALL
            .iter()
            .map(|k| {
                let name = k.stat_name();
                (
                    name.to_string(),
                    get(&format!("wasmcustom.weir.weir.vm.calls.{name}")),
                )
            })
            .collect(),
        vm_bytes: get("wasmcustom.weir.weir.vm.bytes_in")
            + get("wasmcustom.weir.weir.vm.bytes_out"),
        bridge_failures: get("wasmcustom.weir.weir.bridge.skipped")
            + get("wasmcustom.weir.weir.bridge.refused")
            + get("wasmcustom.weir.weir.bridge.errors_timeout")
            + get("wasmcustom.weir.weir.bridge.errors_unavailable")
            + get("wasmcustom.weir.weir.bridge.errors_status")
            + get("wasmcustom.weir.weir.bridge.errors_bad_body"),
        cluster_calls: get("cluster.weir_bridge.upstream_rq_total"),
        cluster_calls_2xx: get("cluster.weir_bridge.upstream_rq_2xx"),
    }
}

/// Redis commands so far, summed over `masters` (ports): (all but our own INFO, scripts).
pub fn redis_commands(masters: &[u16]) -> (u64, u64) {
    let mut all = 0;
    let mut scripts = 0;
    for &port in masters {
        let text = redis_cli_at(port, ["INFO", "commandstats"])
            .unwrap_or_else(|e| panic!("INFO commandstats on port {port}: {e}"));
        for line in text.lines() {
            let Some((name, rest)) = line.trim().split_once(':') else {
                continue;
            };
            let Some(cmd) = name.strip_prefix("cmdstat_") else {
                continue;
            };
            let calls: u64 = rest
                .split(',')
                .find_map(|kv| kv.strip_prefix("calls="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if cmd == "info" {
                continue;
            }
            all += calls;
            if matches!(cmd, "evalsha" | "eval" | "evalsha_ro" | "eval_ro" | "fcall") {
                scripts += calls;
            }
        }
    }
    (all, scripts)
}

/// Drives `scenario` with wrk for `duration` and measures it. Envoy's counters are read
/// before its CPU time at the start and after it at the end, so the admin requests stay
/// outside the measured interval.
#[allow(clippy::too_many_arguments)]
pub fn measure(
    fleet: &Fleet,
    scenario: Scenario,
    script: &std::path::Path,
    connections: u32,
    duration: Duration,
    (masters, services): (&[u16], &Services),
    round: usize,
    position: usize,
    attempt: usize,
) -> Sample {
    let envoy = fleet.envoy(scenario);
    let pid = envoy.pid();
    let (r0_all, r0_scripts) = redis_commands(masters);
    let c0 = envoy_counters(envoy);
    let core0 = sys::core_time(ENVOY_CORE);
    let services0 = services.cpu_us();
    let cpu0 = sys::process_cpu_us(pid);
    let run0 = sys::process_runtime_us(pid);
    let t0 = Instant::now();
    // New users must be new in every attempt: a sample measured again with the users of
    // the first attempt would find them limited already.
    let nonce = format!("r{round}a{attempt}");
    let wrk = wrk::run(
        script,
        envoy.http_port,
        connections,
        duration,
        scenario.traffic(),
        &nonce,
    );
    let run1 = sys::process_runtime_us(pid);
    let cpu1 = sys::process_cpu_us(pid);
    let services1 = services.cpu_us();
    let interval_us = t0.elapsed().as_micros() as u64;
    let core1 = sys::core_time(ENVOY_CORE);
    // weir hands its counters to Envoy every 100 ms: wait for the last increments before
    // reading them (Envoy's own request counter does not lag; nothing is sent meanwhile).
    std::thread::sleep(weir_e2e::WEIR_STATS_LAG);
    let c1 = envoy_counters(envoy);
    let (r1_all, r1_scripts) = redis_commands(masters);
    let envoy_cpu_us = cpu1.saturating_sub(cpu0);
    let core_busy = core1.busy_us.saturating_sub(core0.busy_us);
    let core_total = core1.total_us.saturating_sub(core0.total_us).max(1);
    let requests = c1.requests.saturating_sub(c0.requests);
    let (mut bridge_calls, mut bridge_failures) = (
        c1.bridge_calls.saturating_sub(c0.bridge_calls),
        c1.bridge_failures.saturating_sub(c0.bridge_failures),
    );
    if scenario.is_bridge_call_floor() {
        // The empty filter keeps no stats: Envoy's cluster counts its calls, those
        // answered 2xx as calls, the others as failures.
        let all = c1.cluster_calls.saturating_sub(c0.cluster_calls);
        bridge_calls = c1.cluster_calls_2xx.saturating_sub(c0.cluster_calls_2xx);
        bridge_failures = all.saturating_sub(bridge_calls);
    }
    let per_request = |us: u64| {
        if requests == 0 {
            0.0
        } else {
            us as f64 / requests as f64
        }
    };
    Sample {
        round,
        position,
        wrk,
        requests,
        envoy_cpu_us,
        bridge_cpu_us: services1.0.saturating_sub(services0.0),
        redis_cpu_us: services1.1.saturating_sub(services0.1),
        rls_cpu_us: services1.2.saturating_sub(services0.2),
        interval_us,
        cpu_us_per_request: per_request(envoy_cpu_us),
        runtime_us_per_request: per_request(run1.saturating_sub(run0)),
        bridge_calls,
        host_calls: c1.host_calls.saturating_sub(c0.host_calls),
        vm_entries: c1.vm_entries.saturating_sub(c0.vm_entries),
        vm_calls: c1
            .vm_calls
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.saturating_sub(c0.vm_calls.get(k).copied().unwrap_or(0)),
                )
            })
            .collect(),
        vm_bytes: c1.vm_bytes.saturating_sub(c0.vm_bytes),
        bridge_failures,
        redis_commands: r1_all.saturating_sub(r0_all),
        redis_scripts: r1_scripts.saturating_sub(r0_scripts),
        envoy_core_other_pct: core_busy.saturating_sub(envoy_cpu_us) as f64 * 100.0
            / core_total as f64,
        retries: 0,
    }
}

/// A sample in which more than this share of the Envoy core went to something else
/// (another engineer's build, say) is disturbed: it is measured again.
pub const DISTURBED_PCT: f64 = 5.0;
/// Re-measurements per sample, and per run (keeps the run bounded in time).
pub const RETRIES_PER_SAMPLE: u32 = 2;
pub const RETRIES_PER_RUN: u32 = 12;

/// The order of the scenarios in round `round`: the list rotated by the round number, so
/// no scenario is always first (or always right after a heavy one).
pub fn round_order(scenarios: &[Scenario], round: usize) -> Vec<Scenario> {
    let n = scenarios.len();
    (0..n).map(|i| scenarios[(i + round) % n]).collect()
}

/// Samples per scenario, in the order of [`Scenario::ALL`].
pub type Samples = BTreeMap<Scenario, Vec<Sample>>;

// The cost run's driver: its Envoys and their fleet, the warm-up, each sample.

pub(crate) fn run_cost(
    opts: &Opts,
    scenarios: &[Scenario],
    wasm: &Wasm,
    bridge: &Option<Bridge>,
    peers: PeerBackends<'_>,
    script: &Path,
    backends: (&[u16], &Services),
) -> (Samples, Vec<String>) {
    // The proxies outlive the samples: the slowed scenarios' Envoys reach the bridge
    // through them.
    let (fleet, _proxies, allowed) = start_cost_fleet(scenarios, wasm, bridge, peers);
    warm_up(opts, &fleet, scenarios, script);
    let mut samples = Samples::new();
    // A smoke run asserts no figure, so a disturbed sample is not measured again.
    let mut retries_left = if opts.smoke { 0 } else { RETRIES_PER_RUN };
    for round in 0..opts.rounds {
        for (position, s) in round_order(scenarios, round).into_iter().enumerate() {
            let at = SamplePlace {
                round,
                position,
                scenario: s,
            };
            let sample = measure_sample(opts, &fleet, script, backends, at, &mut retries_left);
            samples.entry(s).or_default().push(sample);
        }
    }
    (samples, allowed)
}

/// One Envoy per scenario (1 worker), every one pinned to the Envoy core; returns the
/// fleet, the delaying proxies of the slowed scenarios, and the CPU lists the Envoys were
/// checked to run on.
fn start_cost_fleet(
    scenarios: &[Scenario],
    wasm: &Wasm,
    bridge: &Option<Bridge>,
    peers: PeerBackends<'_>,
) -> (Fleet, Vec<SlowProxy>, Vec<String>) {
    let bridge_port = bridge.as_ref().map(|b| b.port);
    let proxies = slow_proxies(scenarios.iter().filter_map(|s| s.slowed()), bridge);
    // A slowed scenario's Envoy reaches the bridge through the proxy of its delay.
    // A single-Redis scenario's Envoy reaches the bridge over the standalone Redis.
    let port_of = |s: &Scenario| match (s.slowed(), s.single_redis()) {
        (Some((_, delay)), _) => proxies.iter().find(|p| p.delay == delay).map(|p| p.port),
        (None, Some(_)) => peers.single_redis_bridge,
        (None, None) => bridge_port,
    };
    log(format!(
        "starting {} Envoys (1 worker each)",
        scenarios.len()
    ));
    let envoys = start_envoys(
        scenarios
            .iter()
            .map(|s| (s.bootstrap(wasm, port_of(s), peers.rls), 1))
            .collect(),
    );
    let fleet = Fleet {
        envoys: scenarios.iter().copied().zip(envoys).collect(),
    };
    let mut allowed = Vec::new();
    for (_, e) in &fleet.envoys {
        sys::pin_process(e.pid(), &[ENVOY_CORE]);
        let a = sys::allowed_cpus(e.pid());
        if !allowed.contains(&a) {
            allowed.push(a);
        }
    }
    if let Some(b) = bridge {
        log(format!(
            "pinned: Envoys to CPU {}, wrk/bridge/Redis to {} (bridge allows {})",
            allowed.join(";"),
            LOAD_CORE,
            sys::allowed_cpus(b.pid())
        ));
    }
    (fleet, proxies, allowed)
}

/// One delaying proxy in front of the bridge per distinct delay of `slowed` (none
/// without a bridge: no global scenario runs then).
fn slow_proxies(
    slowed: impl Iterator<Item = (Scenario, Duration)>,
    bridge: &Option<Bridge>,
) -> Vec<SlowProxy> {
    let Some(bridge) = bridge else {
        return Vec::new();
    };
    let mut delays: Vec<Duration> = slowed.map(|(_, d)| d).collect();
    delays.sort();
    delays.dedup();
    delays
        .into_iter()
        .map(|d| {
            let p = SlowProxy::start(bridge.port, d);
            log(format!(
                "a delaying proxy on port {} adds {} ms to every bridge round trip",
                p.port,
                d.as_millis()
            ));
            p
        })
        .collect()
}

pub(crate) fn warm_up(opts: &Opts, fleet: &Fleet, scenarios: &[Scenario], script: &Path) {
    if opts.warmup == 0 {
        return;
    }
    for &s in scenarios {
        log(format!("warm-up {} ({} s)", s.id(), opts.warmup));
        let r = wrk::run(
            script,
            fleet.envoy(s).http_port,
            opts.connections,
            Duration::from_secs(opts.warmup),
            s.traffic(),
            "warm",
        );
        assert!(r.requests > 0, "warm-up of {} sent no request", s.id());
    }
}

/// Which sample of the run: the round, the scenario's place in it, the scenario.
#[derive(Clone, Copy)]
struct SamplePlace {
    round: usize,
    position: usize,
    scenario: Scenario,
}

/// Measures one sample; when something else took the Envoy core, measures again (at most
/// [`RETRIES_PER_SAMPLE`] times, and `retries_left` in the whole run) and keeps the
/// least disturbed attempt.
fn measure_sample(
    opts: &Opts,
    fleet: &Fleet,
    script: &Path,
    backends: (&[u16], &Services),
    at: SamplePlace,
    retries_left: &mut u32,
) -> Sample {
    let s = at.scenario;
    let measure = |attempt| {
        measure(
            fleet,
            s,
            script,
            opts.connections,
            Duration::from_secs(opts.duration),
            backends,
            at.round,
            at.position,
            attempt,
        )
    };
    let mut sample = measure(0);
    let mut retries = 0;
    while sample.envoy_core_other_pct > DISTURBED_PCT
        && retries < RETRIES_PER_SAMPLE
        && *retries_left > 0
    {
        retries += 1;
        *retries_left -= 1;
        log(format!(
            "round {}/{} {}: {:.1} % of the Envoy core went elsewhere; measuring again",
            at.round + 1,
            opts.rounds,
            s.id(),
            sample.envoy_core_other_pct
        ));
        let again = measure(retries as usize);
        if again.envoy_core_other_pct < sample.envoy_core_other_pct {
            sample = again;
        }
    }
    sample.retries = retries;
    log(format!(
        "round {}/{} {:<24} {:>8.0} req/s  p50 {:>5.0} µs  p99 {:>6.0} µs  {:>6.2} µs CPU/req ({:.2} schedstat)  {:.4} bridge calls/req  {:.3} Redis cmds/req",
        at.round + 1,
        opts.rounds,
        s.id(),
        sample.wrk.rps(),
        sample.wrk.p50_us,
        sample.wrk.p99_us,
        sample.cpu_us_per_request,
        sample.runtime_us_per_request,
        sample.per_request(sample.bridge_calls),
        sample.per_request(sample.redis_commands),
    ));
    sample
}
