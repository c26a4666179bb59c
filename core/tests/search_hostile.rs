//! The search, hostile: random global configurations over the whole range the config
//! accepts, played by the worst clients the generator knows, through the filter's whole
//! lifecycle (the scripted Envoy, one VM per worker, Envoys of one or two workers)
//! against the model bridge — and judged by an oracle that trusts only what happened.
//!
//! **The clients**: the schedules of `search_global.rs` (bursts, steady stretches, idle
//! gaps), plus crowds: 1 to 1,000 requests on one key at one instant, over 1 to 3 Envoys;
//! a fixed-window key is shared by up to 300 members (`share`, issue 36: a trusted
//! `x-member` header, one request in 8 naming none), and judged by its parent's bound.
//! **The bridge**: calls of 0.1 to 40 ms, outages (its own 503), calls slower than the
//! bridge's timeout (Envoy's 504), resets, and Envoy's circuit breaker refusing calls
//! beyond a number in flight. **The upstream**: answers, its own 5xx, Envoy's local
//! replies, clients that leave.
//!
//! **The oracle** takes no excuse from the engine:
//! - a request is admitted when its whole request reached the upstream (the scripted
//!   Envoy records what went on), whatever the filter called it; it counts against the
//!   rule's bound at the instant the filter wrote for its decision, which must lie
//!   between its arrival and its admission (the harness's own bounds), with the cost the
//!   client asked for (a token budget's settled cost: up to its reservation there, the
//!   excess where its commit landed, as `search_hostile/budgets.rs` says);
//! - an admission is excused only by a fault the harness injected at that Envoy (an
//!   outage's 503, a timeout, a reset), within the bridge backoff after it: under
//!   `allow` it is not judged, under `local` and `deny` it is judged against the looser
//!   bound docs/global.md states for the fallback ("The bound under `local`");
//! - a shadow rule never denies: what it would have admitted is its own word (`allowed`
//!   in the filter state), judged against its bound;
//! - no byte of a denied request's body may reach the upstream, and no request may be
//!   left undecided.
//!
//! How much runs: `WEIR_SEARCH_CASES` cases (default 100: about 20 s in CI's debug
//! build) from `WEIR_SEARCH_SEED` (default 1); `just fuzz` runs it deeper. A failure
//! prints its seed, and the schedule is cut to the shortest prefix that still fails.
//!
//! On 20691aa (before issue 32's fixes) 8 of the first 150 cases failed, all on what no
//! fault excused; seed 28 is a crowd of 511 requests on one token-bucket key (2 Envoys,
//! failure_mode `allow`, a healthy bridge), and seed 38 a burst of the ordinary
//! schedule on one worker: in both, the waiters past a call's 64 took the failure mode.
//! Seeds 19, 64, 124 and 136 add a circuit breaker, whose refused calls took it too
//! (an earlier fix of this issue kept the failure mode for a refusal before any call was
//! answered, which seeds of this search found again). The budget arm failed 59 of its
//! 60 cases there (bodies a strict parser refuses, duplicate bounds, bodies sent before
//! the bridge decided), and 27 on a first fix that held a body read whole with the
//! watermark (a clamp's rewrite then crashes Envoy). The seeds stay below as regression
//! tests.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::collections::BTreeMap;

use support::conformance::lying_bound;
use support::fleet::{BridgeModel, Excuse, Fleet, Outcome, Plan, Respond, FLEET_T0};
use support::hostile_json::{hostile_body, HostileBody};
use support::python_json::{PythonReader, Read, Readings};
use support::search::*;
use support::Rng;
use weir_core::algorithms::GlobalLimit;
use weir_core::conformance::{self, Admission, Violation};
use weir_core::engine::{BRIDGE_BACKOFF_US, BRIDGE_DOWN_READ_US};
use weir_core::rules::RuleId;
use weir_core::usage::DEFAULT_MAX_TOKENS_FIELDS;
use weir_testkit::simulation::configured_limit;

/// A hostile global case.
#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    config: String,
    algorithm: &'static str,
    envoys: usize,
    workers: usize,
    failure_mode: &'static str,
    shadow: bool,
    timeout_us: u64,
    model: BridgeModel,
    /// Crowds drawn: (instant, user, size).
    crowds: Vec<(u64, usize, usize)>,
    /// A tenant's own limit read from each request (issue 36), when drawn.
    tenant: Option<TenantLimit>,
    /// A shared limit (issue 36), when drawn: its members, each request naming one in
    /// `x-member` (a trusted header), one in 8 naming none.
    members: Option<u64>,
    schedule: Vec<Request>,
}

fn draw(seed: u64) -> Case {
    let mut rng = Rng(seed.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1);
    let mut more = Rng(seed.wrapping_mul(0x94d0_49bb_1331_11eb) | 1);
    let mut hostile = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    let mut rule = DrawnGlobal::draw(&mut rng, &mut more);
    // Exact rules too (no lease at all), which search_global.rs does not draw.
    if chance(&mut hostile, 5) {
        rule.lease.clear();
    }
    // Drawn apart, so that the seeds found before keep their cases: a tenant's own limit
    // (issue 36), changing every few periods, in half the cases that take one.
    let mut tenant_rng = Rng(seed.wrapping_mul(0xd6e8_feb8_6659_fd93) | 1);
    let takes_one = rule.failure_mode != "local";
    let every_us = rule.limit.scale_us.saturating_mul(8);
    let tenant = (chance(&mut tenant_rng, 2) && takes_one)
        .then(|| TenantLimit::draw(&mut tenant_rng, &mut rule.limit, every_us))
        .flatten();
    // A shared limit in every fixed-window case that takes one (drawn apart too): the
    // parent is the user's key, judged by its own bound; the members crowd and ask
    // through the same faults.
    let mut share_rng = Rng(seed.wrapping_mul(0x8cb9_2ba7_2f3d_8dd7) | 1);
    let members =
        (rule.limit.name == "fixed_window" && tenant.is_none() && rule.failure_mode != "local")
            .then(|| log_uniform(&mut share_rng, 1, 300));
    let trusted = match (tenant.is_some(), members.is_some()) {
        (true, _) => r#","trusted_headers":["x-tenant-limit"]"#,
        (false, true) => r#","trusted_headers":["x-member"]"#,
        (false, false) => "",
    };
    let mut config = rule.config(&format!(r#","response":{{"filter_state":"all"}}{trusted}"#));
    if let Some(members) = members {
        config = shared_by_members(&mut share_rng, &config, members);
    }
    let DrawnGlobal {
        limit,
        timeout_us,
        envoys,
        users,
        cost_max,
        failure_mode,
        shadow,
        ..
    } = rule;
    let workers = 1 + hostile.below(2) as usize;
    let requests = (log_uniform(&mut rng, 20, 600) + 2 * limit.max_cost.min(300)) as usize;
    let mut schedule = draw_schedule(
        &mut rng,
        &limit,
        envoys * workers,
        users,
        requests,
        cost_max,
        false,
    );
    // Crowds: one key, one instant, over 1 to 3 Envoys (any of their workers).
    let span = schedule.last().map_or(0, |r| r.at_us - FLEET_T0);
    let mut crowds = Vec::new();
    for _ in 0..hostile.below(3) {
        let at_us = FLEET_T0 + hostile.below(span + 1);
        let user = hostile.below(users as u64) as usize;
        let size = log_uniform(&mut hostile, 1, 1_000) as usize;
        let over = 1 + hostile.below(envoys as u64) as usize;
        for k in 0..size {
            let envoy = (k % over) % envoys;
            let worker = hostile.below(workers as u64) as usize;
            let mut r = draw_request(&mut hostile, at_us, 1, users, cost_max, false, &limit);
            r.at = envoy * workers + worker;
            r.user = user;
            schedule.push(r);
        }
        crowds.push((at_us, user, size));
    }
    schedule.sort_by_key(|r| r.at_us);
    let outages = if chance(&mut rng, 3) {
        let from = FLEET_T0 + rng.below(span + 1);
        vec![(from, from + log_uniform(&mut rng, MS, span.max(MS)))]
    } else {
        Vec::new()
    };
    let model = BridgeModel {
        half_latency_us: log_uniform(&mut rng, 50, 20 * MS),
        jitter_us: if chance(&mut hostile, 2) {
            log_uniform(&mut hostile, 1, 20 * MS)
        } else {
            0
        },
        outages,
        reset_one_in: if chance(&mut hostile, 4) {
            log_uniform(&mut hostile, 3, 50)
        } else {
            0
        },
        circuit_breaker: chance(&mut hostile, 3).then(|| log_uniform(&mut hostile, 1, 64) as usize),
    };
    Case {
        seed,
        config,
        algorithm: limit.name,
        envoys,
        workers,
        failure_mode,
        shadow,
        timeout_us,
        model,
        crowds,
        tenant,
        members,
        schedule,
    }
}

fn plans(case: &Case, schedule: &[Request]) -> Vec<Plan> {
    schedule
        .iter()
        .map(|r| Plan {
            at_us: r.at_us,
            worker: r.at,
            headers: [
                (":path".into(), "/".into()),
                ("x-user".into(), format!("u{}", r.user)),
                ("x-cost".into(), r.cost.to_string()),
            ]
            .into_iter()
            .chain(
                case.tenant
                    .as_ref()
                    .map(|t| (TENANT_HEADER.into(), t.value(r))),
            )
            .chain(case.members.and_then(|members| member_of(r, members)))
            .collect(),
            body: None,
            response: match r.duration_us % 5 {
                // Envoy's own 504, and clients that leave: no excuse for anything.
                0 => Respond::Local {
                    after_us: r.duration_us,
                    status: 504,
                },
                1 => Respond::Leaves {
                    after_us: r.duration_us,
                },
                _ => Respond::Upstream {
                    after_us: r.duration_us % case.timeout_us.max(1),
                    status: if r.duration_us % 7 == 0 { 503 } else { 200 },
                    headers: Vec::new(),
                    body: b"ok".to_vec(),
                },
            },
        })
        .collect()
}

/// What the oracle found in one run.
#[derive(Default)]
struct Judged {
    /// Per user: admissions nothing excuses, and all admissions.
    strict: BTreeMap<usize, Vec<Admission>>,
    all: BTreeMap<usize, Vec<Admission>>,
    /// With a tenant's own limit: it, the schedule judged, and per user the requests
    /// (indices into it) of the strict admissions, to judge each by the limit it carried.
    tenant: Option<TenantLimit>,
    schedule: Vec<Request>,
    strict_requests: BTreeMap<usize, Vec<usize>>,
    /// Per user: units admitted while a call of theirs straddled a fault.
    in_flight_at_fault: BTreeMap<usize, u64>,
    /// What no bound excuses: a leak, a request left undecided, a decision instant
    /// outside what happened, an admission without a decision.
    broken: Vec<String>,
    requests: u64,
    admitted: u64,
    excused: u64,
    answered_429: u64,
    /// Token budgets: bodies a clamp rewrote, and requests with hostile bodies.
    rewritten: u64,
    tricks: u64,
    /// Token budgets: the admissions are placed as settled costs (each at its admission
    /// up to its reservation, its excess where its commit landed), and judged against
    /// the bound grown by the excess in flight (docs/algorithms.md, "Estimates below the
    /// usage"); per user, the most excess in flight at an admission, among the strict
    /// admissions and among all.
    settled: bool,
    excess_in_flight: BTreeMap<usize, (u64, u64)>,
}

fn judge(case: &Case, schedule: &[Request], fleet: &Fleet) -> Judged {
    let mut j = Judged {
        tenant: case.tenant.clone(),
        schedule: schedule.to_vec(),
        ..Judged::default()
    };
    let excuse_span = BRIDGE_BACKOFF_US + case.timeout_us + BRIDGE_DOWN_READ_US;
    let process = |worker: usize| worker / case.workers;
    let excused = |worker: usize, at_us: u64| {
        fleet.excuses.iter().any(|&Excuse { envoy, at_us: f }| {
            envoy == process(worker) && f <= at_us && at_us <= f + excuse_span
        })
    };
    for (i, (r, out)) in schedule.iter().zip(&fleet.outcomes).enumerate() {
        j.requests += 1;
        let Outcome {
            arrived_us,
            admitted_us,
            leaked,
            answered,
            written,
            stuck,
            ..
        } = out;
        if *leaked {
            j.broken.push(format!(
                "request {i}: its body reached the upstream though it was answered {answered:?}"
            ));
        }
        if *stuck {
            j.broken
                .push(format!("request {i} (u{}) was never decided", r.user));
        }
        if *answered == Some(429) {
            j.answered_429 += 1;
        }
        let decision = written.iter().find(|w| w.rule == "r");
        let admitted_at = if case.shadow {
            // What a shadow rule would have admitted is its own word.
            decision.filter(|w| w.outcome == "allowed").map(|w| w.at_us)
        } else {
            match (admitted_us, decision) {
                (Some(_), None) => {
                    j.broken.push(format!(
                        "request {i} reached the upstream with no decision written"
                    ));
                    continue;
                }
                (Some(_), Some(w)) => Some(w.at_us),
                (None, _) => None,
            }
        };
        let Some(at_us) = admitted_at else {
            continue;
        };
        let upper = admitted_us.unwrap_or(at_us);
        if at_us < *arrived_us || at_us > upper {
            j.broken.push(format!(
                "request {i}: decided at {at_us}, outside its arrival {arrived_us} .. admission {upper}"
            ));
        }
        let admission = Admission {
            at_us,
            cost: r.cost,
        };
        j.admitted += r.cost;
        j.all.entry(r.user).or_default().push(admission);
        let when = admitted_us.unwrap_or(at_us);
        if excused(r.at, when) {
            j.excused += 1;
        } else {
            j.strict.entry(r.user).or_default().push(admission);
            j.strict_requests.entry(r.user).or_default().push(i);
        }
        let straddles = fleet
            .excuses
            .iter()
            .any(|e| e.envoy == process(r.at) && *arrived_us < e.at_us && e.at_us <= when);
        if straddles {
            *j.in_flight_at_fault.entry(r.user).or_default() += r.cost;
        }
    }
    j
}

/// The first thing the oracle finds wrong in a run.
fn fault(
    (failure_mode, envoys): (&str, usize),
    limit: &GlobalLimit,
    fleet: &Fleet,
    j: &Judged,
) -> Option<String> {
    if fleet.dangling_body > 0 {
        return Some(format!(
            "the filter touched a request body Envoy no longer held for it {} times: Envoy crashes",
            fleet.dangling_body
        ));
    }
    if let Some(body) = fleet.refused_by_bridge.first() {
        return Some(format!(
            "the bridge refused a call of a config the check accepted: {body}"
        ));
    }
    if let Some(broken) = j.broken.first() {
        return Some(broken.clone());
    }
    let excess = |user: &usize| j.excess_in_flight.get(user).copied().unwrap_or_default();
    if !j.settled {
        let strict = match &j.tenant {
            None => violation(limit, &j.strict).map(|(user, v)| (user, v.to_string())),
            Some(t) => t.violation(limit, &j.schedule, &j.strict, &j.strict_requests),
        };
        if let Some((user, v)) = strict {
            return Some(format!("key u{user}, with no fault to excuse it: {v}"));
        }
    }
    for (user, a) in j.strict.iter().filter(|_| j.settled) {
        let GlobalLimit::Slot(slot) = limit else {
            panic!("no commit for {limit:?}");
        };
        let mut a = a.clone();
        a.sort_by_key(|a| a.at_us);
        let in_flight = excess(user).0;
        for bound in lying_bound(slot, in_flight) {
            if let Err(v) = conformance::check(&bound, &a) {
                return Some(format!(
                    "key u{user}, with no fault to excuse it, {in_flight} units of excess in \
                     flight at most: {v}"
                ));
            }
        }
    }
    if failure_mode == "allow" {
        return None;
    }
    j.all.iter().find_map(|(user, a)| {
        let in_flight = j.in_flight_at_fault.get(user).copied().unwrap_or(0) + excess(user).1;
        let largest = j
            .tenant
            .as_ref()
            .map_or_else(|| limit.clone(), |t| t.largest(limit));
        let loose = loose(&largest, envoys as u64, in_flight);
        let mut a = a.clone();
        a.sort_by_key(|a| a.at_us);
        conformance::check(&loose, &a)
            .err()
            .map(|v: Violation| format!("key u{user}, with the fallback's bound: {v}"))
    })
}

fn run(case: &Case, schedule: &[Request]) -> (Fleet, Judged) {
    let mut fleet =
        Fleet::new(&case.config, case.envoys, case.workers, case.model.clone()).unwrap();
    fleet.play(&plans(case, schedule));
    let judged = judge(case, schedule, &fleet);
    (fleet, judged)
}

fn check(case: &Case) -> Result<Option<Judged>, String> {
    let Some(e) = accepted(&case.config) else {
        return Ok(None);
    };
    let limit = configured_limit(&e, RuleId(0)).unwrap();
    let (fleet, judged) = run(case, &case.schedule);
    if fault((case.failure_mode, case.envoys), &limit, &fleet, &judged).is_none() {
        return Ok(Some(judged));
    }
    let (mut good, mut bad) = (0, case.schedule.len());
    while bad - good > 1 {
        let mid = (good + bad) / 2;
        let (fleet, j) = run(case, &case.schedule[..mid]);
        if fault((case.failure_mode, case.envoys), &limit, &fleet, &j).is_some() {
            bad = mid;
        } else {
            good = mid;
        }
    }
    let (fleet, j) = run(case, &case.schedule[..bad]);
    let found = fault((case.failure_mode, case.envoys), &limit, &fleet, &j).unwrap_or_default();
    Err(format!(
        "seed {}: hostile global {} ({} Envoys × {} workers, failure_mode {}, calls {} us + up \
         to {} us, timeout {} us, outages {:?}, a reset every {} calls, circuit breaker {:?}, \
         crowds {:?}) fails after {} of {} requests ({} admitted units, {} excused, {} \
         bridge faults): {found}\nconfig: {}",
        case.seed,
        case.algorithm,
        case.envoys,
        case.workers,
        case.failure_mode,
        2 * case.model.half_latency_us,
        2 * case.model.jitter_us,
        case.timeout_us,
        case.model.outages,
        case.model.reset_one_in,
        case.model.circuit_breaker,
        case.crowds,
        bad,
        case.schedule.len(),
        j.admitted,
        j.excused,
        fleet.excuses.len(),
        case.config,
    ))
}

/// `config`'s rule (keyed by `x-user`) shared among `members` (`share`, issue 36), named by
/// the `x-member` header, tracking up to a drawn `max_keys`.
fn shared_by_members(rng: &mut Rng, config: &str, members: u64) -> String {
    let max_keys = log_uniform(rng, 1, members.min(1024));
    config.replacen(
        r#""key":[{"header":"x-user"}],"#,
        &format!(
            r#""key":[{{"header":"x-user"}}],"share":{{"by":[{{"header":"x-member"}}],"max_keys":{max_keys}}},"#
        ),
        1,
    )
}

/// The member a request of a shared case names (`x-member`): drawn from its instant, its
/// user and its cost, so a replay sends the same; one in 8 names none.
fn member_of(r: &Request, members: u64) -> Option<(String, String)> {
    let mut rng = Rng((r.at_us ^ (r.user as u64) << 40 ^ r.cost << 20) | 1);
    (rng.below(8) != 0).then(|| ("x-member".into(), format!("m{}", rng.below(members))))
}

#[test]
fn hostile_clients_and_a_faulty_bridge_never_break_a_global_bound() {
    let mut failures = Vec::new();
    let (mut cases, mut refused, mut requests, mut crowded, mut excused, mut limited) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut tenants, mut shared) = (0u64, 0u64);
    for seed in seeds(100) {
        let case = draw(seed);
        cases += 1;
        tenants += u64::from(case.tenant.is_some());
        shared += u64::from(case.members.is_some());
        crowded += case.crowds.iter().map(|c| c.2 as u64).sum::<u64>();
        match check(&case) {
            Ok(None) => refused += 1,
            Ok(Some(j)) => {
                requests += j.requests;
                excused += j.excused;
                limited += j.answered_429;
            }
            Err(failure) => failures.push(failure),
        }
    }
    println!(
        "hostile search: {cases} cases ({refused} configs refused by the check, {tenants} with \
         a tenant's own limit per request, {shared} shared by members), {requests} requests ({crowded} in crowds), {limited} answered 429, {excused} admissions \
         excused by a bridge fault, {} failing cases",
        failures.len()
    );
    assert!(
        refused * 4 <= cases,
        "most drawn configs must be valid: {refused} refused"
    );
    if std::env::var("WEIR_SEARCH_VERBOSE").is_ok() {
        for f in &failures {
            println!("{}", f.lines().next().unwrap_or(""));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} hostile cases fail; the first:\n{}",
        failures.len(),
        failures.first().map_or("", String::as_str)
    );
}

mod budgets;
mod usage_replies;
use budgets::{check_budget, draw_budget, BOUNDS};

/// The cases the search found, on 20691aa (see the module's docs), and budget cases an
/// oracle that placed a settled cost whole at its decision failed (`budgets.rs`).
#[test]
fn hostile_cases_the_search_found_keep_their_bound() {
    for seed in [19, 28, 38, 64, 105, 124, 136, 146] {
        if let Err(failure) = check(&draw(seed)) {
            panic!("{failure}");
        }
    }
    let mut python = PythonReader::start(BOUNDS);
    for seed in [1, 3, 4, 7070, 7155, 7272, 7559] {
        if let Err(failure) = check_budget(&draw_budget(seed), &mut python) {
            panic!("{failure}");
        }
    }
}
