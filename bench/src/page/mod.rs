//! `docs/benchmarks.md` from the run's [`Results`]: every table is built as data first
//! ([`Table`]: a header and rows of cells), then written as Markdown; each section is a
//! small function. Nothing here measures.
//!
//! Here: the page in its order, the header, the machine, the targets, how to run it and
//! what it does not show. The three long sections have a file each, in the page's order:

/// What each scenario costs, and the run's health.
mod cost;

/// What a call to the bridge costs.
mod bridge_call;

/// How close to the bound each accuracy run admitted.
mod accuracy;

use crate::accuracy::PacedRun;
use crate::report::{num, Results};
use crate::scenario::Scenario;
use crate::targets::Target;
use accuracy::accuracy_section;
use bridge_call::bridge_call_section;
pub use bridge_call::call_trace_section;
use cost::{cost_section, counted_section};

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
        running_section(r),
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

fn targets_section(targets: &[Target]) -> String {
    let mut t = Table::new(&["target", "this run", ""]);
    for x in targets {
        t.row(vec![
            x.target.clone(),
            x.measured.clone(),
            met(x.met).to_string(),
        ]);
    }
    format!("## Targets (issues 4, 10, 21 and 35)\n\n{}", t.markdown())
}

fn running_section(r: &Results) -> String {
    format!("## Running it\n\n`just bench` builds `weir.wasm`, the empty filter, `weir-bridge \
     --release` and the peers (`just bench-peers`: bench/peers/limitador-rls, which builds \
     RocksDB from source and needs Debian's `libclang-dev`, 9 min 21 s cold on a 2-core \
     machine, then checks each peer behind a real Envoy), runs `weir-bench` ({} minutes \
     this run) and rewrites this page, \
     `docs/bench/results.json` and the pictures (drawn by `bench/plot.py` and \
     `bench/plot_peers.py`; matplotlib is installed into `.tools/venv` when missing). \
     Without the peer's binary (`target/peers/release/limitador-rls`, or \
     `$WEIR_PEER_LIMITADOR_RLS`) `weir-bench` says so and leaves the `rls-limitador-*` rows \
     out; Envoy's `local_cluster_rate_limit` needs no build. `weir-bench --render docs/bench/results.json` \
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
     budgets (costs known after the response), delay instead of reject and fair shares, on real Envoys, \
     written to [benchmarks-features.md](benchmarks-features.md), and `weir-bench concurrency`: \
     concurrency limits next to Envoy's `adaptive_concurrency`, written to \
     [benchmarks-concurrency.md](benchmarks-concurrency.md).\n\n",
        num(r.settings.wall_s / 60.0, 0)
    )
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
