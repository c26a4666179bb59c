//! Local rules with per-worker reservoirs, in simulated time: several workers (each its
//! own [`Reservoirs`]) share one Envoy's shared data, and every admission of every worker
//! is judged by `conformance::check`.
//!
//! A unit a worker spends later than it counts for in the shared bucket shows up here as
//! a violation — at 5× and 20× the limit, after an idle period, with mixed costs, under a
//! key flood. The same runs bound what reservoirs cost (admissions a central limiter
//! would have made and the workers did not) and what they save (requests served with no
//! shared-data call), so a limiter that is conformant by refusing, or cheap by never
//! taking ahead, fails too.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::collections::BTreeMap;

use support::{engine, evaluate_on, user, Rng, T0};
use weir_core::algorithms::{Ahead, GlobalLimit, Limit};
use weir_core::conformance::{self, Admission};
use weir_core::engine::{Engine, RuleOutcome, Source};
use weir_core::rules::RuleId;
use weir_core::store::memory::MemoryStore;
use weir_core::worker::Worker;
use weir_testkit::simulation::configured_limit;

const MS: u64 = 1_000;

/// One request: when, on which worker, for which user, at what cost.
#[derive(Clone, Debug)]
struct Arrival {
    at_us: u64,
    worker: usize,
    user: String,
    cost: u64,
}

/// What one run admitted, per key, and where the decisions came from.
#[derive(Default, Debug)]
struct Run {
    admissions: BTreeMap<String, Vec<Admission>>,
    requests: u64,
    admitted_units: u64,
    from_reservoir: u64,
    from_denial_cache: u64,
}

fn rule(limit: &str, reservoir: &str) -> String {
    format!(
        r#"{{"rules":[{{"name":"api","key":[{{"header":"x-user"}}],
            "cost":{{"header":"x-cost","max":10}},"limit":{limit}{reservoir}}}]}}"#
    )
}

/// Runs `arrivals` (sorted by time) on `workers` workers of one Envoy.
fn run(e: &Engine, workers: usize, arrivals: &[Arrival]) -> Run {
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut reservoirs: Vec<Worker> = (0..workers).map(|_| e.worker()).collect();
    let mut out = Run::default();
    for a in arrivals {
        let request = user(&a.user).header("x-cost", a.cost.to_string());
        let eval = evaluate_on(e, &store, &mut reservoirs[a.worker], &request, a.at_us);
        out.requests += 1;
        let report = eval.reports[0];
        match report.source {
            Some(Source::Reservoir) => out.from_reservoir += 1,
            Some(Source::DenialCache) => out.from_denial_cache += 1,
            _ => {}
        }
        if report.outcome == RuleOutcome::Allowed {
            out.admitted_units += report.cost;
            out.admissions
                .entry(a.user.clone())
                .or_default()
                .push(Admission {
                    at_us: report.decided_at_us,
                    cost: report.cost,
                });
        }
    }
    out
}

/// Every key's admissions keep the rule's bound.
fn assert_conformant(e: &Engine, run: &Run, what: &str) {
    let limit = configured_limit(e, RuleId(0)).unwrap();
    for (key, admissions) in &run.admissions {
        if let Err(v) = conformance::check(&limit, admissions) {
            panic!("{what}: key {key}: {v}");
        }
    }
}

/// `per_s` requests per second for `secs` from `T0 + start_us`, spread over `workers`
/// workers at random, with random gaps (mean 1 / per_s), for `users`.
fn poisson(
    rng: &mut Rng,
    start_us: u64,
    per_s: u64,
    secs: f64,
    workers: usize,
    users: &[&str],
    cost: impl Fn(&mut Rng) -> u64,
) -> Vec<Arrival> {
    let mut out = Vec::new();
    let mean_gap_us = 1_000_000 / per_s.max(1);
    let end = T0 + start_us + (secs * 1e6) as u64;
    let mut at = T0 + start_us;
    while at < end {
        let worker = rng.below(workers as u64) as usize;
        let user = users[rng.below(users.len() as u64) as usize].to_string();
        let cost = cost(rng);
        out.push(Arrival {
            at_us: at,
            worker,
            user,
            cost,
        });
        at += 1 + rng.below(2 * mean_gap_us);
    }
    out
}

/// The local algorithms at 1,000 units/s, with reservoirs (default hold, 32 units).
fn every_algorithm() -> Vec<(&'static str, String)> {
    let reservoir = r#","reservoir":{"max":32}"#;
    vec![
        (
            "gcra",
            rule(
                r#"{"algorithm":"gcra","rate":1000,"period":"1s","burst":199}"#,
                reservoir,
            ),
        ),
        (
            "token_bucket",
            rule(
                r#"{"algorithm":"token_bucket","capacity":200,"refill":50,"period":"50ms"}"#,
                reservoir,
            ),
        ),
        (
            "fixed_window",
            rule(
                r#"{"algorithm":"fixed_window","limit":1000,"window":"1s"}"#,
                reservoir,
            ),
        ),
        (
            "sliding_window",
            rule(
                r#"{"algorithm":"sliding_window","limit":1000,"window":"1s"}"#,
                reservoir,
            ),
        ),
    ]
}

/// The same rule with reservoirs off: every request decides in shared data.
fn exact(config: &str) -> String {
    config.replace(r#""reservoir":{"max":32}"#, r#""reservoir":{"max":1}"#)
}

#[test]
fn every_algorithm_keeps_its_bound_across_four_workers_at_5x_and_20x() {
    for (name, config) in every_algorithm() {
        let e = engine(&config);
        let central = engine(&exact(&config));
        for multiple in [5u64, 20] {
            let mut rng = Rng(0x5eed ^ multiple);
            let arrivals = poisson(&mut rng, 0, 1_000 * multiple, 2.0, 4, &["hot"], |_| 1);
            let workers = run(&e, 4, &arrivals);
            assert_conformant(&e, &workers, &format!("{name} at {multiple}x"));
            let reference = run(&central, 4, &arrivals);
            assert_conformant(&central, &reference, &format!("{name} exact"));
            let under = 1.0 - workers.admitted_units as f64 / reference.admitted_units as f64;
            eprintln!(
                "{name} at {multiple}x: {} of {} admitted (exact: {}, {:.2} % under), \
                 {} from reservoirs, {} from cached denials",
                workers.admitted_units,
                workers.requests,
                reference.admitted_units,
                100.0 * under,
                workers.from_reservoir,
                workers.from_denial_cache
            );
            // Near the limit a worker takes nothing ahead: what it admits is what shared
            // data admits, but for units it took a moment before and could not spend.
            assert!(
                under <= 0.01,
                "{name} at {multiple}x: {:.2} % under",
                100.0 * under
            );
            // Denials are served from the worker's memory once shared data said so,
            // until the retry time it gave: a fixed window's end, or (the others) when
            // the next unit frees up, a millisecond or so away here.
            let denials = workers.requests - workers.admitted_units;
            let cached = workers.from_denial_cache as f64 / denials as f64;
            let expected = if name == "fixed_window" { 0.9 } else { 0.25 };
            assert!(
                cached >= expected,
                "{name} at {multiple}x: only {} of {denials} denials from the cache",
                workers.from_denial_cache,
            );
        }
    }
}

#[test]
fn far_from_the_limit_workers_serve_most_requests_from_their_reservoirs() {
    for (name, config) in every_algorithm() {
        let e = engine(&config);
        let mut rng = Rng(7);
        // A third of the limit, on one key, from 2 workers: 167/s per worker.
        let arrivals = poisson(&mut rng, 0, 333, 3.0, 2, &["hot"], |_| 1);
        let workers = run(&e, 2, &arrivals);
        assert_conformant(&e, &workers, name);
        let share = workers.from_reservoir as f64 / workers.requests as f64;
        eprintln!(
            "{name} at a third of the limit: {} of {} admitted, {:.0} % from reservoirs",
            workers.admitted_units,
            workers.requests,
            100.0 * share
        );
        assert_eq!(
            workers.admitted_units, workers.requests,
            "{name}: nothing is limited"
        );
        // GCRA buys its units' time with a sixteenth of its tolerance (12.5 ms here):
        // about two requests of a worker's; the others keep units until their window
        // ends or their next refill.
        let expected = if name == "gcra" { 0.4 } else { 0.7 };
        assert!(share >= expected, "{name}: {:.2} from reservoirs", share);
    }
}

#[test]
fn four_workers_admit_exactly_the_burst_of_a_slow_key() {
    for (name, limit, expected) in [
        (
            "gcra",
            r#"{"algorithm":"gcra","rate":1,"period":"10m","burst":49}"#,
            50,
        ),
        (
            "token_bucket",
            r#"{"algorithm":"token_bucket","capacity":50,"refill":1,"period":"1h"}"#,
            50,
        ),
        (
            "fixed_window",
            r#"{"algorithm":"fixed_window","limit":50,"window":"1h"}"#,
            50,
        ),
        (
            "sliding_window",
            r#"{"algorithm":"sliding_window","limit":50,"window":"1h"}"#,
            50,
        ),
    ] {
        // The default reservoir settings.
        let e = engine(&rule(limit, ""));
        // 16 clients on 4 workers, 200 requests, back to back.
        let arrivals: Vec<Arrival> = (0..200)
            .map(|i| Arrival {
                at_us: T0 + i * 20,
                worker: (i as usize % 16) % 4,
                user: "alice".into(),
                cost: 1,
            })
            .collect();
        let workers = run(&e, 4, &arrivals);
        assert_conformant(&e, &workers, name);
        assert_eq!(workers.admitted_units, expected, "{name}");
        assert!(workers.from_reservoir > 0, "{name}: reservoirs were used");
    }
}

#[test]
fn an_idle_period_then_a_burst_on_every_worker_keeps_the_bound() {
    for (name, config) in every_algorithm() {
        let e = engine(&config);
        let mut rng = Rng(11);
        // Warm: every worker holds units for the key.
        let mut arrivals = poisson(&mut rng, 0, 2_000, 1.0, 4, &["hot"], |_| 1);
        // Idle for 700 ms, then every worker bursts: 2,000 requests within 2 ms.
        arrivals.extend((0..2_000u64).map(|i| Arrival {
            at_us: T0 + 1_700 * MS + i,
            worker: (i % 4) as usize,
            user: "hot".into(),
            cost: 1,
        }));
        let workers = run(&e, 4, &arrivals);
        assert_conformant(&e, &workers, &format!("{name}, idle then burst"));
    }
}

#[test]
fn mixed_costs_and_many_keys_keep_the_bound() {
    for (name, config) in every_algorithm() {
        let e = engine(&config);
        let mut rng = Rng(13);
        let users = ["a", "b", "c", "d", "e", "f", "g", "h"];
        let arrivals = poisson(&mut rng, 0, 20_000, 2.0, 4, &users, |rng| {
            if rng.below(5) == 0 {
                10
            } else {
                1
            }
        });
        let workers = run(&e, 4, &arrivals);
        assert_eq!(workers.admissions.len(), users.len());
        assert_conformant(&e, &workers, &format!("{name}, mixed costs"));
    }
}

#[test]
fn a_key_flood_beyond_the_tables_keeps_the_hot_keys_bound() {
    for (name, limit) in [
        (
            "gcra",
            r#"{"algorithm":"gcra","rate":1000,"period":"1s","burst":199}"#,
        ),
        (
            "fixed_window",
            r#"{"algorithm":"fixed_window","limit":1000,"window":"1s"}"#,
        ),
    ] {
        // 64 keys in shared data, 16 per worker's reservoirs.
        let config = format!(
            r#"{{"rules":[{{"name":"api","key":[{{"header":"x-user"}}],"max_keys":64,
                "limit":{limit},"reservoir":{{"max":32,"max_keys":16}}}}]}}"#
        );
        let e = engine(&config);
        let mut rng = Rng(17);
        let mut arrivals = Vec::new();
        // The hot key at 5× its limit; between two of its requests, a key never seen.
        for (i, hot) in poisson(&mut rng, 0, 5_000, 2.0, 4, &["hot"], |_| 1)
            .into_iter()
            .enumerate()
        {
            let flood = Arrival {
                user: format!("flood-{i}"),
                at_us: hot.at_us,
                ..hot.clone()
            };
            arrivals.push(hot);
            arrivals.push(flood);
        }
        let workers = run(&e, 4, &arrivals);
        assert_conformant(&e, &workers, &format!("{name}, key flood"));
        let hot = workers.admissions["hot"].len() as u64;
        eprintln!("{name}, key flood: the hot key admitted {hot} in 2 s");
        assert!(hot >= 1_500, "{name}: the hot key admitted {hot}");
    }
}

/// What the charge is for: a GCRA unit taken at `t` from a full bucket and spent at the
/// end of its validity. Without the charge (the units simply acquired) the schedule
/// refills behind them and another worker drains it at the same instant: the checker
/// sees more than burst + 1 at once. With [`Limit::take_ahead`] it does not.
#[test]
fn gcra_units_spent_late_are_paid_for_or_they_break_the_bound() {
    let Some(GlobalLimit::Slot(limit @ Limit::Gcra(_))) =
        configured_limit(&engine(&every_algorithm()[0].1), RuleId(0))
    else {
        panic!("gcra");
    };
    let hold_us = 12_500;
    let t = T0;
    let late = t + hold_us - 1;
    let spend_late_and_drain = |taken: u64, state| {
        // Worker A spends its units at `late`; worker B drains what the bucket has then.
        let (_, drained, _) = limit.acquire(state, late, 1, 1_000);
        let mut admissions = vec![Admission { at_us: t, cost: 1 }];
        admissions.push(Admission {
            at_us: late,
            cost: taken,
        });
        admissions.push(Admission {
            at_us: late,
            cost: drained,
        });
        conformance::check(&GlobalLimit::Slot(limit.clone()), &admissions)
    };
    // Without a charge.
    let (_, units, state) = limit.acquire(None, t, 1, 26);
    assert!(spend_late_and_drain(units - 1, state).is_err());
    // With it.
    let ahead = Ahead {
        max: 25,
        demand_per_s: 10_000,
        hold_us,
    };
    let (_, taken, state) = limit.take_ahead(None, t, 1, ahead);
    assert!(taken.units > 0 && taken.valid_ns >= (hold_us - 1) * 1_000);
    assert!(spend_late_and_drain(taken.units, state).is_ok());
}
