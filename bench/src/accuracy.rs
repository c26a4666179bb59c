//! Accuracy: how close a limit holds, and whether every admission keeps the algorithm's
//! bound, under 5× and 20× its rate and after an idle period.
//!
//! wrk cannot pace, so this is a small paced load generator: `threads` threads, each with
//! one keep-alive connection, thread `g` of `T` sending request `k·T + g` at its instant
//! of the run's schedule (phases of an offered rate, or of silence). A thread that falls
//! behind (a slow answer) sends at once until it is back on schedule, and stops at the end
//! of the run whatever it did not send, so every request falls in the run's seconds. The
//! rate actually sent and how far behind any thread fell are reported: when the machine
//! cannot answer the offered rate, the figures say so rather than hide it.
//!
//! Every run is also judged by the core's conformance checker: the Envoys log each
//! request's decisions (`response.filter_state: all`, `weir_e2e::decisions`), and the
//! admissions of the run's key from every Envoy, at the instants they were decided, must
//! keep the GCRA bound in every interval.
//!
//! Under-admission is measured against the most a conformant limiter could admit over the
//! run when offered more than its rate all along: `b + 1 + rate · t` (it starts full, `b + 1`
//! at once, and admits one more every `1/rate`), `t` from the first request sent to the
//! last answer received, the longest span in which the limiter can have decided.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use weir_e2e::{Client, Request};

use crate::sys;

/// The limit under test: GCRA, `RATE` per second, burst `BURST` (so `BURST + 1` at once).
pub const RATE: u64 = 1000;
pub const BURST: u64 = 99;
/// The 20× run's limit: a quarter of the rate (and of the burst), offered the same load.
pub const RATE_20X: u64 = 250;
pub const BURST_20X: u64 = 24;
/// Offered load of the steady runs, requests per second over all Envoys: 5× [`RATE`],
/// 20× [`RATE_20X`].
pub const OFFERED: f64 = 5000.0;
/// Leased mode: most units one call takes or reserves, how long a unit may wait to be
/// spent (GCRA pays for it with burst: 20 of 99 at 1 ms per unit), and how far ahead a
/// saturated key's schedule is reserved.
pub const LEASE_MAX: u64 = 50;
pub const LEASE_TTL: &str = "20ms";
pub const LEASE_TTL_20X: &str = "20ms";
pub const HORIZON: &str = "100ms";
/// Units of the burst the 20 ms hold costs the 5× key: one per 1 ms emission interval.
pub const HOLD_PAID: u64 = 20;
/// The uneven runs' load, in multiples of [`RATE`] over all Envoys.
pub const UNEVEN_MULTIPLE: f64 = 2.0;
/// Client threads (= keep-alive connections) per run: enough that answers taking
/// 16 ms (a saturated machine) still let 5,000 requests/s out.
pub const THREADS: usize = 80;

fn gcra(rate: u64, burst: u64) -> String {
    format!(r#""limit": {{"algorithm": "gcra", "rate": {rate}, "period": "1s", "burst": {burst}}}"#)
}

/// The plugin config of the two global Envoys: one rule per global mode, on its path.
pub fn global_config() -> String {
    let limit = gcra(RATE, BURST);
    let limit_20x = gcra(RATE_20X, BURST_20X);
    let rule = |name: &str, path: &str, limit: &str, global: &str| {
        format!(
            r#"{{"name": "{name}", "match": {{"path": {{"exact": "{path}"}}}}, "key": [{{"header": "x-key"}}],
   "scope": "global", {limit}, "global": {global}}}"#
        )
    };
    let leased = |ttl: &str| {
        format!(
            r#"{{"lease": {{"max": {LEASE_MAX}, "ttl": "{ttl}", "horizon": "{HORIZON}"}}, "expected_instances": 2}}"#
        )
    };
    format!(
        r#"{{"bridge": {{"cluster": "weir_bridge", "timeout": "250ms"}}, "response": {{"filter_state": "all"}}, "rules": [
  {},
  {},
  {}]}}"#,
        rule(
            "acc-exact",
            "/exact",
            &limit,
            r#"{"expected_instances": 2}"#
        ),
        rule("acc-leased", "/leased", &limit, &leased(LEASE_TTL)),
        rule(
            "acc-leased-20x",
            "/leased-20x",
            &limit_20x,
            &leased(LEASE_TTL_20X)
        ),
    )
}

/// The plugin config of the local Envoy (4 workers).
pub fn local_config() -> String {
    let limit = gcra(RATE, BURST);
    format!(
        r#"{{"response": {{"filter_state": "all"}}, "rules": [{{"name": "acc-local", "match": {{"path": {{"exact": "/local"}}}},
  "key": [{{"header": "x-key"}}], {limit}}}]}}"#
    )
}

/// The slowed runs: [`SLOWED`] run again, once per delay here (the slowest alone in a
/// smoke run; in ascending order), by two more global Envoys
/// that reach the bridge through a delaying proxy ([`weir_e2e::slow_proxy`]) adding this many
/// ms to every round trip. A 16 ms round trip (a saturated machine) once ate most of the
/// 20 ms hold and a saturated key asked the bridge far too often: these runs show it.
pub const SLOW_BRIDGE_MS: [u64; 2] = [10, 30];
/// The modes run again with a slow bridge: the leased ones at 5× and 20×.
pub const SLOWED: [Mode; 2] = [Mode::GlobalLeased, Mode::GlobalLeased20x];

mod mode;
pub use mode::{Mode, Phase};

/// One request's fate.
#[derive(Clone, Copy, Debug)]
struct Event {
    sent_us: u64,
    done_us: u64,
    /// HTTP status, 0 for an I/O error.
    status: u16,
}

/// What a paced run measured.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PacedRun {
    pub mode: Mode,
    /// The peer that served the run ([`crate::peer_accuracy`]); `None`: weir.
    #[serde(default)]
    pub limiter: Option<String>,
    /// What a delaying proxy between the Envoys and the bridge added to every bridge round
    /// trip, ms (0: the Envoys called the bridge directly). Filled in by the caller.
    #[serde(default)]
    pub bridge_delay_ms: u64,
    pub seconds: u64,
    pub sent: u64,
    /// Requests sent per second of the run while load ran.
    pub sent_rps: f64,
    /// The limit's rate and burst, and how many times its rate it was offered.
    pub rate: u64,
    pub burst: u64,
    pub multiple: f64,
    pub admitted: u64,
    pub limited: u64,
    /// Other statuses and I/O errors.
    pub failed: u64,
    /// From the first request sent to the last answer received.
    pub span_s: f64,
    pub exact_bound: f64,
    pub over_pct: f64,
    pub under_pct: f64,
    /// Admitted per whole second since the start (by send time).
    pub admitted_per_second: Vec<u64>,
    pub sent_per_second: Vec<u64>,
    /// How far the slowest thread fell behind its schedule, in ms.
    pub max_lag_ms: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The conformance checker's verdict on every admission of the run's key, from every
    /// Envoy: `None` when they keep the bound, else the violation. Filled in by the caller.
    pub violation: Option<String>,
    /// Admissions the checker judged.
    pub checked_admissions: u64,
    /// Envoy CPU per request sent, µs (all the mode's Envoys, over the run).
    pub envoy_cpu_us_per_request: f64,
    /// Filled in by the caller for the global modes.
    pub bridge_calls: u64,
    pub redis_scripts: u64,
    /// Units Redis granted (`weir_bridge_units_granted_total`): admitted + leased units
    /// that expired unspent.
    pub redis_granted: u64,
    /// weir's counters for the rule over the run, summed over the Envoys
    /// (`weir.rule.NAME.*`: allowed, limited, lease_hits, denial_cache_hits, …).
    pub rule_stats: std::collections::BTreeMap<String, u64>,
    /// CPU used during the run, in % of one core: `envoys`, `bridge`, `redis` (all nodes),
    /// `generator` (this process).
    pub cpu_pct: std::collections::BTreeMap<String, f64>,
}

impl PacedRun {
    /// The mode's label, and the bridge's delay when there was one.
    pub fn label(&self) -> String {
        match &self.limiter {
            Some(peer) => format!("{peer}, {}", self.mode.load_label()),
            None => with_bridge_delay(self.mode.label(), self.bridge_delay_ms),
        }
    }

    /// The mode's title, and the bridge's delay when there was one.
    pub fn title(&self) -> String {
        with_bridge_delay(self.mode.title(), self.bridge_delay_ms)
    }

    /// Requests that weir's failure mode decided (the bridge failed, or the call they
    /// would have waited on had all the waiters it may hold): allowed ones answer 200
    /// without an admission of the limit, so `admitted` counts them and the checker does not.
    pub fn failure_mode_decisions(&self) -> u64 {
        ["failure_allowed", "failure_denied", "failure_local"]
            .iter()
            .map(|k| self.rule_stats.get(*k).copied().unwrap_or(0))
            .sum()
    }

    /// Bridge calls per request sent.
    pub fn bridge_calls_per_request(&self) -> f64 {
        self.bridge_calls as f64 / self.sent.max(1) as f64
    }
}

/// `name`, followed by what a delaying proxy added to the bridge's round trips if anything.
pub fn with_bridge_delay(name: &str, ms: u64) -> String {
    match ms {
        0 => name.to_string(),
        ms => format!("{name}, bridge +{ms} ms"),
    }
}

/// Runs `mode`'s schedule for `seconds`, spread over `ports` (threads are dealt to the
/// ports by [`Mode::envoy_weights`]), each `GET path` with `x-key: key`.
pub fn paced(mode: Mode, ports: &[u16], seconds: u64, key: &str) -> PacedRun {
    assert!(!ports.is_empty());
    let threads = THREADS;
    let schedule = Arc::new(Schedule::new(&mode.schedule(seconds)));
    let duration_us = schedule.end_us;
    // Connect everyone first; start together a little later.
    let clients: Vec<(usize, Client)> = (0..threads)
        .map(|g| {
            let port = thread_port(ports, mode.envoy_weights(), g);
            let c = Client::connect(port)
                .unwrap_or_else(|e| panic!("cannot connect to 127.0.0.1:{port}: {e}"));
            (g, c)
        })
        .collect();
    let start = Instant::now() + Duration::from_millis(200);
    let end = start + Duration::from_micros(duration_us);
    let key: Arc<str> = Arc::from(key);
    let handles: Vec<_> = clients
        .into_iter()
        .map(|(g, mut client)| {
            let key = Arc::clone(&key);
            let schedule = Arc::clone(&schedule);
            let path = mode.path();
            thread::spawn(move || {
                let mut events = Vec::new();
                let mut max_lag_us = 0u64;
                for k in 0u64.. {
                    let Some(due_us) = schedule.due_us(k * threads as u64 + g as u64) else {
                        break;
                    };
                    let due = start + Duration::from_micros(due_us);
                    let now = Instant::now();
                    if now >= end {
                        // Behind schedule at the end: what was not sent is not sent.
                        break;
                    }
                    if due > now {
                        thread::sleep(due - now);
                    } else {
                        max_lag_us = max_lag_us.max((now - due).as_micros() as u64);
                    }
                    let sent_us = start.elapsed().as_micros() as u64;
                    let req = Request::get(path).header("x-key", key.as_bytes());
                    let status = match client.request(req) {
                        Ok(r) => r.status,
                        Err(_) => {
                            // A fresh connection for the next request.
                            if let Ok(c) = Client::connect(client.port()) {
                                client = c;
                            }
                            0
                        }
                    };
                    let done_us = start.elapsed().as_micros() as u64;
                    events.push(Event {
                        sent_us,
                        done_us,
                        status,
                    });
                }
                (events, max_lag_us)
            })
        })
        .collect();
    let mut events = Vec::new();
    let mut max_lag_us = 0;
    for h in handles {
        let (e, lag) = h
            .join()
            .unwrap_or_else(|_| panic!("a load thread panicked"));
        events.extend(e);
        max_lag_us = max_lag_us.max(lag);
    }
    summarize(mode, seconds, &events, max_lag_us)
}

/// [`paced`], with the CPU each group of processes used over the run (`groups`: a name
/// and its pids, the Envoys first): `cpu_pct` in % of one core, and the Envoys' CPU per
/// request sent.
pub fn paced_with_cpu(
    mode: Mode,
    ports: &[u16],
    seconds: u64,
    key: &str,
    groups: &[(&str, Vec<u32>)],
) -> PacedRun {
    let cpu = |pids: &[u32]| -> u64 { pids.iter().map(|&p| sys::process_cpu_us(p)).sum() };
    let cpu0: Vec<u64> = groups.iter().map(|(_, p)| cpu(p)).collect();
    let t0 = Instant::now();
    let mut run = paced(mode, ports, seconds, key);
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
    run.envoy_cpu_us_per_request =
        used.first().copied().unwrap_or(0) as f64 / run.sent.max(1) as f64;
    run
}

/// The port thread `g` sends to: the threads dealt to `ports` in proportion to `weights`
/// (cycling through them), all to the first when there is one port.
fn thread_port(ports: &[u16], weights: &[usize], g: usize) -> u16 {
    let cycle: usize = weights.iter().sum::<usize>().max(1);
    let mut slot = g % cycle;
    for (i, &w) in weights.iter().enumerate() {
        if slot < w {
            return ports[i % ports.len()];
        }
        slot -= w;
    }
    ports[0]
}

/// When each request of a run is due: the phases laid end to end, request `i` of a phase
/// of `rps` at `i / rps` from its start.
struct Schedule {
    /// (start µs, rps, requests before this phase, requests in it)
    phases: Vec<(u64, f64, u64, u64)>,
    end_us: u64,
}

impl Schedule {
    fn new(phases: &[Phase]) -> Schedule {
        let mut at_us = 0u64;
        let mut before = 0u64;
        let mut out = Vec::new();
        for p in phases {
            let n = (p.rps * p.secs) as u64;
            out.push((at_us, p.rps, before, n));
            before += n;
            at_us += (p.secs * 1e6) as u64;
        }
        Schedule {
            phases: out,
            end_us: at_us,
        }
    }

    /// Request `i`'s instant, µs from the start; `None` past the last.
    fn due_us(&self, i: u64) -> Option<u64> {
        let &(start, rps, before, _) = self
            .phases
            .iter()
            .find(|&&(_, _, before, n)| i >= before && i < before + n)?;
        Some(start + ((i - before) as f64 * 1e6 / rps) as u64)
    }
}

fn summarize(mode: Mode, seconds: u64, events: &[Event], max_lag_us: u64) -> PacedRun {
    let (rate, burst) = mode.limit();
    let n = seconds as usize;
    let mut admitted_per_second = vec![0u64; n];
    let mut sent_per_second = vec![0u64; n];
    let (mut admitted, mut limited, mut failed) = (0, 0, 0);
    for e in events {
        let s = ((e.sent_us / 1_000_000) as usize).min(n.saturating_sub(1));
        if let Some(x) = sent_per_second.get_mut(s) {
            *x += 1;
        }
        match e.status {
            200 => {
                admitted += 1;
                if let Some(x) = admitted_per_second.get_mut(s) {
                    *x += 1;
                }
            }
            429 => limited += 1,
            _ => failed += 1,
        }
    }
    let first = events.iter().map(|e| e.sent_us).min().unwrap_or(0);
    let last_done = events.iter().map(|e| e.done_us).max().unwrap_or(0);
    let span_s = last_done.saturating_sub(first) as f64 / 1e6;
    let exact_bound = (burst + 1) as f64 + rate as f64 * span_s;
    let a = admitted as f64;
    let over_pct = ((a - exact_bound).max(0.0)) * 100.0 / exact_bound;
    let under_pct = ((exact_bound - a).max(0.0)) * 100.0 / exact_bound;
    let mut latencies: Vec<u64> = events.iter().map(|e| e.done_us - e.sent_us).collect();
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() - 1) as f64 * p).round() as usize;
        latencies.get(i).copied().unwrap_or(0) as f64 / 1000.0
    };
    PacedRun {
        mode,
        limiter: None,
        bridge_delay_ms: 0,
        seconds,
        sent: events.len() as u64,
        sent_rps: events.len() as f64 / seconds.max(1) as f64,
        rate,
        burst,
        multiple: mode.multiple(),
        violation: None,
        checked_admissions: 0,
        envoy_cpu_us_per_request: 0.0,
        admitted,
        limited,
        failed,
        span_s,
        exact_bound,
        over_pct,
        under_pct,
        admitted_per_second,
        sent_per_second,
        max_lag_ms: max_lag_us as f64 / 1000.0,
        p50_ms: pct(0.5),
        p99_ms: pct(0.99),
        bridge_calls: 0,
        redis_scripts: 0,
        redis_granted: 0,
        rule_stats: Default::default(),
        cpu_pct: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_counts_the_burst_and_the_rate_over_the_span() {
        let mut events = Vec::new();
        // 2 s of sends, 1200 admitted in the first second, 1000 in the second.
        for i in 0..2200u64 {
            let sent_us = if i < 1200 {
                i * 800
            } else {
                1_000_000 + (i - 1200) * 999
            };
            events.push(Event {
                sent_us,
                done_us: sent_us + 1000,
                status: 200,
            });
        }
        events.push(Event {
            sent_us: 1_999_000,
            done_us: 2_000_000,
            status: 429,
        });
        let r = summarize(Mode::Local, 2, &events, 0);
        assert_eq!((r.rate, r.burst), (RATE, BURST));
        assert_eq!(r.admitted_per_second, vec![1200, 1000]);
        assert_eq!(r.admitted, 2200);
        assert_eq!(r.limited, 1);
        assert!((r.span_s - 2.0).abs() < 1e-9);
        assert!((r.exact_bound - 2100.0).abs() < 1e-6);
        assert!((r.over_pct - 100.0 / 2100.0 * 100.0).abs() < 1e-6);
        assert_eq!(r.under_pct, 0.0);
    }

    /// The uneven runs send 90 % of the load to the first Envoy, or all of it; the others
    /// split it evenly.
    #[test]
    fn threads_are_dealt_to_the_envoys_by_the_modes_weights() {
        let share = |mode: Mode| -> Vec<usize> {
            let mut n = vec![0; 2];
            for g in 0..THREADS {
                let port = thread_port(&[1, 2], mode.envoy_weights(), g);
                n[port as usize - 1] += 1;
            }
            n
        };
        assert_eq!(share(Mode::GlobalExact), vec![THREADS / 2, THREADS / 2]);
        assert_eq!(share(Mode::GlobalLeasedUneven), vec![72, 8]);
        assert_eq!(share(Mode::GlobalExactOneEnvoy), vec![THREADS, 0]);
        // One port (the local Envoy): every thread to it.
        assert!((0..THREADS).all(|g| thread_port(&[7], Mode::Local.envoy_weights(), g) == 7));
        for mode in Mode::ALL.into_iter().filter(|m| m.is_uneven()) {
            assert_eq!(mode.multiple(), UNEVEN_MULTIPLE, "{mode:?}");
            assert!(mode.is_global(), "{mode:?}");
        }
    }

    /// Each mode's requests are decided by its own rule alone (a prefix `/leased` once also
    /// caught `/leased-20x`, whose requests then had to pass both limits).
    #[test]
    fn each_mode_path_matches_its_rule_only() {
        use weir_core::rules::{Fact, FactSource, Facts};
        #[derive(Clone)]
        struct Path(&'static str);
        impl FactSource for Path {
            fn fetch(&mut self, fact: &Fact) -> Option<Vec<u8>> {
                match fact {
                    Fact::Header(h) if h == ":path" => Some(self.0.as_bytes().to_vec()),
                    Fact::Header(h) if h == "x-key" => Some(b"k".to_vec()),
                    _ => None,
                }
            }
        }
        for mode in Mode::ALL {
            let json = if mode.is_global() {
                global_config()
            } else {
                local_config()
            };
            let config = weir_core::config::parse(json.as_bytes()).unwrap();
            let mut facts = Facts::new(&config.facts, Path(mode.path()));
            let matched: Vec<&str> = config
                .rules
                .iter()
                .filter(|r| r.matches(&mut facts))
                .map(|r| r.name.as_str())
                .collect();
            assert_eq!(matched, [mode.rule().as_str()], "{mode:?}");
        }
    }

    /// The slowed runs use the global config as it is: its bridge timeout must leave a slow
    /// answer room to be an answer, not the failure mode (50 ms by default).
    #[test]
    fn the_bridge_timeout_leaves_room_for_the_slowest_bridge() {
        let config = weir_core::config::parse(global_config().as_bytes()).unwrap();
        let timeout_ms = config.bridge.unwrap().timeout_ms;
        let slowest = SLOW_BRIDGE_MS.into_iter().max().unwrap();
        assert!(
            timeout_ms >= slowest + 200,
            "bridge.timeout {timeout_ms} ms"
        );
        assert!(SLOWED.iter().all(|m| m.is_global()));
    }

    #[test]
    fn schedules_lay_phases_end_to_end() {
        let s = Schedule::new(&[
            Phase {
                rps: 1000.0,
                secs: 1.0,
            },
            Phase {
                rps: 0.0,
                secs: 0.5,
            },
            Phase {
                rps: 100.0,
                secs: 0.1,
            },
        ]);
        assert_eq!(s.end_us, 1_600_000);
        assert_eq!(s.due_us(0), Some(0));
        assert_eq!(s.due_us(999), Some(999_000));
        // The silence holds no request: the next is the burst's first.
        assert_eq!(s.due_us(1000), Some(1_500_000));
        assert_eq!(s.due_us(1009), Some(1_590_000));
        assert_eq!(s.due_us(1010), None);
    }
}
