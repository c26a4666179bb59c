//! The search, global: random global configurations — 1–3 simulated Envoys against the
//! model bridge, leases and horizons, failure modes, bridge outages and calls of 0.1 to
//! 40 ms — each run in simulated time and judged by `conformance::check`; a call the
//! bridge refuses for a config the check accepted fails it too. How much runs and how to
//! replay a seed: `search.rs`, which runs the local configurations.
//!
//! The oracle judges what happened, not what the engine called it (issue 32): every
//! request the Envoy let go counts, with the cost its client asked for, and only the
//! outage the harness caused excuses an admission. `search_hostile.rs` plays the filter
//! itself, with hostile clients, against the same model.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use support::search::*;

use std::collections::BTreeMap;

use support::{FakeRequest, Rng, T0};
use weir_core::algorithms::GlobalLimit;
use weir_core::conformance::{self, Admission};
use weir_core::engine::{BridgeError, RuleOutcome, BRIDGE_BACKOFF_US};
use weir_core::rules::RuleId;
use weir_core::wire::ReplyError;
use weir_testkit::simulation::{configured_limit, Arrival, Simulation};

/// A global case: one rule, several Envoys, a model of the bridge.
#[derive(Clone, Debug)]
struct GlobalCase {
    seed: u64,
    config: String,
    algorithm: &'static str,
    envoys: usize,
    failure_mode: &'static str,
    shadow: bool,
    timeout_us: u64,
    outage: Option<(u64, u64)>,
    half_latency_us: u64,
    /// Each call's half latency is up to this much longer (the measured round trip, and
    /// the holds asked for, change as the case goes).
    jitter_us: u64,
    /// Envoys share calls per key, as one filter worker does.
    single_flight: bool,
    /// A tenant's own limit read from each request (issue 36), when drawn.
    tenant: Option<TenantLimit>,
    schedule: Vec<Request>,
}

impl GlobalCase {
    /// What request `r` sends (see [`request_with`]).
    fn request(&self, r: &Request) -> FakeRequest {
        request_with(self.tenant.as_ref(), r)
    }
}

fn draw_global(seed: u64) -> GlobalCase {
    let mut rng = Rng(seed.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1);
    // Draws added later come from their own stream, so every earlier seed still draws
    // the case it drew (the kept seeds stay the cases they were).
    let mut more = Rng(seed.wrapping_mul(0x94d0_49bb_1331_11eb) | 1);
    let mut rule = DrawnGlobal::draw(&mut rng, &mut more);
    let requests = (log_uniform(&mut rng, 20, 800) + 3 * rule.limit.max_cost.min(300)) as usize;
    let (envoys, users, cost_max) = (rule.envoys, rule.users, rule.cost_max);
    let schedule = draw_schedule(
        &mut rng,
        &rule.limit,
        envoys,
        users,
        requests,
        cost_max,
        false,
    );
    // Drawn apart, so that the seeds found before keep their cases: a tenant's own limit
    // (issue 36) in half the cases whose algorithm and failure mode take one.
    let mut tenant_rng = Rng(seed.wrapping_mul(0xd6e8_feb8_6659_fd93) | 1);
    let takes_one = rule.failure_mode != "local";
    let span_us = schedule.last().map_or(1, |r| r.at_us.saturating_sub(T0));
    let tenant = (chance(&mut tenant_rng, 2) && takes_one)
        .then(|| TenantLimit::draw(&mut tenant_rng, &mut rule.limit, span_us))
        .flatten();
    let config = rule.config(if tenant.is_some() {
        r#","trusted_headers":["x-tenant-limit"]"#
    } else {
        ""
    });
    let DrawnGlobal {
        limit,
        failure_mode,
        shadow,
        timeout_us,
        ..
    } = rule;
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
        shadow,
        timeout_us,
        outage,
        half_latency_us: log_uniform(&mut rng, 50, 20 * MS),
        jitter_us: if chance(&mut more, 2) {
            log_uniform(&mut more, 1, 20 * MS)
        } else {
            0
        },
        single_flight: chance(&mut more, 2),
        tenant,
        schedule,
    }
}

/// What a global case admitted, per user, judged by what happened (CONFORMANCE.md, "The
/// oracle trusts only what happened"): every request the Envoy let go, at the instant
/// its rule decided (checked to lie between the request's arrival and its release),
/// with the cost its client asked for — whatever the engine called the decision. Only
/// the outage the harness caused excuses an admission: one released from the outage's
/// start until its end plus a call's round trip, the bridge timeout and a backoff.
struct GlobalRun {
    /// Admissions nothing excuses, and all of them.
    strict: BTreeMap<usize, Vec<Admission>>,
    all: BTreeMap<usize, Vec<Admission>>,
    /// The requests (indices into the schedule) of each user's admissions, in order.
    strict_requests: BTreeMap<usize, Vec<usize>>,
    /// Units admitted by requests in flight across the outage's start.
    in_flight_at_failure: BTreeMap<usize, u64>,
    /// Decisions whose instant lies outside the request's arrival .. release.
    outside: Vec<(usize, u64)>,
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
            request: case.request(r),
        })
        .collect();
    let decided = sim.play(&arrivals);
    let round_trip_us = 2 * (case.half_latency_us + case.jitter_us);
    let excused = |released_us: u64| {
        case.outage.is_some_and(|(from, to)| {
            let until = to + round_trip_us + case.timeout_us + BRIDGE_BACKOFF_US;
            (from..=until).contains(&released_us)
        })
    };
    let mut out = GlobalRun {
        strict: BTreeMap::new(),
        all: BTreeMap::new(),
        strict_requests: BTreeMap::new(),
        in_flight_at_failure: BTreeMap::new(),
        outside: Vec::new(),
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
        let r = &schedule[d.index];
        let Some(report) = d.eval.reports.iter().find(|rep| rep.rule == RuleId(0)) else {
            continue;
        };
        // A shadow rule never denies: what it would have admitted is its own word.
        let admitted = if case.shadow {
            report.outcome == RuleOutcome::Allowed
        } else {
            !d.eval.denied()
        };
        if !admitted {
            continue;
        }
        if report.decided_at_us < d.arrived_us || report.decided_at_us > d.decided_us {
            out.outside.push((d.index, report.decided_at_us));
        }
        let admission = Admission {
            at_us: report.decided_at_us,
            cost: r.cost,
        };
        out.all.entry(r.user).or_default().push(admission);
        if !excused(d.decided_us) {
            out.strict.entry(r.user).or_default().push(admission);
            out.strict_requests.entry(r.user).or_default().push(d.index);
        }
        let across = case
            .outage
            .is_some_and(|(from, _)| d.arrived_us < from + round_trip_us && from <= d.decided_us);
        if across {
            *out.in_flight_at_failure.entry(r.user).or_default() += r.cost;
        }
    }
    out
}

/// The bound a global case keeps: what nothing excuses keeps the configured bound; under
/// `local` and `deny`, everything admitted keeps the bound docs/global.md states around
/// an outage ([`loose`]); under `allow`, what the outage excuses is not the limit's.
/// The bound a global case keeps: what nothing excuses keeps the configured bound (with
/// a tenant's own limit, each stretch its own and all of them the largest); under
/// `local` and `deny`, everything admitted keeps the bound docs/global.md states around
/// an outage ([`loose`], of the largest limit a request carried); under `allow`, what the
/// outage excuses is not the limit's.
fn global_violation(
    case: &GlobalCase,
    limit: &GlobalLimit,
    run: &GlobalRun,
) -> Option<(usize, String)> {
    let strict = match &case.tenant {
        None => violation(limit, &run.strict).map(|(user, v)| (user, v.to_string())),
        Some(tenant) => tenant.violation(limit, &case.schedule, &run.strict, &run.strict_requests),
    };
    strict.or_else(|| {
        if case.failure_mode == "allow" {
            return None;
        }
        let largest = case
            .tenant
            .as_ref()
            .map_or_else(|| limit.clone(), |t| t.largest(limit));
        run.all.iter().find_map(|(user, a)| {
            let in_flight = run.in_flight_at_failure.get(user).copied().unwrap_or(0);
            let loose = loose(&largest, run.instances, in_flight);
            let mut a = a.clone();
            a.sort_by_key(|a| a.at_us);
            conformance::check(&loose, &a)
                .err()
                .map(|v| (*user, v.to_string()))
        })
    })
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
    if let Some((index, at_us)) = run.outside.first() {
        return Err(format!(
            "seed {}: request {index} was decided at {at_us}, outside its arrival .. release\n\
             config: {}",
            case.seed, case.config
        ));
    }
    if global_violation(case, &limit, &run).is_none() {
        return Ok(Some(run));
    }
    let (mut good, mut bad) = (0, case.schedule.len());
    while bad - good > 1 {
        let mid = (good + bad) / 2;
        if global_violation(case, &limit, &run_global(case, &case.schedule[..mid])).is_some() {
            bad = mid;
        } else {
            good = mid;
        }
    }
    let (user, v) =
        global_violation(case, &limit, &run_global(case, &case.schedule[..bad])).unwrap();
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
    let (mut tenants, mut gcra_tenants) = (0u64, 0u64);
    for seed in seeds(500) {
        let case = draw_global(seed);
        cases += 1;
        tenants += u64::from(case.tenant.is_some());
        gcra_tenants += u64::from(case.tenant.is_some() && case.algorithm == "gcra");
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
        "global search: {cases} cases ({refused} configs refused by the check, {tenants} with \
         a tenant's own limit per request, {gcra_tenants} of them gcra), {requests} requests, \
         {calls} bridge calls, {} violations",
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
