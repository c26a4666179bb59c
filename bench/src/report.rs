//! Medians, ratios and what `results.json` holds (every sample); the targets judged on
//! them are [`crate::targets`]. The page is `page/`. Nothing here measures; every figure
//! comes from the run.

use std::collections::BTreeMap;

use crate::accuracy::{self, PacedRun};
use crate::targets::Target;

use crate::cost::{Sample, Samples};
use crate::counted::{CallTrace, Counted};
use crate::scenario::Scenario;
use crate::sys::Machine;

/// Median with min and max.
#[derive(Clone, Copy, Debug, Default, serde::Serialize, serde::Deserialize)]
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
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub id: String,
    pub description: String,
    pub rounds: usize,
    pub rps: Stat,
    pub p50_us: Stat,
    pub p99_us: Stat,
    pub cpu_us_per_request: Stat,
    /// weir-bridge's, Redis's (the cluster's nodes and the peers' standalone server) and
    /// the peers' rate limit services' CPU per request (µs), and these with Envoy's: the
    /// whole system's (each round's sum, then the median).
    #[serde(default)]
    pub bridge_cpu_us_per_request: Stat,
    #[serde(default)]
    pub redis_cpu_us_per_request: Stat,
    #[serde(default)]
    pub rls_cpu_us_per_request: Stat,
    #[serde(default)]
    pub system_cpu_us_per_request: Stat,
    /// The whole system's median less its baseline's ([`Scenario::baseline`]: no filter,
    /// the same route; for a peer, the upstream hop's cost only for the share of requests
    /// let through, no filter's for its 429s): what the limiter itself costs, µs per request.
    #[serde(default)]
    pub own_cpu_us_per_request: Option<f64>,
    pub bridge_calls_per_request: Stat,
    /// weir's calls into Envoy per request (`vm.host_calls`), 0 for the other filters.
    #[serde(default)]
    pub host_calls_per_request: Stat,
    /// Envoy's callbacks into weir's VM per request (`vm.entries`), 0 for the others.
    #[serde(default)]
    pub vm_entries_per_request: Stat,
    /// Bytes copied across weir's VM boundary per request, both ways.
    #[serde(default)]
    pub vm_bytes_per_request: Stat,
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
            bridge_cpu_us_per_request: stat(v, &|x| x.per_request(x.bridge_cpu_us)),
            redis_cpu_us_per_request: stat(v, &|x| x.per_request(x.redis_cpu_us)),
            rls_cpu_us_per_request: stat(v, &|x| x.per_request(x.rls_cpu_us)),
            system_cpu_us_per_request: stat(v, &|x| {
                x.per_request(x.envoy_cpu_us + x.bridge_cpu_us + x.redis_cpu_us + x.rls_cpu_us)
            }),
            own_cpu_us_per_request: None,
            bridge_calls_per_request: stat(v, &|x| x.per_request(x.bridge_calls)),
            host_calls_per_request: stat(v, &|x| x.per_request(x.host_calls)),
            vm_entries_per_request: stat(v, &|x| x.per_request(x.vm_entries)),
            vm_bytes_per_request: stat(v, &|x| x.per_request(x.vm_bytes)),
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
    let system = |out: &[Summary], s: Scenario| {
        out.iter()
            .find(|x| x.id == s.id())
            .map(|x| x.system_cpu_us_per_request.median)
    };
    // A peer's 429s never reach the upstream: its baseline is the hop's cost for the
    // requests that were let through, and no filter's for the others.
    let baseline = |out: &[Summary], x: &Summary, s: Scenario| -> Option<f64> {
        let hop = system(out, s.baseline())?;
        if s.baseline() == Scenario::NoFilter {
            return Some(hop);
        }
        let through = 1.0 - x.non_2xx_pct.median / 100.0;
        Some(match system(out, Scenario::NoFilter) {
            Some(none) => none + through * (hop - none),
            None => hop,
        })
    };
    let own: Vec<Option<f64>> = samples
        .keys()
        .zip(&out)
        .map(|(s, x)| Some(system(&out, *s)? - baseline(&out, x, *s)?))
        .collect();
    for (x, own) in out.iter_mut().zip(own) {
        x.own_cpu_us_per_request = own;
    }
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

/// Everything the run settles on, for the report and the JSON.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
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

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
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
    /// What each weir scenario's request costs in VM entries and host calls on a
    /// scripted Envoy: the same on any machine (`weir-bench counted`).
    #[serde(default)]
    pub counted: Vec<Counted>,
    /// What a bridge call costs, split per protocol (issue 21, item 4).
    #[serde(default)]
    pub bridge_call: Vec<CallSplit>,
    /// One request of weir-global-exact on the scripted Envoy, callback by callback.
    #[serde(default)]
    pub call_trace: Option<CallTrace>,
    /// VM entries per request of the empty filter the runs compare against: the
    /// per-request callbacks its module exports (it hands nothing into the VM), read
    /// from its export section (`weir_e2e::wasm`).
    #[serde(default)]
    pub empty_wasm_entries: Option<u64>,
}

// What a bridge call costs (issue 21, item 4): weir-global-exact against the empty
// filter making the same call (bridge-call-floor) and against the empty filter.

/// One protocol's bridge call, split. Each figure is Envoy CPU µs per request, the
/// difference of two scenarios within each round (they are measured interleaved),
/// median (min–max) over the rounds; `None` when the run left one of them out.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct CallSplit {
    /// `HTTP/1.1` or `HTTP/2`.
    pub protocol: String,
    pub exact: String,
    pub floor: String,
    /// exact − empty wasm: the whole call as weir makes it.
    pub whole_us: Option<Stat>,
    /// floor − empty wasm: Envoy's HTTP client, the pause and the answer's callback.
    pub client_us: Option<Stat>,
    /// exact − floor: weir's share, in its VM and in the host calls it makes.
    pub vm_us: Option<Stat>,
}

/// The split for each protocol, from the samples.
pub fn call_split(samples: &Samples) -> Vec<CallSplit> {
    let cpu = |s: Scenario| -> BTreeMap<usize, f64> {
        samples
            .get(&s)
            .map(|v| v.iter().map(|x| (x.round, x.cpu_us_per_request)).collect())
            .unwrap_or_default()
    };
    let diff = |a: Scenario, b: Scenario| -> Option<Stat> {
        let (a, b) = (cpu(a), cpu(b));
        let d: Vec<f64> = a
            .iter()
            .filter_map(|(round, x)| b.get(round).map(|y| x - y))
            .collect();
        (!d.is_empty()).then(|| Stat::of(d))
    };
    [
        (
            "HTTP/1.1",
            Scenario::WeirGlobalExact,
            Scenario::BridgeCallFloor,
        ),
        (
            "HTTP/2",
            Scenario::WeirGlobalExactH2,
            Scenario::BridgeCallFloorH2,
        ),
    ]
    .into_iter()
    .map(|(protocol, exact, floor)| CallSplit {
        protocol: protocol.to_string(),
        exact: exact.id().to_string(),
        floor: floor.id().to_string(),
        whole_us: diff(exact, Scenario::EmptyWasm),
        client_us: diff(floor, Scenario::EmptyWasm),
        vm_us: diff(exact, floor),
    })
    .filter(|x| x.whole_us.is_some() || x.client_us.is_some() || x.vm_us.is_some())
    .collect()
}

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
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
    /// The peers offered the same loads (issue 35; [`crate::peer_accuracy`]), beside
    /// weir's runs of those loads; empty when the run had none.
    #[serde(default)]
    pub peers: Vec<PacedRun>,
}

impl AccuracyResults {
    pub fn new(runs: Vec<PacedRun>, peers: Vec<PacedRun>) -> AccuracyResults {
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
            peers,
        }
    }
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
