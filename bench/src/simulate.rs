//! `weir-bench simulate`: a fleet of Envoys without Envoy processes, against the real
//! weir-bridge (release build) and a real Redis Cluster of 3 masters and 3 replicas.
//!
//! Each simulated Envoy is `weir_testkit::simulation::SimEnvoy`: the filter's own engine,
//! leases, reservations and denial cache over its own shared data. Requests for a key go
//! to Envoys at random; a request whose rule must ask the bridge makes a real HTTP call to
//! `/v2/acquire` (keep-alive, one connection per thread) and is finished with the answer,
//! on the wall clock, as a filter would. Threads own disjoint sets of Envoys, so one
//! Envoy's calls never overlap (as with one worker each).
//!
//! Measured: bridge calls per second and per request, Redis commands per second per
//! master (`INFO commandstats`, EVALSHA counted as one command, the commands the script
//! runs counted too), the bridge's CPU per call, the simulator's own CPU per request, and
//! the conformance of every admission, key by key — next to what the capacity model of
//! docs/capacity.md predicts for the same profile ([`predict`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use weir_core::conformance::{self, Admission};
use weir_core::key::Seed;
use weir_core::rules::{Fact, FactSource, Lease, RuleId, Scope};
use weir_e2e::{Bridge, Client, Request};
use weir_testkit::simulation::{admissions, configured_limit, SimEnvoy};

use crate::sys;

/// One fleet to simulate.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Profile {
    pub name: String,
    pub envoys: usize,
    pub keys: usize,
    /// The first `hot` keys are offered `hot_multiple` × their limit, the others
    /// `cold_multiple` ×.
    pub hot: usize,
    pub hot_multiple: f64,
    pub cold_multiple: f64,
    /// Every key's limit: GCRA `rate` per second, burst `burst`.
    pub rate: u64,
    pub burst: u64,
    pub lease_max: u64,
    /// `lease.ttl`; `None`: the default (a quarter of the burst's time, at most 1 s).
    pub ttl_ms: Option<u64>,
    pub horizon_ms: u64,
    pub secs: u64,
    pub threads: usize,
}

impl Profile {
    /// The profiles `just bench-sim` runs: a large fleet with thin traffic per Envoy and
    /// key, and a small fleet with hot keys.
    pub fn defaults() -> Vec<Profile> {
        vec![
            Profile {
                name: "1,000 Envoys × 10,000 keys, thin".into(),
                envoys: 1000,
                keys: 10_000,
                hot: 0,
                hot_multiple: 0.0,
                cold_multiple: 0.02,
                rate: 10,
                burst: 9,
                lease_max: 10,
                ttl_ms: Some(100),
                horizon_ms: 100,
                secs: 20,
                threads: 8,
            },
            Profile {
                name: "20 Envoys × 100 keys, 5 hot at 20×".into(),
                envoys: 20,
                keys: 100,
                hot: 5,
                hot_multiple: 20.0,
                cold_multiple: 0.2,
                rate: 100,
                burst: 99,
                lease_max: 50,
                ttl_ms: None,
                horizon_ms: 100,
                secs: 20,
                threads: 8,
            },
        ]
    }

    /// The same profile for a couple of seconds.
    pub fn smoke(mut self) -> Profile {
        self.secs = 2;
        self.envoys = self.envoys.min(50);
        self.keys = self.keys.min(500);
        self.hot = self.hot.min(self.keys);
        self
    }

    fn config(&self) -> String {
        let ttl = self
            .ttl_ms
            .map(|ms| format!(r#", "ttl": "{ms}ms""#))
            .unwrap_or_default();
        format!(
            r#"{{"bridge": {{"cluster": "weir_bridge"}}, "rules": [{{"name": "tenant", "scope": "global",
  "key": [{{"header": "x-key"}}], "max_keys": {max_keys},
  "limit": {{"algorithm": "gcra", "rate": {rate}, "period": "1s", "burst": {burst}}},
  "global": {{"lease": {{"max": {max}{ttl}, "horizon": "{horizon}ms"}},
              "expected_instances": {envoys}}}}}]}}"#,
            max_keys = self.keys.clamp(4, 4096),
            rate = self.rate,
            burst = self.burst,
            max = self.lease_max,
            horizon = self.horizon_ms,
            envoys = self.envoys,
        )
    }

    /// The rule's lease and the burst Redis enforces, as the filter compiles them: the
    /// hold a call asks for is `ttl` plus the bridge's round trip as the plugin measured
    /// it, at most `hold_max` (`ttl` plus `lease.round_trip`), and a GCRA key pays for
    /// that longest hold with burst (`weir_core::rules::Lease::hold_for`).
    fn compiled(&self) -> (Lease, u64) {
        let config = weir_core::config::parse(self.config().as_bytes())
            .unwrap_or_else(|e| panic!("simulate: the profile's config: {e}"));
        match config.rule(RuleId(0)).map(|rule| &rule.scope) {
            Some(Scope::Global(global)) => {
                let lease = global
                    .lease
                    .unwrap_or_else(|| panic!("simulate: the profile's rule has no lease"));
                // GCRA's parameters: rate, period, burst.
                let burst = global.redis_limit.algorithm().parameters()[2];
                (lease, burst)
            }
            _ => panic!("simulate: the profile's rule is not global"),
        }
    }

    /// Requests per second offered to key `k`.
    fn key_rps(&self, k: usize) -> f64 {
        let multiple = if k < self.hot {
            self.hot_multiple
        } else {
            self.cold_multiple
        };
        multiple * self.rate as f64
    }

    fn offered_rps(&self) -> f64 {
        (0..self.keys).map(|k| self.key_rps(k)).sum()
    }
}

/// What the capacity model of docs/capacity.md predicts for a profile.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Prediction {
    pub calls_per_s: f64,
    pub calls_per_request: f64,
    /// Redis script calls per second on the busiest master (hot keys land on one master
    /// each; the rest spread evenly over the 3).
    pub scripts_per_s_busiest_master: f64,
}

/// The model: requests for a key reach each of `E` Envoys at `d = rate_k / E` per
/// second. Far from the limit one call takes `u = clamp(⌈d · hold⌉, 1, min(lease.max,
/// max(1, ⌊(burst_redis + 1) / E⌋)))` units: what the Envoy would spend within the hold
/// (here its longest, `hold_max`, which is what a call asks for until the plugin has
/// measured the bridge's round trip, and its bound after), no more than its share of what
/// Redis has left (`expected_instances` = `E`), so the pair costs `d / u` calls per
/// second. At saturation a GCRA pair reserves its share of the next `horizon` and calls
/// about once per horizon: `min(d, 1 / horizon)`. Each call runs one script (one rule).
pub fn predict(p: &Profile) -> Prediction {
    let e = p.envoys as f64;
    let (lease, burst_redis) = p.compiled();
    let hold_s = lease.hold_max_us as f64 / 1e6;
    let horizon_s = lease.horizon_us as f64 / 1e6;
    let share = ((burst_redis + 1) as f64 / e).floor().max(1.0);
    let per_key = |k: usize| {
        let d = p.key_rps(k) / e;
        if d == 0.0 {
            return 0.0;
        }
        let saturated = p.key_rps(k) > p.rate as f64;
        let per_pair = if saturated {
            d.min(1.0 / horizon_s)
        } else {
            let u = (d * hold_s)
                .ceil()
                .clamp(1.0, (p.lease_max as f64).min(share).max(1.0));
            d / u
        };
        per_pair * e
    };
    let calls: Vec<f64> = (0..p.keys).map(per_key).collect();
    let total: f64 = calls.iter().sum();
    let hot: f64 = calls.iter().take(p.hot).sum();
    let cold = total - hot;
    // Hot keys: each on one master; the busiest holds at least ⌈hot / 3⌉ of them.
    let hot_each = if p.hot > 0 { hot / p.hot as f64 } else { 0.0 };
    let busiest = cold / 3.0 + hot_each * (p.hot as f64 / 3.0).ceil();
    Prediction {
        calls_per_s: total,
        calls_per_request: total / p.offered_rps().max(1e-9),
        scripts_per_s_busiest_master: busiest,
    }
}

/// What one profile measured.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SimRun {
    pub profile: Profile,
    pub predicted: Prediction,
    pub offered_rps: f64,
    /// Requests the simulator got through per second (it lags when the machine cannot
    /// keep up: compare with `offered_rps`).
    pub simulated_rps: f64,
    pub requests: u64,
    pub admitted: u64,
    pub bridge_calls: u64,
    pub bridge_errors: u64,
    pub calls_per_s: f64,
    pub calls_per_request: f64,
    /// Redis commands per second on each master (all commands but INFO), and scripts.
    pub redis_commands_per_s: Vec<f64>,
    pub redis_scripts_per_s: Vec<f64>,
    pub bridge_cpu_us_per_call: f64,
    pub simulator_cpu_us_per_request: f64,
    pub keys_checked: usize,
    /// Conformance violations, key by key (0 expected).
    pub violations: Vec<String>,
    /// Hot keys: admitted against the bound `burst + 1 + rate · secs`, %.
    pub hot_under_pct: Option<f64>,
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A request of the simulation: just its key.
#[derive(Clone)]
struct KeyRequest(String);

impl FactSource for KeyRequest {
    fn fetch(&mut self, fact: &Fact) -> Option<Vec<u8>> {
        match fact {
            Fact::Header(h) if h == "x-key" => Some(self.0.as_bytes().to_vec()),
            Fact::Header(h) if h == ":path" => Some(b"/".to_vec()),
            _ => None,
        }
    }
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

/// Per-thread results.
#[derive(Default)]
struct Tally {
    requests: u64,
    admitted: u64,
    calls: u64,
    errors: u64,
    per_key: BTreeMap<usize, Vec<Admission>>,
}

/// Runs one profile against `bridge` (and its `redis`, whose masters are `masters`).
pub fn run(p: &Profile, bridge: &Bridge, masters: &[u16]) -> SimRun {
    let config = p.config();
    let envoys: Vec<SimEnvoy> = (0..p.envoys)
        .map(|i| {
            let mut seed = [0u8; 16];
            seed[..8].copy_from_slice(&(i as u64 + 1).to_le_bytes());
            SimEnvoy::new(&config, Seed(seed))
                .unwrap_or_else(|e| panic!("simulate: the profile's config: {e}"))
        })
        .collect();
    let limit = configured_limit(&envoys[0].engine, weir_core::rules::RuleId(0))
        .unwrap_or_else(|| panic!("simulate: no rule"));
    let envoys = Arc::new(envoys);
    // Keys are offered as one Poisson stream: each thread draws its share of it.
    let total_rps = p.offered_rps();
    let cumulative: Arc<Vec<f64>> = Arc::new(
        (0..p.keys)
            .scan(0.0, |acc, k| {
                *acc += p.key_rps(k);
                Some(*acc)
            })
            .collect(),
    );
    let per_master0 = per_master(masters);
    let bridge_cpu0 = sys::process_cpu_us(bridge.pid());
    let self_cpu0 = sys::process_cpu_us(std::process::id());
    let started = Instant::now();
    let end = started + Duration::from_secs(p.secs);
    let tallies = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..p.threads)
        .map(|t| {
            let (envoys, cumulative, tallies) = (
                Arc::clone(&envoys),
                Arc::clone(&cumulative),
                Arc::clone(&tallies),
            );
            let (threads, port) = (p.threads, bridge.port);
            let n_envoys = p.envoys;
            thread::spawn(move || {
                let mine: Vec<usize> = (t..n_envoys).step_by(threads).collect();
                let rps = total_rps * mine.len() as f64 / n_envoys as f64;
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
                let mut client = Client::connect(port)
                    .unwrap_or_else(|e| panic!("simulate: cannot reach the bridge: {e}"));
                let mut tally = Tally::default();
                let mut due = Instant::now();
                while due < end && !mine.is_empty() {
                    due += Duration::from_secs_f64(-rng.unit().ln() / rps);
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        thread::sleep(wait);
                    }
                    let x = rng.unit() * cumulative.last().copied().unwrap_or(0.0);
                    let key = cumulative
                        .partition_point(|&c| c < x)
                        .min(cumulative.len().saturating_sub(1));
                    let envoy = &envoys[mine[(rng.next() % mine.len() as u64) as usize]];
                    let sent_at = now_us();
                    let mut eval = envoy.evaluate(KeyRequest(format!("k{key}")), sent_at);
                    if !eval.pending.is_empty() {
                        tally.calls += 1;
                        let body = envoy.bridge_request(&eval);
                        let answer = client.request(Request::post("/v2/acquire", body));
                        let now = now_us();
                        match &answer {
                            Ok(r) => {
                                tally.errors += u64::from(r.status != 200);
                                envoy.complete(&mut eval, sent_at, now, Ok((r.status, &r.body)));
                            }
                            Err(_) => {
                                // As Envoy reports a connection that failed: status 0.
                                tally.errors += 1;
                                envoy.complete(&mut eval, sent_at, now, Ok((0, &[])));
                                if let Ok(c) = Client::connect(port) {
                                    client = c;
                                }
                            }
                        }
                    }
                    tally.requests += 1;
                    for (_, a) in admissions(&eval) {
                        tally.admitted += a.cost;
                        tally.per_key.entry(key).or_default().push(a);
                    }
                }
                if let Ok(mut all) = tallies.lock() {
                    all.push(tally);
                }
            })
        })
        .collect();
    for h in handles {
        let _ = h.join();
    }
    let wall = started.elapsed().as_secs_f64();
    let bridge_cpu = sys::process_cpu_us(bridge.pid()).saturating_sub(bridge_cpu0);
    let self_cpu = sys::process_cpu_us(std::process::id()).saturating_sub(self_cpu0);
    let per_master1 = per_master(masters);
    let tallies = Arc::try_unwrap(tallies)
        .ok()
        .and_then(|m| m.into_inner().ok())
        .unwrap_or_default();
    let mut per_key: BTreeMap<usize, Vec<Admission>> = BTreeMap::new();
    let (mut requests, mut admitted, mut calls, mut errors) = (0, 0, 0, 0);
    for t in tallies {
        requests += t.requests;
        admitted += t.admitted;
        calls += t.calls;
        errors += t.errors;
        for (k, mut a) in t.per_key {
            per_key.entry(k).or_default().append(&mut a);
        }
    }
    let mut violations = Vec::new();
    for (k, a) in per_key.iter_mut() {
        a.sort_by_key(|x| x.at_us);
        if let Err(v) = conformance::check(&limit, a) {
            violations.push(format!("key k{k}: {v:?}"));
        }
    }
    let hot_under_pct = (p.hot > 0).then(|| {
        let bound = (p.burst + 1) as f64 + p.rate as f64 * wall;
        let hot_admitted: f64 = (0..p.hot)
            .map(|k| {
                per_key
                    .get(&k)
                    .map_or(0, |a| a.iter().map(|x| x.cost).sum::<u64>()) as f64
            })
            .sum::<f64>()
            / p.hot as f64;
        ((bound - hot_admitted).max(0.0) * 100.0 / bound).max(0.0)
    });
    let rate = |before: &[(u64, u64)], after: &[(u64, u64)], pick: fn(&(u64, u64)) -> u64| {
        before
            .iter()
            .zip(after)
            .map(|(b, a)| pick(a).saturating_sub(pick(b)) as f64 / wall)
            .collect::<Vec<f64>>()
    };
    SimRun {
        profile: p.clone(),
        predicted: predict(p),
        offered_rps: total_rps,
        simulated_rps: requests as f64 / wall,
        requests,
        admitted,
        bridge_calls: calls,
        bridge_errors: errors,
        calls_per_s: calls as f64 / wall,
        calls_per_request: calls as f64 / requests.max(1) as f64,
        redis_commands_per_s: rate(&per_master0, &per_master1, |x| x.0),
        redis_scripts_per_s: rate(&per_master0, &per_master1, |x| x.1),
        bridge_cpu_us_per_call: bridge_cpu as f64 / calls.max(1) as f64,
        simulator_cpu_us_per_request: self_cpu as f64 / requests.max(1) as f64,
        keys_checked: per_key.len(),
        violations,
        hot_under_pct,
    }
}

/// (all commands but INFO, scripts) so far on each master.
fn per_master(masters: &[u16]) -> Vec<(u64, u64)> {
    masters
        .iter()
        .map(|&m| crate::cost::redis_commands(&[m]))
        .collect()
}

/// Starts a Redis Cluster and the release bridge, runs `profiles`, returns the runs.
pub fn run_all(profiles: &[Profile]) -> Vec<SimRun> {
    let (_redis, bridge, masters) = crate::start_redis_and_bridge();
    profiles
        .iter()
        .map(|p| {
            crate::log(format!("simulate: {} for {} s", p.name, p.secs));
            let r = run(p, &bridge, &masters);
            crate::log(format!(
                "simulate: {}: {:.0} requests/s simulated (offered {:.0}), {:.0} bridge calls/s \
                 (model {:.0}), {:.4} per request (model {:.4}), Redis commands/s per master {:?}, \
                 scripts/s per master {:?} (model, busiest: {:.0}), bridge {:.1} µs CPU per call, \
                 simulator {:.1} µs CPU per request, {} keys checked, {} violations, {} bridge errors",
                p.name,
                r.simulated_rps,
                r.offered_rps,
                r.calls_per_s,
                r.predicted.calls_per_s,
                r.calls_per_request,
                r.predicted.calls_per_request,
                r.redis_commands_per_s.iter().map(|x| x.round()).collect::<Vec<_>>(),
                r.redis_scripts_per_s.iter().map(|x| x.round()).collect::<Vec<_>>(),
                r.predicted.scripts_per_s_busiest_master,
                r.bridge_cpu_us_per_call,
                r.simulator_cpu_us_per_request,
                r.keys_checked,
                r.violations.len(),
                r.bridge_errors
            ));
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_counts_thin_pairs_as_one_call_per_request_and_hot_pairs_per_horizon() {
        let mut p = Profile::defaults().remove(1);
        // Cold keys: 20 req/s over 20 Envoys = 1/s per pair, hold 20 ms: one call per
        // request. Hot keys: 2,000 req/s over 20 Envoys = 100/s per pair, one call per
        // 100 ms horizon = 10/s per pair.
        p.hot = 1;
        p.keys = 2;
        // The default `ttl` (a quarter of the burst, 240 ms) and round trip (the bridge's
        // 50 ms timeout): docs/capacity.md's row and docs/global.md quote this hold.
        let (lease, burst_redis) = p.compiled();
        assert_eq!((lease.ttl_us, lease.hold_max_us), (240_000, 290_000));
        assert_eq!(burst_redis, 99 - 29);
        let m = predict(&p);
        let cold = 20.0;
        let hot = 10.0 * 20.0;
        assert!((m.calls_per_s - (cold + hot)).abs() < 1e-6, "{m:?}");
    }
}
