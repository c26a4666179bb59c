//! The search, global: random global configurations — 1–3 simulated Envoys against the
//! model bridge, leases and horizons, failure modes, bridge outages and calls of 0.1 to
//! 40 ms — each run in simulated time and judged by `conformance::check`; a call the
//! bridge refuses for a config the check accepted fails it too. How much runs and how to
//! replay a seed: `search.rs`, which runs the local configurations.
#![cfg(not(target_arch = "wasm32"))]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod support;

use support::search::*;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use support::{FakeRequest, Rng, T0};
use weir_core::algorithms::GlobalLimit;
use weir_core::conformance::{self, Admission, Violation};
use weir_core::engine::{BridgeError, FailureOutcome, RuleOutcome, Source, BRIDGE_BACKOFF_US};
use weir_core::rules::RuleId;
use weir_core::simulation::{configured_limit, with_extra_bursts, Arrival, Simulation};
use weir_core::wire::ReplyError;

/// A global case: one rule, several Envoys, a model of the bridge.
#[derive(Clone, Debug)]
struct GlobalCase {
    seed: u64,
    config: String,
    algorithm: &'static str,
    envoys: usize,
    failure_mode: &'static str,
    outage: Option<(u64, u64)>,
    half_latency_us: u64,
    /// Each call's half latency is up to this much longer (the measured round trip, and
    /// the holds asked for, change as the case goes).
    jitter_us: u64,
    /// Envoys share calls per key, as one filter worker does.
    single_flight: bool,
    schedule: Vec<Request>,
}

fn draw_global(seed: u64) -> GlobalCase {
    let mut rng = Rng(seed.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1);
    // Draws added later come from their own stream, so every earlier seed still draws
    // the case it drew (the kept seeds stay the cases they were).
    let mut more = Rng(seed.wrapping_mul(0x94d0_49bb_1331_11eb) | 1);
    let timeout_us = if chance(&mut more, 2) {
        log_uniform(&mut more, MS, 250 * MS)
    } else {
        50 * MS
    };
    let limit = draw_limit(
        &mut rng,
        &[
            "gcra",
            "token_bucket",
            "fixed_window",
            "sliding_window",
            "sliding_log",
        ],
    );
    let envoys = 1 + rng.below(3) as usize;
    let users = 1 + rng.below(2) as usize;
    let cost_max = if limit.max_cost < 2 || chance(&mut rng, 3) {
        1
    } else {
        log_uniform(&mut rng, 2, limit.max_cost.min(20))
    };
    let mut lease = String::new();
    if chance(&mut rng, 4) {
        lease = r#","lease":{"max":1}"#.to_string();
    } else {
        let max = log_uniform(&mut rng, 1, 200);
        let ttl_us = log_uniform(&mut rng, MS, limit.scale_us.clamp(MS, 10 * S));
        write!(lease, r#","lease":{{"max":{max},"ttl":"{ttl_us}us""#).unwrap();
        if chance(&mut more, 2) {
            let round_trip_us = log_uniform(&mut more, 1, 100 * MS);
            write!(lease, r#","round_trip":"{round_trip_us}us""#).unwrap();
        }
        if spec_of(limit.name).has_schedule && chance(&mut rng, 2) {
            let horizon_us = log_uniform(&mut rng, MS, 10 * S);
            write!(lease, r#","horizon":"{horizon_us}us""#).unwrap();
        }
        lease.push('}');
    }
    let failure_mode = ["allow", "deny", "local"][rng.below(3) as usize];
    let shadow = if chance(&mut rng, 6) {
        r#","shadow":true"#
    } else {
        ""
    };
    let cost = if cost_max > 1 {
        format!(r#","cost":{{"header":"x-cost","max":{cost_max}}}"#)
    } else {
        String::new()
    };
    let config = format!(
        r#"{{"bridge":{{"cluster":"weir_bridge","timeout":"{timeout_us}us"}},"rules":[{{"name":"r","scope":"global",
            "key":[{{"header":"x-user"}}],"limit":{}{cost}{shadow},
            "global":{{"failure_mode":"{failure_mode}","expected_instances":{envoys}{lease}}}}}]}}"#,
        limit.json
    );
    let requests = (log_uniform(&mut rng, 20, 800) + 3 * limit.max_cost.min(300)) as usize;
    let schedule = draw_schedule(&mut rng, &limit, envoys, users, requests, cost_max, false);
    let span = schedule.last().map_or(0, |r| r.at_us - T0);
    let outage = chance(&mut rng, 3).then(|| {
        let from = T0 + rng.below(span + 1);
        (from, from + log_uniform(&mut rng, MS, span.max(MS)))
    });
    GlobalCase {
        seed,
        config,
        algorithm: limit.name,
        envoys,
        failure_mode,
        outage,
        half_latency_us: log_uniform(&mut rng, 50, 20 * MS),
        jitter_us: if chance(&mut more, 2) {
            log_uniform(&mut more, 1, 20 * MS)
        } else {
            0
        },
        single_flight: chance(&mut more, 2),
        schedule,
    }
}

/// What a global case admitted, per user: by the limiter (Redis, leases,
/// reservations), and by the local fallback; and the units Redis admitted for calls in
/// flight when a failure was seen (the fallback had taken over by the time they landed).
struct GlobalRun {
    counted: BTreeMap<usize, Vec<Admission>>,
    with_fallback: BTreeMap<usize, Vec<Admission>>,
    in_flight_at_failure: BTreeMap<usize, u64>,
    /// Bridge calls the bridge refused (400): a request of a config the check accepted
    /// that the bridge will not decide, which sends every global rule of the plugin to
    /// its failure mode.
    refused: Vec<String>,
    /// Envoys sharing the key (`expected_instances`): each falls back to its share.
    instances: u64,
    requests: u64,
    bridge_calls: u64,
}

fn run_global(case: &GlobalCase, schedule: &[Request]) -> GlobalRun {
    let mut sim = Simulation::new(&case.config, case.envoys, case.half_latency_us).unwrap();
    sim.bridge.outages.extend(case.outage);
    sim.single_flight = case.single_flight;
    sim.jitter_us = case.jitter_us;
    let arrivals: Vec<Arrival<FakeRequest>> = schedule
        .iter()
        .map(|r| Arrival {
            at_us: r.at_us,
            envoy: r.at,
            request: request_of(r),
        })
        .collect();
    let decided = sim.play(&arrivals);
    // The instants failures landed: from each, the rule runs on its local share.
    let failures: Vec<u64> = decided
        .iter()
        .flat_map(|d| &d.eval.reports)
        .filter(|r| matches!(r.outcome, RuleOutcome::BridgeFailed(_)))
        .map(|r| r.decided_at_us)
        .collect();
    let mut out = GlobalRun {
        counted: BTreeMap::new(),
        with_fallback: BTreeMap::new(),
        in_flight_at_failure: BTreeMap::new(),
        refused: decided
            .iter()
            .filter_map(|d| match &d.eval.bridge_error {
                Some(BridgeError::Reply(ReplyError::Status(400, body))) => Some(body.clone()),
                _ => None,
            })
            .collect(),
        instances: case.envoys as u64,
        requests: decided.len() as u64,
        bridge_calls: sim.bridge.calls,
    };
    for d in &decided {
        let user = schedule[d.index].user;
        for r in &d.eval.reports {
            let admission = Admission {
                at_us: r.decided_at_us,
                cost: r.cost,
            };
            match r.outcome {
                RuleOutcome::Allowed => {
                    let in_flight = r.source == Some(Source::Bridge)
                        && failures
                            .iter()
                            .any(|&f| d.arrived_us < f && f <= d.decided_us);
                    if in_flight {
                        *out.in_flight_at_failure.entry(user).or_default() += r.cost;
                    }
                    out.counted.entry(user).or_default().push(admission);
                    out.with_fallback.entry(user).or_default().push(admission);
                }
                RuleOutcome::BridgeFailed(FailureOutcome::Local { allowed: true }) => {
                    out.with_fallback.entry(user).or_default().push(admission)
                }
                _ => {}
            }
        }
    }
    out
}

/// The bound a global case keeps: what the limiter admitted keeps the configured bound;
/// with the local fallback around an outage, everything admitted keeps it plus two
/// bursts, plus what Redis admitted for the calls in flight when a failure was seen,
/// plus what the Envoys' shares add up to beyond one limit (a share is at least one
/// unit: a limit below `expected_instances` gives each Envoy 1), plus one backoff's worth
/// (a second) of the limit's rate: an Envoy stays on its fallback until its backoff ends
/// while Redis already serves the others (docs/global.md, "The bound under `local`").
/// Seed 1114829 (a deep run) found the check without that last term too strict.
fn global_violation(limit: &GlobalLimit, run: &GlobalRun) -> Option<(usize, Violation)> {
    let shares = limit
        .local_share(run.instances)
        .map_or(0, |share| share.max_cost().saturating_mul(run.instances));
    let rounding = shares.saturating_sub(limit.max_cost());
    let policy = limit.policy();
    let backoff_ns = u128::from(BRIDGE_BACKOFF_US) * 1_000;
    let after_outage = u64::try_from(
        (u128::from(policy.quota) * backoff_ns).div_ceil(u128::from(policy.window_ns.max(1))),
    )
    .unwrap_or(u64::MAX);
    violation(limit, &run.counted).or_else(|| {
        run.with_fallback.iter().find_map(|(user, a)| {
            let in_flight = run.in_flight_at_failure.get(user).copied().unwrap_or(0);
            let extra = in_flight + rounding + after_outage;
            let loose = with_extra_units(&with_extra_bursts(limit, 2), extra);
            let mut a = a.clone();
            a.sort_by_key(|a| a.at_us);
            conformance::check(&loose, &a).err().map(|v| (*user, v))
        })
    })
}

/// `limit` admitting `units` more at once: the GCRA burst, the bucket's capacity, the
/// window's limit grown by them.
fn with_extra_units(limit: &GlobalLimit, units: u64) -> GlobalLimit {
    let spec = limit.kind().spec();
    let mut values = limit.algorithm().parameters();
    let at = spec
        .parameters
        .iter()
        .position(|p| p.name == spec.limit_parameter.name)
        .unwrap();
    // A parameter may have a ceiling (a sliding log keeps at most 100,000 entries): then
    // the most it takes, a bound at least as strict as the one stated.
    let base = values[at];
    let mut extra = units;
    loop {
        values[at] = base.saturating_add(extra);
        if let Ok(loose) = GlobalLimit::build(spec.kind, &values) {
            return loose;
        }
        if extra == 0 {
            return limit.clone();
        }
        extra /= 2;
    }
}

fn check_global(case: &GlobalCase) -> Result<Option<GlobalRun>, String> {
    let Some(e) = accepted(&case.config) else {
        return Ok(None);
    };
    let limit = configured_limit(&e, RuleId(0)).unwrap();
    let run = run_global(case, &case.schedule);
    if let Some(body) = run.refused.first() {
        return Err(format!(
            "seed {}: global {}: the bridge refused {} calls of a config the check accepted \
             ({body:?})\nconfig: {}",
            case.seed,
            case.algorithm,
            run.refused.len(),
            case.config
        ));
    }
    if global_violation(&limit, &run).is_none() {
        return Ok(Some(run));
    }
    let (mut good, mut bad) = (0, case.schedule.len());
    while bad - good > 1 {
        let mid = (good + bad) / 2;
        if global_violation(&limit, &run_global(case, &case.schedule[..mid])).is_some() {
            bad = mid;
        } else {
            good = mid;
        }
    }
    let (user, v) = global_violation(&limit, &run_global(case, &case.schedule[..bad])).unwrap();
    Err(format!(
        "seed {}: global {} ({} Envoys, failure_mode {}, outage {:?}, call {} us + up to {} \
         us, single flight {}) breaks its bound after {} of {} requests, key u{user}: {v}\n\
         config: {}",
        case.seed,
        case.algorithm,
        case.envoys,
        case.failure_mode,
        case.outage,
        2 * case.half_latency_us,
        2 * case.jitter_us,
        case.single_flight,
        bad,
        case.schedule.len(),
        case.config,
    ))
}

#[test]
fn random_global_configurations_keep_their_bound() {
    let mut failures = Vec::new();
    let (mut cases, mut requests, mut calls, mut refused) = (0u64, 0u64, 0u64, 0u64);
    for seed in seeds(500) {
        let case = draw_global(seed);
        cases += 1;
        match check_global(&case) {
            Ok(None) => refused += 1,
            Ok(Some(run)) => {
                requests += run.requests;
                calls += run.bridge_calls;
            }
            Err(failure) => failures.push(failure),
        }
    }
    println!(
        "global search: {cases} cases ({refused} configs refused by the check), {requests} \
         requests, {calls} bridge calls, {} violations",
        failures.len()
    );
    assert!(
        refused * 4 <= cases,
        "most drawn configs must be valid: {refused} refused"
    );
    assert!(
        failures.is_empty(),
        "{} of {cases} global cases break their bound; the first:\n{}",
        failures.len(),
        failures.first().map_or("", String::as_str)
    );
}

/// Global cases the search found. Seed 102404 (a deep run): one Envoy, exact calls of
/// 20 ms, GCRA of one unit per 148 µs and burst 0, `failure_mode: local`; calls in flight
/// when the failure landed were admitted by Redis while the fallback admitted too. The
/// documented bound counts those units (docs/global.md). Seed 154 (the CI set; also the
/// first failure of a 100,000-case deep run, seed 311817): a GCRA lease paid its `ttl` with burst, so the
/// limit Redis runs admitted less at once than the `cost` the config check allowed; the
/// bridge refused those requests (400) and every global rule went to its failure mode.
/// Seed 322278 (a deep run): a window of 1 shared by 3 Envoys, whose fallback shares are
/// a unit each — 3 together, not one limit; the documented bound counts the rounding.
#[test]
fn global_cases_the_search_found_keep_their_bound() {
    for seed in [102_404, 154, 322_278, 1_114_829] {
        let case = draw_global(seed);
        if let Err(failure) = check_global(&case) {
            panic!("{failure}");
        }
    }
}
