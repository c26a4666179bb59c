//! Accuracy: how close a limit holds under ~5× its rate, against the exact bound.
//!
//! wrk cannot pace, so this is a small paced load generator: `threads` threads, each with
//! one keep-alive connection, thread `g` of `T` sending its `k`-th request at
//! `start + (k·T + g) / rate`. A thread that falls behind (a slow answer) sends at once
//! until it is back on schedule, and stops at the end of the run whatever it did not
//! send, so every request falls in the run's seconds. The rate actually sent and how far
//! behind any thread fell are reported: when the machine cannot answer the offered rate,
//! the figures say so rather than hide it.
//!
//! The exact bound of a GCRA limit of `rate` per second with burst `b` over an interval
//! of `t` seconds is `b + 1 + rate · t`: it starts full (`b + 1` at once) and admits one
//! more every `1/rate`. `t` runs from the first request sent to the last answer received,
//! the longest span in which the limiter can have decided.

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use weir_e2e::{Client, Request};

/// The limit under test: GCRA, `RATE` per second, burst `BURST` (so `BURST + 1` at once).
pub const RATE: u64 = 1000;
pub const BURST: u64 = 99;
/// Offered load, requests per second over all Envoys: 5× the limit.
pub const OFFERED: f64 = 5000.0;
/// Leased mode: most units one lease asks for, and how long they stay valid.
pub const LEASE_MAX: u64 = 50;
pub const LEASE_TTL: &str = "1s";
/// Client threads (= keep-alive connections) per run: enough that answers taking
/// 16 ms (a saturated machine) still let 5,000 requests/s out.
pub const THREADS: usize = 80;

fn limit_json() -> String {
    format!(r#""limit": {{"algorithm": "gcra", "rate": {RATE}, "period": "1s", "burst": {BURST}}}"#)
}

/// The plugin config of the two global Envoys: `/exact` and `/leased` each have a rule.
pub fn global_config() -> String {
    let limit = limit_json();
    format!(
        r#"{{"bridge": {{"cluster": "weir_bridge", "timeout": "250ms"}}, "rules": [
  {{"name": "acc-exact", "match": {{"path": {{"prefix": "/exact"}}}}, "key": [{{"header": "x-key"}}],
   "scope": "global", {limit}, "global": {{"expected_instances": 2}}}},
  {{"name": "acc-leased", "match": {{"path": {{"prefix": "/leased"}}}}, "key": [{{"header": "x-key"}}],
   "scope": "global", {limit},
   "global": {{"lease": {{"max": {LEASE_MAX}, "ttl": "{LEASE_TTL}"}}, "expected_instances": 2}}}}]}}"#
    )
}

/// The plugin config of the local Envoy (4 workers).
pub fn local_config() -> String {
    let limit = limit_json();
    format!(
        r#"{{"rules": [{{"name": "acc-local", "match": {{"path": {{"prefix": "/local"}}}},
  "key": [{{"header": "x-key"}}], {limit}}}]}}"#
    )
}

/// One mode of the accuracy run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    GlobalExact,
    GlobalLeased,
    Local,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::GlobalExact, Mode::GlobalLeased, Mode::Local];

    pub fn path(self) -> &'static str {
        match self {
            Mode::GlobalExact => "/exact",
            Mode::GlobalLeased => "/leased",
            Mode::Local => "/local",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Mode::GlobalExact => "global, exact (lease 1), 2 Envoys × 2 workers",
            Mode::GlobalLeased => "global, leases (max 50, ttl 1s), 2 Envoys × 2 workers",
            Mode::Local => "local, 1 Envoy × 4 workers",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Mode::GlobalExact => "global exact",
            Mode::GlobalLeased => "global leased",
            Mode::Local => "local, 4 workers",
        }
    }
}

/// One request's fate.
#[derive(Clone, Copy, Debug)]
struct Event {
    sent_us: u64,
    done_us: u64,
    /// HTTP status, 0 for an I/O error.
    status: u16,
}

/// What a paced run measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PacedRun {
    pub mode: Mode,
    pub seconds: u64,
    pub sent: u64,
    /// Requests sent per second of the run (the schedule asks for [`OFFERED`]).
    pub sent_rps: f64,
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

/// Sends `OFFERED` requests per second for `seconds`, spread over `ports` (threads are
/// dealt round-robin to the ports), each `GET path` with `x-key: key`.
pub fn paced(mode: Mode, ports: &[u16], seconds: u64, key: &str) -> PacedRun {
    assert!(!ports.is_empty());
    let threads = THREADS;
    let duration_us = seconds * 1_000_000;
    let period_us = 1e6 / OFFERED;
    // Connect everyone first; start together a little later.
    let clients: Vec<(usize, Client)> = (0..threads)
        .map(|g| {
            let port = ports[g % ports.len()];
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
            let path = mode.path();
            thread::spawn(move || {
                let mut events = Vec::new();
                let mut max_lag_us = 0u64;
                for k in 0u64.. {
                    let due_us = ((k * threads as u64 + g as u64) as f64 * period_us) as u64;
                    if due_us >= duration_us {
                        break;
                    }
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

fn summarize(mode: Mode, seconds: u64, events: &[Event], max_lag_us: u64) -> PacedRun {
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
    let exact_bound = (BURST + 1) as f64 + RATE as f64 * span_s;
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
        seconds,
        sent: events.len() as u64,
        sent_rps: events.len() as f64 / seconds.max(1) as f64,
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
        assert_eq!(r.admitted_per_second, vec![1200, 1000]);
        assert_eq!(r.admitted, 2200);
        assert_eq!(r.limited, 1);
        assert!((r.span_s - 2.0).abs() < 1e-9);
        assert!((r.exact_bound - 2100.0).abs() < 1e-6);
        assert!((r.over_pct - 100.0 / 2100.0 * 100.0).abs() < 1e-6);
        assert_eq!(r.under_pct, 0.0);
    }
}
