//! What a run leaves: the pages and the picture from its JSON (`--render`), the summary
//! on stdout, and a smoke run's checks that every part produced figures.

use std::path::Path;
use std::process::Command;

use weir_e2e::repo_root;

use crate::accuracy::{self, Mode};
use crate::report::{self, Results};
use crate::scenario::Scenario;
use crate::{fail, log, page, Opts, PNG};

/// `weir-bench --render OUT/bench/results.json`: writes `OUT/benchmarks.md` (and the
/// picture) again from a run's JSON, without measuring anything.
pub(crate) fn render_main(json_path: &Path, plot_it: bool) {
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
    let drew = plot_it && !results.accuracy.runs.is_empty() && plot(&results, json_path, &png);
    // `--no-plot` keeps the picture already there (the page still shows it).
    let picture = drew || (!plot_it && png.is_file());
    let md_path = out.join("benchmarks.md");
    std::fs::write(&md_path, page::markdown(&results, picture.then_some(PNG)))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", md_path.display()));
    log(format!("wrote {}", md_path.display()));
}

pub(crate) fn write_outputs(opts: &Opts, out: &Path, results: &Results) {
    let raw_dir = out.join("bench");
    std::fs::create_dir_all(&raw_dir)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", raw_dir.display()));
    let json_path = raw_dir.join("results.json");
    let json = serde_json::to_string_pretty(results)
        .unwrap_or_else(|e| panic!("cannot serialize the results: {e}"));
    std::fs::write(&json_path, json + "\n")
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", json_path.display()));
    let png = out.join(PNG);
    let drew = opts.plot && !results.accuracy.runs.is_empty() && plot(results, &json_path, &png);
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

/// Draws the accuracy picture with `bench/plot.py`, and when the run had peers the
/// picture beside them ([`PEERS_PNG`], `bench/plot_peers.py`) next to it, installing
/// matplotlib into `.tools/venv` first when it is missing. Returns whether every picture
/// was written.
pub(crate) fn plot(results: &Results, json: &Path, png: &Path) -> bool {
    let peers = png.with_file_name(PEERS_PNG);
    plot_with("bench/plot.py", json, png)
        && (results.accuracy.peers.is_empty() || plot_with("bench/plot_peers.py", json, &peers))
}

/// The picture of weir beside its peers, next to the accuracy picture.
pub const PEERS_PNG: &str = "benchmarks-peers.png";

/// Runs the picture script `script` (relative to the repository) on `json` into `png`.
pub(crate) fn plot_with(script: &str, json: &Path, png: &Path) -> bool {
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
pub(crate) fn print_summary(r: &Results, with_targets: bool) {
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
pub(crate) fn positive(v: f64) -> bool {
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

pub(crate) fn check_smoke(opts: &Opts, out: &Path, r: &Results, scenarios: &[Scenario]) {
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
                // Every call costs the bridge and Redis CPU: a run that counted none did
                // not read their processes.
                let services =
                    x.bridge_cpu_us_per_request.median + x.redis_cpu_us_per_request.median;
                if s.calls_bridge() && !positive(services) {
                    problems.push(format!(
                        "{}: no CPU counted in weir-bridge or Redis",
                        s.id()
                    ));
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
    // The peers: Envoy's local cluster split always (it needs no build), the RLS peer
    // when built; each run sent and admitted something.
    if !r
        .accuracy
        .peers
        .iter()
        .any(|p| p.limiter.as_deref() == Some(crate::peer_accuracy::LOCAL_CLUSTER))
    {
        problems.push("accuracy beside the peers: no local_cluster_rate_limit run".into());
    }
    for p in &r.accuracy.peers {
        if p.sent == 0 || p.admitted == 0 {
            problems.push(format!(
                "accuracy {}: sent {}, admitted {}",
                p.label(),
                p.sent,
                p.admitted
            ));
        }
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
