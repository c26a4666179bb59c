//! Several Envoys sharing one global key, in simulated time: each runs the engine on its
//! own shared data, calls a model of the bridge (the core's own grant references) with a
//! latency, and every admission of every Envoy is judged by `conformance::check`.
//!
//! This is where a lease that outlives its algorithm's tolerance, a reservation spent
//! late, or a sliding-log unit logged at the wrong instant shows up as a violation —
//! for every algorithm, at 5× and 20× the limit, after an idle period, and with mixed
//! costs. The same runs also bound under-admission and bridge calls per request, so a
//! limiter that is conformant by refusing everything fails too.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::collections::BTreeMap;

use support::{user, FakeRequest, T0};
use weir_core::conformance::{self, Admission};
use weir_core::engine::RuleOutcome;
use weir_testkit::simulation::{
    admissions, configured_limit, with_extra_bursts, Arrival, Decided, Simulation,
};

/// A bridge call: 250 µs out, 250 µs back.
const HALF_LATENCY_US: u64 = 250;

fn config(limit: &str, lease: &str) -> String {
    format!(
        r#"{{"bridge":{{"cluster":"weir_bridge"}},"rules":[{{"name":"api","scope":"global",
            "key":[{{"header":"x-user"}}],"cost":{{"header":"x-cost"}},
            "limit":{limit},
            "global":{{"lease":{lease},"failure_mode":"deny","expected_instances":2}}}}]}}"#
    )
}

/// The algorithms, each with a lease, at about 100 units/s.
fn every_algorithm() -> Vec<(&'static str, String)> {
    vec![
        (
            "gcra",
            config(
                r#"{"algorithm":"gcra","rate":100,"period":"1s","burst":19}"#,
                r#"{"max":20,"ttl":"50ms","horizon":"100ms"}"#,
            ),
        ),
        (
            "token_bucket",
            config(
                r#"{"algorithm":"token_bucket","capacity":20,"refill":5,"period":"50ms"}"#,
                r#"{"max":20,"ttl":"50ms"}"#,
            ),
        ),
        (
            "fixed_window",
            config(
                r#"{"algorithm":"fixed_window","limit":100,"window":"1s"}"#,
                r#"{"max":20,"ttl":"200ms"}"#,
            ),
        ),
        (
            "sliding_window",
            config(
                r#"{"algorithm":"sliding_window","limit":100,"window":"1s"}"#,
                r#"{"max":20,"ttl":"200ms"}"#,
            ),
        ),
        (
            "sliding_log",
            config(
                r#"{"algorithm":"sliding_log","limit":100,"window":"1s"}"#,
                r#"{"max":20,"ttl":"100ms"}"#,
            ),
        ),
    ]
}

/// A small deterministic generator (xorshift), so runs repeat exactly.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// `per_s` requests per second for `secs`, from `t0`, spread over `envoys` at random
/// instants (uniform: about Poisson), all for one key.
fn steady(
    t0: u64,
    per_s: u64,
    secs: u64,
    envoys: usize,
    rng: &mut Rng,
) -> Vec<Arrival<FakeRequest>> {
    let n = per_s * secs;
    (0..n)
        .map(|_| Arrival {
            at_us: t0 + rng.below(secs * 1_000_000),
            envoy: rng.below(envoys as u64) as usize,
            request: user("k"),
        })
        .collect()
}

/// What one run admitted and what it cost.
struct Run {
    decided: Vec<Decided>,
    bridge_calls: u64,
}

impl Run {
    fn admissions(&self) -> Vec<Admission> {
        let mut all: Vec<Admission> = self
            .decided
            .iter()
            .flat_map(|d| admissions(&d.eval))
            .map(|(_, a)| a)
            .collect();
        all.sort_by_key(|a| a.at_us);
        all
    }

    fn admitted(&self) -> u64 {
        self.admissions().iter().map(|a| a.cost).sum()
    }

    fn requests(&self) -> usize {
        self.decided.len()
    }
}

fn play(config: &str, envoys: usize, arrivals: &[Arrival<FakeRequest>]) -> (Simulation, Run) {
    let mut sim = Simulation::new(config, envoys, HALF_LATENCY_US).unwrap();
    let decided = sim.play(arrivals);
    let bridge_calls = sim.bridge.calls;
    (
        sim,
        Run {
            decided,
            bridge_calls,
        },
    )
}

/// Checks every admission of the run against the configured limit; the message names the
/// algorithm and the violation.
fn assert_conformant(name: &str, sim: &Simulation, run: &Run) {
    let limit = configured_limit(&sim.envoys[0].engine, weir_core::rules::RuleId(0)).unwrap();
    if let Err(v) = conformance::check(&limit, &run.admissions()) {
        panic!("{name}: {v:?}");
    }
}

/// Units a limiter of ~100/s with a burst of ~20 can admit in `secs` of saturation:
/// the rate times the time (the burst is slack for the lower bound).
fn floor_at_saturation(secs: u64) -> u64 {
    100 * secs
}

#[test]
fn every_algorithm_keeps_its_bound_at_5x_and_20x_from_four_envoys() {
    for (name, config) in every_algorithm() {
        for multiple in [5, 20] {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ multiple);
            let secs = 4;
            let arrivals = steady(T0, 100 * multiple, secs, 4, &mut rng);
            let (sim, run) = play(&config, 4, &arrivals);
            assert_conformant(&format!("{name} at {multiple}x"), &sim, &run);
            let admitted = run.admitted();
            let calls_per_request = run.bridge_calls as f64 / run.requests() as f64;
            eprintln!(
                "{name} {multiple}x: admitted {admitted} of {} requests, {} bridge calls ({calls_per_request:.4}/request)",
                run.requests(),
                run.bridge_calls
            );
            // Bridge calls at 20×: about one per Envoy per horizon (GCRA reservations,
            // the horizon floor of token buckets and sliding windows), and far fewer for
            // windows, whose denials last until a unit leaves or the window ends.
            if multiple == 20 {
                let budget = match name {
                    "gcra" => 0.03,
                    "token_bucket" => 0.06,
                    "sliding_window" => 0.05,
                    _ => 0.02,
                };
                assert!(
                    calls_per_request <= budget,
                    "{name} at 20x: {calls_per_request:.4} bridge calls per request (budget {budget})"
                );
            }
            // Under-admission: at least 90 % of what the rate allows over the run.
            let floor = floor_at_saturation(secs) * 9 / 10;
            assert!(
                admitted >= floor,
                "{name} at {multiple}x admitted {admitted}, less than {floor}"
            );
        }
    }
}

#[test]
fn bursts_after_an_idle_period_keep_the_bound() {
    for (name, config) in every_algorithm() {
        let mut rng = Rng(0x1234_5678);
        // Warm: every Envoy holds units.
        let mut arrivals = steady(T0, 300, 1, 4, &mut rng);
        // Idle for longer than any tolerance here (burst / rate = 0.2 s) but shorter
        // than a lease could have lived before (leases are bounded now, not by a ttl of
        // seconds): then every Envoy bursts at once.
        let burst_at = T0 + 1_400_000;
        for envoy in 0..4 {
            for i in 0..60u64 {
                arrivals.push(Arrival {
                    at_us: burst_at + i * 10,
                    envoy,
                    request: user("k"),
                });
            }
        }
        let (sim, run) = play(&config, 4, &arrivals);
        assert_conformant(&format!("{name} idle then burst"), &sim, &run);
        let in_burst: u64 = run
            .admissions()
            .iter()
            .filter(|a| a.at_us >= burst_at)
            .map(|a| a.cost)
            .sum();
        eprintln!("{name}: {in_burst} admitted in the burst");
        assert!(
            in_burst >= 10,
            "{name}: only {in_burst} admitted in the burst"
        );
    }
}

#[test]
fn alternating_envoys_and_mixed_costs_keep_the_bound() {
    for (name, config) in every_algorithm() {
        let mut rng = Rng(0xDEAD_BEEF);
        let costs: Vec<u64> = (0..4_000)
            .map(|_| if rng.below(5) == 0 { 10 } else { 1 })
            .collect();
        let arrivals: Vec<Arrival<FakeRequest>> = costs
            .iter()
            .enumerate()
            .map(|(i, cost)| Arrival {
                at_us: T0 + i as u64 * 1_000,
                envoy: i % 2,
                request: user("k").header("x-cost", cost.to_string()),
            })
            .collect();
        let (sim, run) = play(&config, 2, &arrivals);
        assert_conformant(&format!("{name} alternating, costs 1 and 10"), &sim, &run);
        // Cost-1 requests are not held back by a denied cost-10: some pass while
        // cost-10 requests are being denied.
        let mut outcome_by_index = BTreeMap::new();
        for d in &run.decided {
            outcome_by_index.insert(d.index, d.eval.reports[0].outcome);
        }
        let ones_allowed = costs
            .iter()
            .enumerate()
            .filter(|(i, cost)| {
                **cost == 1 && outcome_by_index.get(i) == Some(&RuleOutcome::Allowed)
            })
            .count();
        let admitted = run.admitted();
        eprintln!("{name}: {admitted} units admitted, {ones_allowed} cost-1 requests");
        let floor = floor_at_saturation(4) * 9 / 10;
        assert!(admitted >= floor, "{name}: admitted {admitted} < {floor}");
        // A denial cached per key (not per cost) would hold every cost-1 request back
        // for a cost-10's retry time, each time one is denied: a fifth of the requests.
        assert!(
            ones_allowed >= 100,
            "{name}: {ones_allowed} cost-1 requests allowed"
        );
    }
}

#[test]
fn while_redis_is_down_each_failure_mode_keeps_its_bound() {
    for (name, config) in every_algorithm() {
        for mode in ["allow", "deny", "local"] {
            let config = config
                .replace(
                    r#""failure_mode":"deny""#,
                    &format!(r#""failure_mode":"{mode}""#),
                )
                .replace(r#""expected_instances":2"#, r#""expected_instances":4"#);
            let mut rng = Rng(0xFA11 ^ name.len() as u64);
            let arrivals = steady(T0, 500, 4, 4, &mut rng);
            let mut sim = Simulation::new(&config, 4, HALF_LATENCY_US).unwrap();
            sim.bridge.outages.push((T0 + 1_000_000, T0 + 2_500_000));
            let decided = sim.play(&arrivals);
            let run = Run {
                decided,
                bridge_calls: sim.bridge.calls,
            };
            let what = format!("{name}, failure_mode {mode}, Redis down 1.5 s");
            let mut counted: Vec<Admission> = Vec::new();
            let mut fallback: Vec<Admission> = Vec::new();
            for d in &run.decided {
                let r = &d.eval.reports[0];
                let admission = Admission {
                    at_us: r.decided_at_us,
                    cost: r.cost,
                };
                match r.outcome {
                    RuleOutcome::Allowed => counted.push(admission),
                    RuleOutcome::BridgeFailed(weir_core::engine::FailureOutcome::Local {
                        allowed: true,
                    }) => fallback.push(admission),
                    _ => {}
                }
            }
            counted.sort_by_key(|a| a.at_us);
            // What the limiter admitted (Redis, leases, reservations) keeps the bound in
            // every mode.
            let limit =
                configured_limit(&sim.envoys[0].engine, weir_core::rules::RuleId(0)).unwrap();
            if let Err(v) = conformance::check(&limit, &counted) {
                panic!("{what}: {v:?}");
            }
            // With the local fallback, everything admitted together keeps the bound
            // plus two bursts.
            let mut all = counted.clone();
            all.extend(fallback.iter().copied());
            all.sort_by_key(|a| a.at_us);
            let loose = with_extra_bursts(&limit, 2);
            if let Err(v) = conformance::check(&loose, &all) {
                panic!("{what}: the bound plus two bursts: {v:?}");
            }
            let one_more = conformance::check(&with_extra_bursts(&limit, 1), &all);
            eprintln!(
                "{what}: within the bound plus one burst: {}",
                one_more.is_ok()
            );
            let units = |a: &[Admission]| a.iter().map(|a| a.cost).sum::<u64>();
            eprintln!(
                "{what}: {} counted, {} by the fallback",
                units(&counted),
                units(&fallback)
            );
            if mode == "local" {
                assert!(
                    units(&fallback) > 0,
                    "{what}: the fallback admitted nothing"
                );
            }
        }
    }
}

/// The benchmark's hot keys: GCRA 1,000/s burst 99, and 250/s burst 24 for 20× (limit,
/// rate per second, burst).
const HOT_KEYS: [(&str, u64, u64); 2] = [
    (
        r#"{"algorithm":"gcra","rate":1000,"period":"1s","burst":99}"#,
        1000,
        99,
    ),
    (
        r#"{"algorithm":"gcra","rate":250,"period":"1s","burst":24}"#,
        250,
        24,
    ),
];

/// The benchmark's hot key, simulated: GCRA 1,000/s burst 99 (and 250/s burst 24 for
/// 20×) offered 5,000 requests/s over 2 Envoys, leases of up to 50 with a 20 ms hold and
/// a 100 ms horizon. Calls overlap (no single flight here, like two workers), so an Envoy
/// often gets two reservations at once: both are kept, as one schedule. Regression: the
/// second replaced the first, and half the units Redis granted expired unspent (968
/// admitted of a possible 2,100).
///
/// Over eight arrival seeds, not one: a single 2 s run lands anywhere from 1.3 % to
/// 4 % under (2,036–2,073 of 2,100 and 504–518 of 525 measured), as the start's calls
/// happen to overlap, and one seed that passed said little. Together they must be
/// within 2 %, each within 5 %.
#[test]
fn a_hot_key_at_5x_and_20x_is_admitted_within_2_percent_of_its_bound() {
    for (limit, rate, burst) in HOT_KEYS {
        // The simulated bridge answers in 0.5 ms: the hold covers a round trip of 2 ms
        // (by default a quarter of the burst's time, 24 units here, which 2 s of
        // traffic would show as 1 % more under-admission).
        let config = config(
            limit,
            r#"{"max":50,"ttl":"20ms","horizon":"100ms","round_trip":"2ms"}"#,
        );
        let bound = burst + 1 + rate * 2;
        let (mut admitted, mut bounds, mut calls, mut requests) = (0, 0, 0, 0);
        for seed in 1..=8 {
            let what = format!("{rate}/s, seed {seed}");
            let mut rng = Rng(seed);
            let arrivals = steady(T0, 5000, 2, 2, &mut rng);
            let (sim, run) = play(&config, 2, &arrivals);
            assert_conformant(&what, &sim, &run);
            eprintln!("{what}: admitted {} of a bound of {bound}", run.admitted());
            assert!(
                run.admitted() * 100 >= bound * 95,
                "{what}: admitted {}, more than 5 % under {bound}",
                run.admitted()
            );
            admitted += run.admitted();
            bounds += bound;
            calls += run.bridge_calls;
            requests += run.requests();
        }
        let per_request = calls as f64 / requests as f64;
        assert!(
            admitted * 100 >= bounds * 98,
            "{rate}/s: admitted {admitted} over eight runs, more than 2 % under {bounds}"
        );
        assert!(
            per_request <= 0.02,
            "{rate}/s: {per_request:.4} bridge calls per request"
        );
    }
}

/// The benchmark's hot key offered twice its rate, 90 % of it on one of two Envoys
/// (issue 35), admits no less than the same load all on one Envoy. The light Envoy
/// (200/s, a fifth of the rate) used to reserve its demand over the whole horizon (20
/// slots of 1 ms), though its slots fall due at the key's rate and expire `ttl` after:
/// it could spend about 8 of every 20 (200/s over 40 ms), the heavy Envoy was denied
/// the rest, and over eight seeds the split load admitted 13,563 against 15,153 all on one Envoy (the committed
/// benchmark run: 15.6 % under the bound). Now 15,973.
///
/// All on one Envoy, the simulation admits 9.8 % under the bound, where a real Envoy's
/// run of the same load is within 0.5 % (docs/benchmarks.md): the simulated Envoy calls
/// without single flight and asks again about 5 ms after its reservation runs out, a gap
/// this test does not judge.
#[test]
fn a_hot_key_offered_unevenly_admits_no_less_than_all_on_one_envoy() {
    let (limit, rate, burst) = HOT_KEYS[0];
    let config = config(
        limit,
        r#"{"max":50,"ttl":"20ms","horizon":"100ms","round_trip":"2ms"}"#,
    );
    let secs = 2;
    let admitted_with = |heavy_share: u64| -> u64 {
        let mut admitted = 0;
        for seed in 1..=8 {
            let what = format!("{heavy_share} % on one Envoy, seed {seed}");
            let mut rng = Rng(seed);
            let arrivals: Vec<Arrival<FakeRequest>> = steady(T0, 2 * rate, secs, 1, &mut rng)
                .into_iter()
                .map(|mut a| {
                    a.envoy = usize::from(rng.below(100) >= heavy_share);
                    a
                })
                .collect();
            let (sim, run) = play(&config, 2, &arrivals);
            assert_conformant(&what, &sim, &run);
            eprintln!(
                "{what}: admitted {} of a bound of {}",
                run.admitted(),
                burst + 1 + rate * secs
            );
            admitted += run.admitted();
        }
        admitted
    };
    let (uneven, one) = (admitted_with(90), admitted_with(100));
    assert!(
        uneven >= one,
        "90 % on one Envoy admitted {uneven} over eight seeds, all on one {one}"
    );
}

/// A saturated key's run admitted within 2 % of `bound`, for at most 0.02 bridge calls
/// per request.
fn assert_close_and_cheap(what: &str, run: &Run, bound: u64) {
    let admitted = run.admitted();
    let calls = run.bridge_calls as f64 / run.requests() as f64;
    eprintln!(
        "{what}: admitted {admitted} of a bound of {bound}, {calls:.4} bridge calls per request"
    );
    assert!(
        admitted * 100 >= bound * 98,
        "{what}: admitted {admitted}, more than 2 % under {bound}"
    );
    assert!(calls <= 0.02, "{what}: {calls:.4} bridge calls per request");
}

/// The same hot keys behind a slow bridge (10 and 30 ms round trips), with the default
/// hold, each Envoy sharing its calls as a filter worker does. A unit's hold counts from
/// when its call left, so a round trip longer than `ttl` used to leave no time to spend
/// anything Redis granted: every reservation expired on arrival and the key asked again
/// (with the hold of old, `round_trip` 1 µs: 6 of 3,100 admitted in 3 s at 30 ms, 0.30
/// bridge calls per request). The hold now covers the round trip the plugin measured,
/// paid for with a quarter of the burst by default. What is still missed is that
/// quarter, the start, and the reservations past the run's end (about 100 units).
/// And requests do not queue behind the slow call: a saturated key's slot denies the
/// key's other requests while its call is in flight.
///
/// Each Envoy also runs with two workers sharing its shared data, as the benchmark's
/// do. Regression: a plugin with no answer yet asked for a hold of `ttl` alone, and
/// behind a 30 ms bridge the first calls' units (the key's burst) came back with no
/// time left to spend: 48 and 37 units lost at the start, and with two workers
/// 1,969 of 2,025 admitted at 250/s (2.8 % under). The first calls now ask for the
/// longest hold the rule paid for.
#[test]
fn a_slow_bridge_does_not_eat_the_hold() {
    for (half_latency_us, workers) in [(5_000, 1), (15_000, 1), (5_000, 2), (15_000, 2)] {
        for (limit, rate, burst) in HOT_KEYS {
            let what = format!(
                "{rate}/s, {} ms round trip, {workers} worker(s) per Envoy",
                2 * half_latency_us / 1_000
            );
            let config = config(limit, r#"{"max":50,"ttl":"20ms","horizon":"100ms"}"#);
            let mut rng = Rng(11);
            let secs = 8;
            let arrivals = steady(T0, 5000, secs, 2 * workers, &mut rng);
            let mut sim = Simulation::with_workers(&config, 2, workers, half_latency_us).unwrap();
            sim.single_flight = true;
            let decided = sim.play(&arrivals);
            let run = Run {
                decided,
                bridge_calls: sim.bridge.calls,
            };
            assert_conformant(&what, &sim, &run);
            assert_close_and_cheap(&what, &run, burst + 1 + rate * secs);
            let waited = run
                .decided
                .iter()
                .filter(|d| d.decided_us > d.arrived_us)
                .count();
            eprintln!(
                "{what}: {waited} requests waited for a call, {} calls",
                run.bridge_calls
            );
            // The key's other requests are denied while its call is in flight: few wait
            // (its own request, and those of the unsaturated start). When every request
            // that missed waited on the call, 3,916 to 10,417 of the 40,000 did.
            //
            // The start is when a crowd meets a call that already has its 64 waiters:
            // the rest wait on a call of their own (until issue 32 they took the failure
            // mode: here `deny`, a 503). At 1,000/s behind 30 ms with two workers, 1,945
            // of the 40,000 waited, 1,859 of them to be denied a round trip later, all
            // in the first 2.5 s; afterwards 2 per 100 ms (at 250/s behind 10 ms, waves
            // of 20 to 70 when the key's last reservation runs out: 280 of 25,110).
            assert!(
                waited * 20 <= run.requests(),
                "{what}: {waited} of {} requests waited for a call",
                run.requests()
            );
            let settled_from = T0 + 3_000_000;
            let (late, waited_late) = run
                .decided
                .iter()
                .filter(|d| d.arrived_us >= settled_from)
                .fold((0, 0), |(n, w), d| {
                    (n + 1, w + usize::from(d.decided_us > d.arrived_us))
                });
            assert!(
                waited_late * 50 <= late,
                "{what}: after 3 s, {waited_late} of {late} requests waited for a call"
            );
        }
    }
}

/// The benchmark's weir-global-saturated-slow30, simulated: the hot key (GCRA 1,000/s,
/// burst 99, leases of up to 50 with a 20 ms `ttl` and a 100 ms horizon) behind a bridge
/// 30 ms away, driven as wrk drives Envoy: 16 clients in a closed loop, each sending
/// again 1 ms after its answer. What the limiter is offered depends on how fast it
/// answers. Regression: every call was sized by the key's rate of arrivals, which in a
/// closed loop is what was answered, over `ttl`, shorter than the round trip; each call
/// served fewer requests than the last, and the rest waited on the next. In a real Envoy:
/// 31 requests/s answered, p50 500 ms, 0.86 bridge calls per request, no 429. Now a call
/// asks for the requests waiting on the key and for the demand over the whole hold, and
/// a saturated key's other requests are answered at once while its call is in flight.
/// Also with the bridge 1 ms away, where the key refilled a unit between calls, each call
/// took it as a lease and none was ever denied, so none reserved: 0.032 calls per request
/// (0.03 on a real Envoy) until a grant of a GCRA key's last units was made to keep the
/// key from being asked about again for half its burst's time.
#[test]
fn a_closed_loop_behind_a_slow_bridge_is_answered_at_once() {
    for half_latency_us in [500, 15_000] {
        closed_loop_on_the_hot_key(half_latency_us);
    }
}

fn closed_loop_on_the_hot_key(half_latency_us: u64) {
    let (limit, rate, burst) = HOT_KEYS[0];
    // The benchmark's plugin: one Envoy expected, the bridge's timeout 250 ms.
    let config = format!(
        r#"{{"bridge":{{"cluster":"weir_bridge","timeout":"250ms"}},"rules":[{{"name":"hot",
            "scope":"global","limit":{limit},
            "global":{{"lease":{{"max":50,"ttl":"20ms","horizon":"100ms"}}}}}}]}}"#
    );
    let clients: Vec<_> = (0..16)
        .map(|i| Arrival {
            at_us: T0 + 37 * i,
            envoy: 0,
            request: user("k"),
        })
        .collect();
    let secs = 3;
    let mut sim = Simulation::new(&config, 1, half_latency_us).unwrap();
    sim.single_flight = true;
    let decided = sim.play_closed(&clients, 1_000, T0 + secs * 1_000_000);
    let what = format!("closed loop, {} ms round trip", 2 * half_latency_us / 1_000);
    let run = Run {
        decided,
        bridge_calls: sim.bridge.calls,
    };
    assert_conformant(&what, &sim, &run);
    let requests = run.requests();
    let denied = run.decided.iter().filter(|d| d.eval.denied()).count();
    let waited = run
        .decided
        .iter()
        .filter(|d| d.decided_us > d.arrived_us)
        .count();
    let admitted = run.admitted();
    let calls = run.bridge_calls as f64 / requests as f64;
    eprintln!(
        "{what}: {requests} requests, {denied} denied, {waited} waited, {admitted} admitted, {calls:.4} bridge calls per request"
    );
    // Answered at once, 16 clients send about 16,000 requests a second.
    assert!(requests >= 10_000 * secs as usize, "{requests} requests");
    assert!(
        denied * 100 >= requests * 90,
        "{denied} of {requests} denied"
    );
    assert!(calls <= 0.02, "{calls:.4} bridge calls per request");
    // What the key can admit: its burst, 44 of which pay for the hold (2,948 of 3,100
    // admitted when this was written: the burst's 44 and the round trips' gaps).
    let bound = burst + 1 + rate * secs;
    assert!(
        admitted * 100 >= bound * 94,
        "{what}: admitted {admitted}, more than 6 % under {bound}"
    );
}
