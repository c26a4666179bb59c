//! `weir-bench`: what weir costs per request and how close it holds a limit, next to
//! what people would use instead, in one run on one machine.
//!
//! ```text
//! weir-bench [--rounds 8] [--duration 3] [--warmup 2] [--connections 16]
//!            [--accuracy-secs 20] [--out docs] [--only ID,ID] [--no-accuracy] [--no-plot]
//! weir-bench --smoke        # one short round into a temp dir; checks that numbers came out
//! weir-bench features       # token budgets and delay instead of reject (see [`features`])
//! weir-bench concurrency    # concurrency limits next to Envoy's adaptive_concurrency (see [`concurrency`])
//! ```
//!
//! 1. **Cost** ([`cost`]): a Redis Cluster and weir-bridge, then one Envoy per
//!    [`Scenario`] (1 worker, pinned to core 0; wrk, the bridge and Redis on core 1);
//!    warm-up; the scenarios interleaved, `--rounds` times.
//! 2. **Accuracy** ([`accuracy`]): a global limit of 1,000/s on two Envoys (exact and
//!    leased) and a local one on a 4-worker Envoy, offered 5× that by a paced generator;
//!    then the leased runs again on two Envoys that reach the bridge through a delaying
//!    proxy ([`weir_e2e::slow_proxy`]), as the `*-slow*` cost scenarios do.
//! 3. **Report** ([`report`]): `OUT/bench/results.json`, `OUT/benchmarks.md`, and
//!    `OUT/benchmarks-accuracy.png` drawn by `bench/plot.py` (matplotlib in `.tools/venv`).
//!
//! Prerequisites (`just bench` builds them): `weir.wasm` and the empty filter
//! (`--profile wasm`), `weir-bridge --release`, Envoy, wrk, redis-server.

mod accuracy;
mod concurrency;
mod cost;
mod counted;
mod features;
mod page;
mod report;
mod scenario;
mod simulate;
mod sys;
mod wrk;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use weir_e2e::{
    bridge_cluster_yaml, decisions, envoy_bin, repo_root, wasm_filter_yaml, Bootstrap, Bridge,
    Envoy, RedisCluster, Request, TestDir,
};

use accuracy::{Mode, PacedRun};
use cost::{Fleet, Samples};
use report::{AccuracyResults, Results, Settings};
use scenario::{Scenario, Wasm};
use sys::{ENVOY_CORE, LOAD_CORE};
use weir_e2e::slow_proxy::SlowProxy;

const PNG: &str = "benchmarks-accuracy.png";

#[derive(Clone, Debug)]
struct Opts {
    rounds: usize,
    duration: u64,
    warmup: u64,
    connections: u32,
    accuracy_secs: u64,
    out: Option<PathBuf>,
    only: Option<Vec<Scenario>>,
    accuracy: bool,
    plot: bool,
    smoke: bool,
}

const USAGE: &str = "usage: weir-bench [--rounds N] [--duration SECS] [--warmup SECS] \
[--connections N] [--accuracy-secs SECS] [--out DIR] [--only ID,ID] [--no-accuracy] [--no-plot] [--smoke]
       weir-bench --render OUT/bench/results.json [--no-plot]
       weir-bench simulate [--smoke] [--out DIR]
       weir-bench features [--smoke] [--secs N] [--out DIR]
       weir-bench concurrency [--smoke] [--secs N] [--out DIR] [--no-plot]
       weir-bench counted [--trace ID]";

impl Opts {
    fn parse(args: &[String]) -> Opts {
        let mut o = Opts {
            rounds: 8,
            duration: 3,
            warmup: 2,
            connections: 16,
            accuracy_secs: 20,
            out: None,
            only: None,
            accuracy: true,
            plot: true,
            smoke: false,
        };
        if args.iter().any(|a| a == "--smoke") {
            o.smoke = true;
            o.rounds = 1;
            o.duration = 1;
            // No warm-up: a smoke run asserts no figure, and the round itself sends load
            // through every scenario (17 s less, measured 2026-11-29).
            o.warmup = 0;
            o.accuracy_secs = 2;
            o.plot = false;
        }
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .unwrap_or_else(|| fail(&format!("{a} needs a value\n{USAGE}")))
            };
            let number = |v: String| -> u64 {
                v.parse().ok().filter(|&n| n > 0).unwrap_or_else(|| {
                    fail(&format!("{a}: expected a positive whole number, got {v:?}"))
                })
            };
            match a.as_str() {
                "--rounds" => o.rounds = number(value()) as usize,
                "--duration" => o.duration = number(value()),
                "--warmup" => o.warmup = number(value()),
                "--connections" => o.connections = number(value()) as u32,
                "--accuracy-secs" => o.accuracy_secs = number(value()),
                "--out" => o.out = Some(PathBuf::from(value())),
                "--only" => {
                    let ids = value();
                    o.only = Some(
                        ids.split(',')
                            .map(|id| {
                                Scenario::from_id(id.trim()).unwrap_or_else(|| {
                                    let known: Vec<&str> = Scenario::ALL
                                        .iter()
                                        .chain(&Scenario::DIAGNOSTIC)
                                        .map(|s| s.id())
                                        .collect();
                                    fail(&format!(
                                        "unknown scenario {id:?}; known: {}",
                                        known.join(", ")
                                    ))
                                })
                            })
                            .collect(),
                    )
                }
                "--no-accuracy" => o.accuracy = false,
                "--no-plot" => o.plot = false,
                "--smoke" => {}
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => fail(&format!("unknown argument {other:?}\n{USAGE}")),
            }
        }
        o
    }

    fn scenarios(&self) -> Vec<Scenario> {
        self.only.clone().unwrap_or_else(|| Scenario::ALL.to_vec())
    }

    /// The bridge delays of the slowed accuracy runs: the slowest alone for `--smoke`,
    /// which only checks that the path works (it saves the smoke run about 13 s).
    fn slow_bridge_ms(&self) -> &'static [u64] {
        if self.smoke {
            &accuracy::SLOW_BRIDGE_MS[accuracy::SLOW_BRIDGE_MS.len() - 1..]
        } else {
            &accuracy::SLOW_BRIDGE_MS
        }
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("weir-bench: {msg}");
    std::process::exit(2)
}

fn log(msg: impl AsRef<str>) {
    eprintln!("[weir-bench] {}", msg.as_ref());
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("simulate") {
        return simulate_main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("features") {
        return features_main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("concurrency") {
        return concurrency_main(&args[1..]);
    }
    if args.first().map(String::as_str) == Some("counted") {
        // Same on any machine: no Envoy, no wrk (see counted.rs).
        if let Some(id) = args.get(1).filter(|a| *a == "--trace").and(args.get(2)) {
            let scenario =
                Scenario::from_id(id).unwrap_or_else(|| fail(&format!("unknown scenario {id:?}")));
            let trace = counted::trace_call(scenario)
                .unwrap_or_else(|| fail(&format!("{id}: no bridge call to trace")));
            print!("{}", page::call_trace_section(&trace));
            return;
        }
        print!("{}", counted::table(&counted::count_all(10_000)));
        return;
    }
    if let Some(at) = args.iter().position(|a| a == "--render") {
        let json = args
            .get(at + 1)
            .unwrap_or_else(|| fail(&format!("--render needs a results.json\n{USAGE}")));
        return render_main(Path::new(json), !args.iter().any(|a| a == "--no-plot"));
    }
    let opts = Opts::parse(&args);
    let started = Instant::now();
    let command = if args.is_empty() {
        "weir-bench".to_string()
    } else {
        format!("weir-bench {}", args.join(" "))
    };

    // Prerequisites first: a missing one must say so before anything starts.
    let envoy = envoy_bin();
    let wasm = Wasm::locate();
    let bridge_bin = release_bridge();
    std::env::set_var("WEIR_BRIDGE_BIN", &bridge_bin);
    if sys::cores() < 2 {
        fail("needs at least 2 CPUs: Envoy on one, the load generator on another");
    }
    // The smoke run writes into a temp dir, removed after a passing run.
    let smoke_dir = opts.smoke.then(|| TestDir::new("bench-smoke"));
    let out = match (&opts.out, &smoke_dir) {
        (Some(o), _) => o.clone(),
        (None, Some(d)) => d.path().to_path_buf(),
        (None, None) => repo_root().join("docs"),
    };
    let machine = sys::Machine::probe(&envoy);
    log(format!(
        "{} × {}, kernel {}, Envoy {}; writing to {}",
        machine.cores,
        machine.cpu_model,
        machine.kernel,
        machine.envoy,
        out.display()
    ));

    // Everything started from here inherits the load core; Envoys are moved to theirs.
    sys::pin_self(&[LOAD_CORE]);
    let work = TestDir::new("bench");
    let script = wrk::write_script(work.path());
    let scenarios = opts.scenarios();
    let needs_bridge = opts.accuracy || scenarios.iter().any(|s| s.calls_bridge());

    let (redis, bridge, masters) = if needs_bridge {
        let (redis, bridge, masters) = start_redis_and_bridge();
        (Some(redis), Some(bridge), masters)
    } else {
        (None, None, Vec::new())
    };

    let (samples, envoy_cpus_allowed) =
        run_cost(&opts, &scenarios, &wasm, &bridge, &script, &masters);

    let accuracy_runs = match (&bridge, &redis) {
        (Some(bridge), Some(redis)) if opts.accuracy => {
            run_accuracy(&opts, &wasm, bridge, redis, &masters, work.path())
        }
        _ => Vec::new(),
    };
    drop(bridge);
    drop(redis);

    let summaries = report::summarize(&samples);
    let bridge_call = report::call_split(&samples);
    let targets = report::targets(&summaries, &accuracy_runs);
    let results = Results {
        generated_utc: report::utc_now(),
        command,
        machine,
        settings: Settings {
            rounds: opts.rounds,
            duration_s: opts.duration,
            warmup_s: opts.warmup,
            connections: opts.connections,
            accuracy_s: opts.accuracy_secs,
            envoy_core: ENVOY_CORE,
            load_core: LOAD_CORE,
            envoy_cpus_allowed,
            wall_s: started.elapsed().as_secs_f64(),
        },
        scenarios: summaries,
        targets,
        accuracy: AccuracyResults::new(accuracy_runs),
        samples: samples
            .into_iter()
            .map(|(s, v)| (s.id().to_string(), v))
            .collect(),
        counted: counted::count_all(if opts.smoke { 1_000 } else { 10_000 }),
        bridge_call,
        call_trace: counted::trace_call(Scenario::WeirGlobalExact),
        empty_wasm_entries: std::fs::read(&wasm.empty).ok().map(|module| {
            weir_e2e::wasm::callback_entries(&weir_e2e::wasm::exported_functions(&module))
        }),
    };
    write_outputs(&opts, &out, &results);
    print_summary(&results, !opts.smoke);
    if opts.smoke {
        check_smoke(&opts, &out, &results, &scenarios);
    }
    drop(smoke_dir);
}

/// `weir-bench simulate [--smoke] [--out DIR]`: the fleet profiles of `simulate`, against
/// the real bridge and Redis Cluster; writes `OUT/bench/simulation.json` (OUT: `docs`, or
/// a temp dir for `--smoke`).
fn simulate_main(args: &[String]) {
    let smoke = args.iter().any(|a| a == "--smoke");
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    let bridge_bin = release_bridge();
    std::env::set_var("WEIR_BRIDGE_BIN", &bridge_bin);
    let smoke_dir = smoke.then(|| TestDir::new("bench-sim-smoke"));
    let out = match (out, &smoke_dir) {
        (Some(o), _) => o,
        (None, Some(d)) => d.path().to_path_buf(),
        (None, None) => repo_root().join("docs"),
    };
    let profiles: Vec<simulate::Profile> = simulate::Profile::defaults()
        .into_iter()
        .map(|p| if smoke { p.smoke() } else { p })
        .collect();
    let runs = simulate::run_all(&profiles);
    let dir = out.join("bench");
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let path = dir.join("simulation.json");
    let json = serde_json::to_string_pretty(&serde_json::json!({
        "generated_utc": report::utc_now(),
        "machine_cores": sys::cores(),
        "runs": runs,
    }))
    .unwrap_or_else(|e| panic!("cannot serialize: {e}"));
    std::fs::write(&path, json + "\n")
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    log(format!("wrote {}", path.display()));
    let mut problems = Vec::new();
    for r in &runs {
        if r.requests == 0 || r.bridge_calls == 0 || r.keys_checked == 0 {
            problems.push(format!(
                "{}: no requests, calls or admissions",
                r.profile.name
            ));
        }
        for v in &r.violations {
            problems.push(format!("{}: conformance violated: {v}", r.profile.name));
        }
    }
    if !problems.is_empty() {
        eprintln!("weir-bench simulate: FAILED");
        for p in &problems {
            eprintln!("  - {p}");
        }
        std::process::exit(1);
    }
    if smoke {
        println!("bench-sim smoke: ok ({} profiles)", runs.len());
    }
    drop(smoke_dir);
}

/// What a subcommand's run was asked for: seconds per run, where it writes (OUT: `docs`,
/// or a temp dir for `--smoke`, removed after a passing run).
struct SubRun {
    name: &'static str,
    smoke: bool,
    secs: f64,
    out: PathBuf,
    smoke_dir: Option<TestDir>,
    command: String,
}

impl SubRun {
    fn parse(name: &'static str, args: &[String], secs: f64, smoke_secs: f64) -> SubRun {
        let smoke = args.iter().any(|a| a == "--smoke");
        let value = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
        };
        let secs: f64 = value("--secs")
            .map(|v| v.parse().unwrap_or_else(|_| fail("--secs takes a number")))
            .unwrap_or(if smoke { smoke_secs } else { secs });
        let bridge_bin = release_bridge();
        std::env::set_var("WEIR_BRIDGE_BIN", &bridge_bin);
        let smoke_dir = smoke.then(|| TestDir::new(&format!("bench-{name}-smoke")));
        let out = match (value("--out").map(PathBuf::from), &smoke_dir) {
            (Some(o), _) => o,
            (None, Some(d)) => d.path().to_path_buf(),
            (None, None) => repo_root().join("docs"),
        };
        let command = format!("weir-bench {name} {}", args.join(" "));
        SubRun {
            name,
            smoke,
            secs,
            out,
            smoke_dir,
            command: command.trim().to_string(),
        }
    }

    /// Writes `OUT/bench/NAME.json` (the results with when and how they were made); its
    /// path.
    fn write_json(&self, generated: &str, results: &impl serde::Serialize) -> PathBuf {
        let dir = self.out.join("bench");
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let json = serde_json::to_string_pretty(&serde_json::json!({
            "generated_utc": generated,
            "command": self.command,
            "machine_cores": sys::cores(),
            "results": results,
        }))
        .unwrap_or_else(|e| panic!("cannot serialize: {e}"));
        let path = dir.join(format!("{}.json", self.name));
        std::fs::write(&path, json + "\n")
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        path
    }

    /// Prints and writes `OUT/PAGE`, then fails on any problem; a passing smoke run
    /// removes its temp dir.
    fn finish(self, page_name: &str, page: &str, problems: &[String]) {
        print!("{page}");
        let path = self.out.join(page_name);
        std::fs::write(&path, page)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
        if !problems.is_empty() {
            eprintln!("weir-bench {}: FAILED", self.name);
            for p in problems {
                eprintln!("  - {p}");
            }
            std::process::exit(1);
        }
        if self.smoke {
            println!("bench-{} smoke: ok", self.name);
        }
        drop(self.smoke_dir);
    }
}

/// `weir-bench features [--smoke] [--secs N] [--out DIR]`: token budgets and delay
/// ([`features`]); writes `OUT/bench/features.json` and `OUT/benchmarks-features.md`
/// (`--smoke` runs 2 s each and fails on any problem).
fn features_main(args: &[String]) {
    let run = SubRun::parse("features", args, 10.0, 2.0);
    log(format!("feature runs, {} s each", run.secs));
    let results = features::run_all(run.secs);
    let generated = report::utc_now();
    run.write_json(&generated, &results);
    let page = features::markdown(&results, &generated, &run.command);
    let problems = features::problems(&results);
    run.finish("benchmarks-features.md", &page, &problems);
}

/// `weir-bench concurrency [--smoke] [--secs N] [--out DIR] [--no-plot]`: concurrency
/// limits next to Envoy's adaptive_concurrency ([`concurrency`]), N seconds per load
/// phase; writes `OUT/bench/concurrency.json`, `OUT/benchmarks-concurrency.md` and its
/// picture `OUT/benchmarks-concurrency.png` (`bench/plot_concurrency.py`; none for
/// `--smoke`, which runs 1.5 s phases and fails on any problem).
fn concurrency_main(args: &[String]) {
    let run = SubRun::parse("concurrency", args, 10.0, 1.5);
    log(format!("concurrency runs, {} s per phase", run.secs));
    let results = concurrency::run_all(run.secs);
    let generated = report::utc_now();
    let json = run.write_json(&generated, &results);
    const PNG: &str = "benchmarks-concurrency.png";
    let drew = !run.smoke
        && !args.iter().any(|a| a == "--no-plot")
        && plot_with("bench/plot_concurrency.py", &json, &run.out.join(PNG));
    let page = concurrency::markdown(&results, &generated, &run.command, drew.then_some(PNG));
    let problems = concurrency::problems(&results);
    run.finish("benchmarks-concurrency.md", &page, &problems);
}

/// A Redis Cluster of 3 masters and 3 replicas and weir-bridge (`$WEIR_BRIDGE_BIN`: the
/// release build), and the masters' ports.
fn start_redis_and_bridge() -> (RedisCluster, Bridge, Vec<u16>) {
    log("starting a Redis Cluster (3 masters, 3 replicas) and weir-bridge (release)");
    let redis = RedisCluster::start(3, 1);
    let bridge = Bridge::start(&redis, &[]);
    let masters: Vec<u16> = redis
        .masters()
        .iter()
        .filter_map(|a| a.rsplit_once(':').and_then(|(_, p)| p.parse().ok()))
        .collect();
    (redis, bridge, masters)
}

/// `$WEIR_BRIDGE_BIN`, else the release build: the bridge is benchmarked as it ships.
fn release_bridge() -> PathBuf {
    if let Some(p) = std::env::var_os("WEIR_BRIDGE_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let p = target.join("release/weir-bridge");
    if !p.is_file() {
        fail(&format!(
            "weir-bridge not found at {}: build it with `cargo build -p weir-bridge --release`, \
             or set WEIR_BRIDGE_BIN",
            p.display()
        ));
    }
    p
}

/// Envoys started at once: each compiles weir.wasm in V8 as it starts, and fifteen at
/// once on two busy cores can take longer than the wait for LIVE.
const ENVOYS_AT_ONCE: usize = 6;

/// Starts Envoys from `bootstraps`, [`ENVOYS_AT_ONCE`] at a time (each waits for LIVE on
/// its own thread), in the order given.
fn start_envoys(bootstraps: Vec<(Bootstrap, u32)>) -> Vec<Envoy> {
    let mut envoys = Vec::with_capacity(bootstraps.len());
    for batch in bootstraps.chunks(ENVOYS_AT_ONCE) {
        thread::scope(|s| {
            let handles: Vec<_> = batch
                .iter()
                .map(|(b, c)| s.spawn(move || Envoy::start(b, *c)))
                .collect();
            envoys.extend(handles.into_iter().map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("an Envoy failed to start"))
            }));
        });
    }
    envoys
}

fn run_cost(
    opts: &Opts,
    scenarios: &[Scenario],
    wasm: &Wasm,
    bridge: &Option<Bridge>,
    script: &Path,
    masters: &[u16],
) -> (Samples, Vec<String>) {
    // The proxies outlive the samples: the slowed scenarios' Envoys reach the bridge
    // through them.
    let (fleet, _proxies, allowed) = start_cost_fleet(scenarios, wasm, bridge);
    warm_up(opts, &fleet, scenarios, script);
    let mut samples = Samples::new();
    // A smoke run asserts no figure, so a disturbed sample is not measured again.
    let mut retries_left = if opts.smoke { 0 } else { cost::RETRIES_PER_RUN };
    for round in 0..opts.rounds {
        for (position, s) in cost::round_order(scenarios, round).into_iter().enumerate() {
            let at = SamplePlace {
                round,
                position,
                scenario: s,
            };
            let sample = measure_sample(opts, &fleet, script, masters, at, &mut retries_left);
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
) -> (Fleet, Vec<SlowProxy>, Vec<String>) {
    let bridge_port = bridge.as_ref().map(|b| b.port);
    let proxies = slow_proxies(scenarios.iter().filter_map(|s| s.slowed()), bridge);
    // A slowed scenario's Envoy reaches the bridge through the proxy of its delay.
    let port_of = |s: &Scenario| match s.slowed() {
        Some((_, delay)) => proxies.iter().find(|p| p.delay == delay).map(|p| p.port),
        None => bridge_port,
    };
    log(format!(
        "starting {} Envoys (1 worker each)",
        scenarios.len()
    ));
    let envoys = start_envoys(
        scenarios
            .iter()
            .map(|s| (s.bootstrap(wasm, port_of(s)), 1))
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

fn warm_up(opts: &Opts, fleet: &Fleet, scenarios: &[Scenario], script: &Path) {
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
/// [`cost::RETRIES_PER_SAMPLE`] times, and `retries_left` in the whole run) and keeps the
/// least disturbed attempt.
fn measure_sample(
    opts: &Opts,
    fleet: &Fleet,
    script: &Path,
    masters: &[u16],
    at: SamplePlace,
    retries_left: &mut u32,
) -> cost::Sample {
    let s = at.scenario;
    let measure = |attempt| {
        cost::measure(
            fleet,
            s,
            script,
            opts.connections,
            Duration::from_secs(opts.duration),
            masters,
            at.round,
            at.position,
            attempt,
        )
    };
    let mut sample = measure(0);
    let mut retries = 0;
    while sample.envoy_core_other_pct > cost::DISTURBED_PCT
        && retries < cost::RETRIES_PER_SAMPLE
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

/// A weir stat summed over `envoys`.
fn weir_stat(envoys: &[&Envoy], name: &str) -> u64 {
    envoys.iter().map(|e| e.weir_stat(name)).sum()
}

/// weir's counters of rule `rule` (`wasmcustom.weir.weir.rule.RULE.*`: the harness names
/// the plugin `weir`), summed over `envoys`.
fn rule_stats(envoys: &[&Envoy], rule: &str) -> std::collections::BTreeMap<String, u64> {
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

fn run_accuracy(
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
    let rule = mode.rule();
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
    let cpu = |pids: &[u32]| -> u64 { pids.iter().map(|&p| sys::process_cpu_us(p)).sum() };
    let cpu0: Vec<u64> = groups.iter().map(|(_, p)| cpu(p)).collect();
    log(format!(
        "accuracy: {} for {} s",
        accuracy::with_bridge_delay(mode.title(), served.bridge_delay_ms),
        opts.accuracy_secs
    ));
    let t0 = Instant::now();
    let mut run = accuracy::paced(mode, &ports, opts.accuracy_secs, key);
    run.bridge_delay_ms = served.bridge_delay_ms;
    let wall_us = t0.elapsed().as_micros().max(1) as f64;
    let used: Vec<u64> = groups
        .iter()
        .zip(&cpu0)
        .map(|((_, pids), c0)| cpu(pids).saturating_sub(*c0))
        .collect();
    run.cpu_pct = groups
        .iter()
        .zip(&used)
        .map(|((name, _), us)| (name.to_string(), *us as f64 * 100.0 / wall_us))
        .collect();
    run.envoy_cpu_us_per_request = used[0] as f64 / run.sent.max(1) as f64;
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

/// `weir-bench --render OUT/bench/results.json`: writes `OUT/benchmarks.md` (and the
/// picture) again from a run's JSON, without measuring anything.
fn render_main(json_path: &Path, plot_it: bool) {
    let text = std::fs::read_to_string(json_path)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", json_path.display())));
    let results: Results = serde_json::from_str(&text).unwrap_or_else(|e| {
        fail(&format!(
            "{}: not a weir-bench results file: {e}",
            json_path.display()
        ))
    });
    let out = json_path
        .parent()
        .and_then(Path::parent)
        .unwrap_or_else(|| fail("--render: expected OUT/bench/results.json"));
    let png = out.join(PNG);
    let drew = plot_it && !results.accuracy.runs.is_empty() && plot(json_path, &png);
    // `--no-plot` keeps the picture already there (the page still shows it).
    let picture = drew || (!plot_it && png.is_file());
    let md_path = out.join("benchmarks.md");
    std::fs::write(&md_path, page::markdown(&results, picture.then_some(PNG)))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", md_path.display()));
    log(format!("wrote {}", md_path.display()));
}

fn write_outputs(opts: &Opts, out: &Path, results: &Results) {
    let raw_dir = out.join("bench");
    std::fs::create_dir_all(&raw_dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", raw_dir.display()));
    let json_path = raw_dir.join("results.json");
    let json = serde_json::to_string_pretty(results)
        .unwrap_or_else(|e| panic!("cannot serialize the results: {e}"));
    std::fs::write(&json_path, json + "\n")
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", json_path.display()));
    let png = out.join(PNG);
    let drew = opts.plot && !results.accuracy.runs.is_empty() && plot(&json_path, &png);
    let md = page::markdown(results, drew.then_some(PNG));
    let md_path = out.join("benchmarks.md");
    std::fs::write(&md_path, md)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", md_path.display()));
    log(format!(
        "wrote {}, {}{}",
        md_path.display(),
        json_path.display(),
        if drew {
            format!(", {}", png.display())
        } else {
            String::new()
        }
    ));
}

/// Draws the accuracy picture with `bench/plot.py`, installing matplotlib into
/// `.tools/venv` first when it is missing. Returns whether the PNG was written.
fn plot(json: &Path, png: &Path) -> bool {
    plot_with("bench/plot.py", json, png)
}

/// Runs the picture script `script` (relative to the repository) on `json` into `png`.
fn plot_with(script: &str, json: &Path, png: &Path) -> bool {
    let root = repo_root();
    let venv = root.join(".tools/venv");
    let python = venv.join("bin/python");
    let run = |cmd: &mut Command| cmd.status().map(|s| s.success()).unwrap_or(false);
    if !python.is_file() && !run(Command::new("python3").args(["-m", "venv"]).arg(&venv)) {
        log("cannot create .tools/venv: no picture");
        return false;
    }
    let has_mpl = || {
        Command::new(&python)
            .args(["-c", "import matplotlib"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if !has_mpl() {
        log("installing matplotlib into .tools/venv");
        if !run(Command::new(venv.join("bin/pip")).args(["install", "-q", "matplotlib"])) {
            log("pip install matplotlib failed: no picture");
            return false;
        }
    }
    let ok = run(Command::new(&python)
        .arg(root.join(script))
        .arg(json)
        .arg(png));
    if !ok {
        log(format!("{script} failed: no picture"));
    }
    ok && png.is_file()
}

/// The tables on stdout; the targets only for a real run (a smoke run's seconds of load are
/// no measurement, and its log should not read like one).
fn print_summary(r: &Results, with_targets: bool) {
    println!(
        "{:<30} {:>22} {:>22} {:>8} {:>8} {:>12} {:>10}",
        "scenario", "req/s", "CPU µs/req", "×native", "×empty", "bridge/req", "Redis/req"
    );
    for x in &r.scenarios {
        println!(
            "{:<30} {:>22} {:>22} {:>8} {:>8} {:>12.4} {:>10.3}",
            x.id,
            x.rps.show(0),
            x.cpu_us_per_request.show(2),
            x.cpu_vs_native
                .map(|v| format!("{v:.2}"))
                .unwrap_or_default(),
            x.cpu_vs_empty_wasm
                .map(|v| format!("{v:.2}"))
                .unwrap_or_default(),
            x.bridge_calls_per_request.median,
            x.redis_commands_per_request.median
        );
    }
    for c in &r.bridge_call {
        let show = |s: &Option<report::Stat>| s.map_or("not measured".into(), |s| s.show(1));
        println!(
            "bridge call {:<8} exact − empty {} µs, floor − empty {} µs, exact − floor {} µs",
            c.protocol,
            show(&c.whole_us),
            show(&c.client_us),
            show(&c.vm_us)
        );
    }
    for a in &r.accuracy.runs {
        println!(
            "accuracy {:<30} sent {:>6.0}/s admitted {:>6} bound {:>8.0} over {:>5.2} % under {:>5.2} %",
            a.label(),
            a.sent_rps,
            a.admitted,
            a.exact_bound,
            a.over_pct,
            a.under_pct
        );
    }
    for t in r.targets.iter().filter(|_| with_targets) {
        let verdict = match t.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "not measured",
        };
        println!("target: {} — {} — {verdict}", t.target, t.measured);
    }
}

/// A number that came out of a measurement (not 0, not NaN).
fn positive(v: f64) -> bool {
    v > 0.0
}

/// The smoke run's checks: the harness ran every part and produced numbers. Never a
/// performance threshold.
/// The VM entries Envoy counted per request (`vm.entries`) against the scripted
/// Envoy's count (`bench/counted-ceilings.json`): the model must not miss a callback
/// Envoy makes. A value handed in is an entry too, and how often a denial finds its key
/// in the worker's cache depends on the traffic's order (half-limited: 6.83 in Envoy,
/// 6.62 scripted), so the model is allowed 5 %; a callback it missed for every request,
/// or every denied one, is more. And the local scenarios against the empty filter's
/// entries, with 0.05 for the ticks: a local decision costs no VM entry the empty
/// filter does not pay.
fn entry_problems(r: &Results) -> Vec<String> {
    let ceilings: serde_json::Value =
        serde_json::from_str(include_str!("../counted-ceilings.json")).unwrap_or_default();
    let mut problems = Vec::new();
    for x in r
        .scenarios
        .iter()
        .filter(|x| x.vm_entries_per_request.median > 0.0)
    {
        let measured = x.vm_entries_per_request.median;
        if let Some(model) = ceilings[&x.id]["entries"].as_f64() {
            if measured > model * 1.05 {
                problems.push(format!(
                    "{}: Envoy made {measured:.2} VM entries per request, the scripted Envoy \
                     counts at most {model:.2}: a callback the model misses",
                    x.id
                ));
            }
        }
        let local = ["weir-local", "weir-local-hot", "weir-local-half-limited"];
        if let (true, Some(empty)) = (local.contains(&x.id.as_str()), r.empty_wasm_entries) {
            if measured > empty as f64 + 0.05 {
                problems.push(format!(
                    "{}: {measured:.2} VM entries per request, more than the empty filter's {empty}",
                    x.id
                ));
            }
        }
    }
    problems
}

fn check_smoke(opts: &Opts, out: &Path, r: &Results, scenarios: &[Scenario]) {
    let mut problems = Vec::new();
    for s in scenarios {
        match r.scenarios.iter().find(|x| x.id == s.id()) {
            None => problems.push(format!("{}: no samples", s.id())),
            Some(x) => {
                if !positive(x.rps.median) {
                    problems.push(format!("{}: no requests/s", s.id()));
                }
                if !positive(x.cpu_us_per_request.median) {
                    problems.push(format!("{}: no CPU per request", s.id()));
                }
                if !positive(x.p50_us.median) {
                    problems.push(format!("{}: no latency", s.id()));
                }
                if s.calls_bridge() && !positive(x.bridge_calls_per_request.median) {
                    problems.push(format!("{}: no bridge call counted", s.id()));
                }
                if s.calls_bridge() && !positive(x.redis_commands_per_request.median) {
                    problems.push(format!("{}: no Redis command counted", s.id()));
                }
                // The floor's filter reads nothing of the answer: calls the bridge
                // refused or that timed out show only in Envoy's counts of the cluster.
                let calls: u64 = r
                    .samples
                    .iter()
                    .filter(|(id, _)| id == s.id())
                    .flat_map(|(_, v)| v)
                    .map(|x| x.bridge_calls)
                    .sum();
                if s.is_bridge_call_floor() && x.bridge_failures > calls / 100 {
                    problems.push(format!(
                        "{}: {} of {} bridge calls failed or were not answered 2xx",
                        s.id(),
                        x.bridge_failures,
                        calls + x.bridge_failures
                    ));
                }
            }
        }
    }
    problems.extend(entry_problems(r));
    let expected = Mode::ALL.len() + opts.slow_bridge_ms().len() * accuracy::SLOWED.len();
    if r.accuracy.runs.len() != expected {
        problems.push(format!(
            "accuracy: {} of {expected} runs ran ({} modes, {} of them again per slowed bridge)",
            r.accuracy.runs.len(),
            Mode::ALL.len(),
            accuracy::SLOWED.len()
        ));
    }
    for a in &r.accuracy.runs {
        if let Some(v) = &a.violation {
            problems.push(format!("accuracy {}: conformance violated: {v}", a.label()));
        }
        if a.bridge_delay_ms > 0 {
            // What a slow bridge leaves admitted is the measurement (today's core can
            // admit next to nothing at +30 ms): ask only that it ran and was judged whole.
            if a.sent == 0 || a.bridge_calls == 0 {
                problems.push(format!(
                    "accuracy {}: sent {}, {} bridge calls",
                    a.label(),
                    a.sent,
                    a.bridge_calls
                ));
            }
            if a.checked_admissions < a.admitted {
                problems.push(format!(
                    "accuracy {}: the checker judged {} of {} admissions",
                    a.label(),
                    a.checked_admissions,
                    a.admitted
                ));
            }
            continue;
        }
        if a.checked_admissions == 0 {
            problems.push(format!("accuracy {}: no admission checked", a.label()));
        }
        if a.sent == 0 || a.admitted == 0 {
            problems.push(format!(
                "accuracy {}: sent {}, admitted {}",
                a.label(),
                a.sent,
                a.admitted
            ));
        }
    }
    for f in ["benchmarks.md", "bench/results.json"] {
        if !out.join(f).is_file() {
            problems.push(format!("{} was not written", out.join(f).display()));
        }
    }
    if problems.is_empty() {
        println!(
            "bench-smoke: ok ({} scenarios, {} accuracy runs; output in {}, removed unless \
             WEIR_E2E_KEEP=1 or --out)",
            scenarios.len(),
            r.accuracy.runs.len(),
            out.display()
        );
    } else {
        eprintln!("bench-smoke: FAILED");
        for p in &problems {
            eprintln!("  - {p}");
        }
        std::process::exit(1);
    }
}

#[cfg(test)]
mod committed_pages {
    use super::*;

    /// Renders `docs/bench/NAME.json` with `render` (given its results, generation time and
    /// command) and asserts that `docs/PAGE` is exactly that: every figure on the page is
    /// the data's.
    fn assert_page_renders<R: serde::de::DeserializeOwned>(
        name: &str,
        page: &str,
        render: impl Fn(&R, &str, &str) -> String,
    ) {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs");
        let json = std::fs::read_to_string(docs.join(format!("bench/{name}.json"))).unwrap();
        let json: serde_json::Value = serde_json::from_str(&json).unwrap();
        let results: R = serde_json::from_value(json["results"].clone()).unwrap();
        let text = |k: &str| json[k].as_str().unwrap_or_else(|| panic!("no {k}"));
        let rendered = render(&results, text("generated_utc"), text("command"));
        let committed = std::fs::read_to_string(docs.join(page)).unwrap();
        assert!(
            committed == rendered,
            "docs/{page} is not what docs/bench/{name}.json renders to"
        );
    }

    #[test]
    fn the_features_page_is_what_its_json_renders() {
        assert_page_renders("features", "benchmarks-features.md", features::markdown);
    }

    #[test]
    fn the_concurrency_page_is_what_its_json_renders() {
        assert_page_renders(
            "concurrency",
            "benchmarks-concurrency.md",
            |r: &concurrency::ConcurrencyResults, generated, command| {
                concurrency::markdown(r, generated, command, Some("benchmarks-concurrency.png"))
            },
        );
    }
}
