//! `weir-bench`: what weir costs per request and how close it holds a limit, next to
//! what people would use instead, in one run on one machine.
//!
//! ```text
//! weir-bench [--rounds 8] [--duration 3] [--warmup 2] [--connections 16]
//!            [--accuracy-secs 20] [--out docs] [--only ID,ID] [--no-accuracy] [--no-plot]
//! weir-bench --smoke        # one short round into a temp dir; checks that numbers came out
//! weir-bench features       # token budgets, delay instead of reject, fair shares (see [`features`])
//! weir-bench concurrency    # concurrency limits next to Envoy's adaptive_concurrency (see [`concurrency`])
//! ```
//!
//! Each run has its file, and this one parses the command line and runs them in turn.
//!
//! 1. **Cost** ([`cost`]): a Redis Cluster and weir-bridge, then one Envoy per
//!    [`Scenario`] (1 worker, pinned to core 0; wrk, the bridge and Redis on core 1);
//!    warm-up; the scenarios interleaved, `--rounds` times.
//! 2. **Accuracy** ([`accuracy_run`], with the paced generator of [`accuracy`]): a global limit of 1,000/s on two Envoys (exact and
//!    leased) and a local one on a 4-worker Envoy, offered 5× that by a paced generator;
//!    then the leased runs again on two Envoys that reach the bridge through a delaying
//!    proxy ([`weir_e2e::slow_proxy`]), as the `*-slow*` cost scenarios do.
//! 3. **Report** ([`report`], written by [`output`]): `OUT/bench/results.json`, `OUT/benchmarks.md`, and
//!    `OUT/benchmarks-accuracy.png` drawn by `bench/plot.py` (matplotlib in `.tools/venv`).
//!
//! Prerequisites (`just bench` builds them): `weir.wasm` and the empty filter
//! (`--profile wasm`), `weir-bridge --release`, Envoy, wrk, redis-server.

mod accuracy;
mod accuracy_run;
mod concurrency;
mod cost;
mod counted;
mod features;
mod output;
mod page;
mod peer_accuracy;
mod peers;
mod report;
mod scenario;
mod shares;
mod simulate;
mod sys;
mod targets;
mod wrk;

use std::path::{Path, PathBuf};
use std::thread;
use std::time::Instant;

use weir_e2e::redis_single::RedisServer;
use weir_e2e::{envoy_bin, free_port, repo_root, Bootstrap, Bridge, Envoy, RedisCluster, TestDir};

use accuracy_run::run_accuracy;
use cost::run_cost;
use output::{check_smoke, plot_with, print_summary, render_main, write_outputs};
use report::{AccuracyResults, Results, Settings};
use scenario::{Scenario, Wasm};
use sys::{ENVOY_CORE, LOAD_CORE};

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
       weir-bench features [--smoke] [--secs N] [--out DIR] [--no-plot]
       weir-bench concurrency [--smoke] [--secs N] [--rounds N] [--out DIR] [--no-plot]
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
                                        .chain(&Scenario::PEERS)
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

    /// `--only`'s, else every scenario of the default run, the peers' when `peers` (the
    /// peer is built).
    fn scenarios(&self, peers: bool) -> Vec<Scenario> {
        self.only.clone().unwrap_or_else(|| {
            let mut all = Scenario::ALL.to_vec();
            if peers {
                all.extend(Scenario::PEERS);
            }
            all
        })
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
    let rls_bin = peers::limitador_rls_bin();
    if rls_bin.is_none() {
        log("the peers are not built (`just bench-peers`): no rls-limitador-* scenarios");
    }
    let scenarios = opts.scenarios(rls_bin.is_some());
    let rls_limits: Vec<_> = scenarios.iter().filter_map(|s| s.rls()).collect();
    let single_redis_scenarios = scenarios.iter().any(|s| s.single_redis().is_some());
    // One standalone redis-server for the peers and for weir over a single Redis.
    let single = (!rls_limits.is_empty() || single_redis_scenarios).then(|| {
        log("starting a standalone redis-server (the peers' and weir's single-Redis scenarios')");
        RedisServer::start(&[])
    });
    let rls = match (&rls_bin, &single) {
        (Some(bin), Some(single)) if !rls_limits.is_empty() => {
            log("starting the peers' rate limit services (limitador-rls)");
            Some(peers::RlsServices::start(bin, single.port, &rls_limits))
        }
        (None, _) if !rls_limits.is_empty() => {
            fail("--only names a peer that is not built: run `just bench-peers`")
        }
        _ => None,
    };
    let single_bridge = single
        .as_ref()
        .filter(|_| single_redis_scenarios)
        .map(|single| {
            log("starting a second weir-bridge (release) over the standalone redis-server");
            let addr = single.addr();
            Bridge::start_with_redis(
                free_port(),
                &["--redis-mode", "standalone", "--redis-nodes", &addr],
                &[],
            )
        });
    let needs_bridge = opts.accuracy || scenarios.iter().any(|s| s.calls_bridge());

    let (redis, bridge, masters) = if needs_bridge {
        let (redis, bridge, masters) = start_redis_and_bridge();
        (Some(redis), Some(bridge), masters)
    } else {
        (None, None, Vec::new())
    };

    let mut services = match (&bridge, &redis) {
        (Some(bridge), Some(redis)) => cost::Services {
            bridges: vec![bridge.pid()],
            redis: redis.pids(),
            rls: Vec::new(),
        },
        _ => cost::Services::default(),
    };
    // Redis commands are counted on the cluster's masters and the standalone Redis.
    let mut stores = masters.clone();
    if let Some(single) = &single {
        services.redis.push(single.pid());
        stores.push(single.port);
    }
    services.rls = rls.as_ref().map(|r| r.pids()).unwrap_or_default();
    services
        .bridges
        .extend(single_bridge.as_ref().map(Bridge::pid));
    let peer_backends = peers::PeerBackends {
        rls: rls.as_ref(),
        single_redis_bridge: single_bridge.as_ref().map(|b| b.port),
    };
    let (samples, envoy_cpus_allowed) = run_cost(
        &opts,
        &scenarios,
        &wasm,
        &bridge,
        peer_backends,
        &script,
        (&stores, &services),
    );
    drop(rls);
    drop(single_bridge);
    drop(single);

    let accuracy_runs = match (&bridge, &redis) {
        (Some(bridge), Some(redis)) if opts.accuracy => {
            run_accuracy(&opts, &wasm, bridge, redis, &masters, work.path())
        }
        _ => Vec::new(),
    };
    drop(bridge);
    drop(redis);
    let peer_runs = if opts.accuracy {
        peer_accuracy::run_peer_accuracy(&opts, rls_bin.as_deref())
    } else {
        Vec::new()
    };

    let summaries = report::summarize(&samples);
    let bridge_call = report::call_split(&samples);
    let mut targets = targets::targets(&summaries, &accuracy_runs);
    targets.extend(targets::peer_accuracy_targets(&accuracy_runs, &peer_runs));
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
        accuracy: AccuracyResults::new(accuracy_runs, peer_runs),
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

/// `weir-bench features [--smoke] [--secs N] [--out DIR] [--no-plot]`: token budgets,
/// delay and fair shares ([`features`], [`shares`]); writes `OUT/bench/features.json`,
/// `OUT/benchmarks-features.md` and the shares' picture `OUT/benchmarks-shares.png`
/// (`bench/plot_shares.py`; none for `--smoke`, which runs 2 s each, the shares 4, and
/// fails on any problem).
fn features_main(args: &[String]) {
    let run = SubRun::parse("features", args, 10.0, 2.0);
    log(format!("feature runs, {} s each", run.secs));
    let results = features::run_all(run.secs);
    let generated = report::utc_now();
    let json = run.write_json(&generated, &results);
    const PNG: &str = "benchmarks-shares.png";
    let drew = !run.smoke
        && !args.iter().any(|a| a == "--no-plot")
        && plot_with("bench/plot_shares.py", &json, &run.out.join(PNG));
    let page = features::markdown(&results, &generated, &run.command, drew.then_some(PNG));
    let problems = features::problems(&results);
    run.finish("benchmarks-features.md", &page, &problems);
}

/// `weir-bench concurrency [--smoke] [--secs N] [--rounds N] [--out DIR] [--no-plot]`:
/// concurrency limits next to Envoy's adaptive_concurrency ([`concurrency`]), N seconds
/// per load phase, the phases [`concurrency::ROUNDS`] times over; writes
/// `OUT/bench/concurrency.json`, `OUT/benchmarks-concurrency.md` and its picture
/// `OUT/benchmarks-concurrency.png` (`bench/plot_concurrency.py`; none for `--smoke`,
/// which runs two rounds of 1 s phases and fails on any problem).
fn concurrency_main(args: &[String]) {
    let run = SubRun::parse("concurrency", args, 10.0, 1.0);
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| fail("--rounds takes a number"))
        })
        .unwrap_or(if run.smoke { 2 } else { concurrency::ROUNDS });
    log(format!(
        "concurrency runs, {} s per phase, {rounds} rounds",
        run.secs
    ));
    let results = concurrency::run_all(run.secs, rounds);
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
        assert_page_renders(
            "features",
            "benchmarks-features.md",
            |r: &features::FeatureResults, generated, command| {
                features::markdown(r, generated, command, Some("benchmarks-shares.png"))
            },
        );
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
