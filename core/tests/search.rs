//! The search: random configurations of every rate-limit admission path, each run in
//! simulated time and judged by `conformance::check`.
//!
//! A test that picks its parameters checks the cases its author thought of (the delay
//! tests all used a refill of 1, and a token bucket refilling 10 broke its bound 2.75×).
//! Here every case draws its configuration from the whole range the config accepts —
//! algorithm, rates, refills, periods and windows in µs that divide nothing, bursts of 0,
//! costs above 1, 1–4 workers, reservoirs on and off, delays released on time, within the
//! slack or too late, commits with honest and lying estimates, shadow rules; globally
//! 1–3 Envoys, leases, horizons, failure modes and bridge outages — and a schedule of
//! bursts and idle gaps, then checks every key's admissions against the rule's own
//! bound.
//!
//! How much runs: `WEIR_SEARCH_CASES` cases of each kind (default 1,500 local and 500
//! global: a few seconds in CI) from `WEIR_SEARCH_SEED` (default 1); `just fuzz` runs
//! 100,000 of each. A failure prints its seed; `WEIR_SEARCH_SEED=<seed>
//! WEIR_SEARCH_CASES=1` replays it alone, and the schedule is cut to the shortest prefix
//! that still fails. Found cases stay below as regression tests with their seeds.
#![cfg(not(target_arch = "wasm32"))]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use support::{evaluate_on, user, FakeRequest, Rng, SEED, T0};
use weir_core::algorithms::{AlgorithmKind, AlgorithmSpec, GlobalLimit};
use weir_core::config;
use weir_core::conformance::{self, Admission, Violation};
use weir_core::delay::RELEASE_SLACK_US;
use weir_core::engine::{
    BridgeError, Engine, Evaluation, FailureOutcome, PendingCommit, RuleOutcome, Source,
};
use weir_core::rules::{Facts, RuleId};
use weir_core::simulation::{configured_limit, with_extra_bursts, Arrival, Simulation};
use weir_core::store::memory::MemoryStore;
use weir_core::wire::ReplyError;
use weir_core::worker::Worker;

const MS: u64 = 1_000;
/// The longest reservoir hold the config accepts (1 min).
const MAX_RESERVOIR_HOLD_US: u64 = 60 * S;
const S: u64 = 1_000_000;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The seeds of one search: `WEIR_SEARCH_SEED..+WEIR_SEARCH_CASES`.
fn seeds(default_cases: u64) -> std::ops::Range<u64> {
    let from = env_u64("WEIR_SEARCH_SEED", 1);
    from..from + env_u64("WEIR_SEARCH_CASES", default_cases)
}

/// A number drawn log-uniformly from `lo..=hi` (every order of magnitude as likely), so
/// that 3 and 37,911 are drawn as often as 100.
fn log_uniform(rng: &mut Rng, lo: u64, hi: u64) -> u64 {
    let (lo_f, hi_f) = ((lo.max(1)) as f64, (hi.max(lo.max(1))) as f64);
    let unit = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
    let x = (lo_f.ln() + unit * (hi_f.ln() - lo_f.ln())).exp();
    (x as u64).clamp(lo, hi)
}

fn chance(rng: &mut Rng, one_in: u64) -> bool {
    rng.below(one_in) == 0
}

/// A limit, drawn: its JSON, its units per second (about), and its largest cost.
struct DrawnLimit {
    json: String,
    name: &'static str,
    per_s: f64,
    max_cost: u64,
    /// The time scale of the limit (period or window), µs.
    scale_us: u64,
}

/// What the algorithm called `name` can do.
fn spec_of(name: &str) -> &'static AlgorithmSpec {
    AlgorithmKind::from_name(name).unwrap().spec()
}

fn draw_limit(rng: &mut Rng, algorithms: &[&'static str]) -> DrawnLimit {
    let name = algorithms[rng.below(algorithms.len() as u64) as usize];
    // A period or window from 1 ms to 1 min, any µs count.
    let scale_us = log_uniform(rng, MS, 60 * S);
    match name {
        "gcra" => {
            let rate = log_uniform(rng, 1, 5_000);
            let burst = if chance(rng, 4) {
                0
            } else {
                log_uniform(rng, 1, 300)
            };
            DrawnLimit {
                json: format!(
                    r#"{{"algorithm":"gcra","rate":{rate},"period":"{scale_us}us","burst":{burst}}}"#
                ),
                name,
                per_s: rate as f64 * S as f64 / scale_us as f64,
                max_cost: burst + 1,
                scale_us,
            }
        }
        "token_bucket" => {
            let capacity = log_uniform(rng, 1, 2_000);
            let refill = if chance(rng, 3) {
                capacity
            } else {
                log_uniform(rng, 1, capacity.saturating_mul(2))
            };
            DrawnLimit {
                json: format!(
                    r#"{{"algorithm":"token_bucket","capacity":{capacity},"refill":{refill},"period":"{scale_us}us"}}"#
                ),
                name,
                per_s: refill.min(capacity) as f64 * S as f64 / scale_us as f64,
                max_cost: capacity,
                scale_us,
            }
        }
        _ => {
            let limit = log_uniform(rng, 1, 2_000);
            DrawnLimit {
                json: format!(
                    r#"{{"algorithm":"{name}","limit":{limit},"window":"{scale_us}us"}}"#
                ),
                name,
                per_s: limit as f64 * S as f64 / scale_us as f64,
                max_cost: limit,
                scale_us,
            }
        }
    }
}

/// One request of a schedule.
#[derive(Clone, Debug)]
struct Request {
    at_us: u64,
    /// A worker (local) or an Envoy (global).
    at: usize,
    user: usize,
    /// Its cost, or its estimate when the rule commits.
    cost: u64,
    /// What it really costs (commit): the usage its response reports.
    actual: u64,
    /// How long its response takes, µs.
    duration_us: u64,
}

/// A schedule of bursts, steady stretches and idle gaps around the limit's rate, at most
/// `max_requests` long.
#[allow(clippy::too_many_arguments)]
fn draw_schedule(
    rng: &mut Rng,
    limit: &DrawnLimit,
    places: usize,
    users: usize,
    max_requests: usize,
    cost_max: u64,
    lying: bool,
) -> Vec<Request> {
    let mut out = Vec::new();
    let mut at = T0 + rng.below(limit.scale_us.max(1));
    while out.len() < max_requests {
        match rng.below(4) {
            // Idle: from a sliver of the period to several of them.
            0 => at += log_uniform(rng, 1, limit.scale_us.saturating_mul(4)),
            // A burst: many requests within a few µs.
            1 => {
                for _ in 0..log_uniform(rng, 2, 200) {
                    at += rng.below(3);
                    out.push(draw_request(rng, at, places, users, cost_max, lying, limit));
                }
            }
            // Steady at 0.1× to 30× the rate.
            _ => {
                let factor = log_uniform(rng, 1, 300) as f64 / 10.0;
                let gap_us = (S as f64 / (limit.per_s * factor)).max(1.0);
                for _ in 0..log_uniform(rng, 5, 400) {
                    at += 1 + rng.below((2.0 * gap_us) as u64 + 1);
                    out.push(draw_request(rng, at, places, users, cost_max, lying, limit));
                }
            }
        }
    }
    out.truncate(max_requests);
    out
}

fn draw_request(
    rng: &mut Rng,
    at_us: u64,
    places: usize,
    users: usize,
    cost_max: u64,
    lying: bool,
    limit: &DrawnLimit,
) -> Request {
    let cost = if cost_max <= 1 || chance(rng, 2) {
        1
    } else {
        1 + rng.below(cost_max)
    };
    let actual = if lying {
        cost.saturating_add(rng.below(cost.saturating_mul(2) + 1))
    } else {
        rng.below(cost + 1)
    };
    Request {
        at_us,
        at: rng.below(places as u64) as usize,
        user: rng.below(users as u64) as usize,
        cost,
        actual,
        duration_us: rng.below(limit.scale_us.saturating_mul(3) + 1),
    }
}

/// A local case: a rule over one Envoy's shared data and its workers.
#[derive(Clone, Debug)]
struct LocalCase {
    seed: u64,
    config: String,
    algorithm: &'static str,
    workers: usize,
    commit: Option<Commit>,
    /// How late a held request is released: at most this after it is due.
    max_late_us: u64,
    /// How long a worker may take from reading the clock to deciding, µs: requests are
    /// decided in arrival order, each at a clock read up to this much earlier (workers
    /// read the clock, then race for the CAS).
    clock_lag_us: u64,
    schedule: Vec<Request>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Commit {
    /// Estimates at least the actual cost.
    Honest,
    /// Estimates below it.
    Lying,
}

fn draw_local(seed: u64) -> LocalCase {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let limit = draw_limit(
        &mut rng,
        &["gcra", "token_bucket", "fixed_window", "sliding_window"],
    );
    let workers = 1 + rng.below(4) as usize;
    let users = 1 + rng.below(3) as usize;
    let mut rule = format!(
        r#""name":"r","key":[{{"header":"x-user"}}],"limit":{}"#,
        limit.json
    );
    let commits = spec_of(limit.name).settles();
    let commit = (commits && chance(&mut rng, 3)).then(|| {
        if chance(&mut rng, 3) {
            Commit::Lying
        } else {
            Commit::Honest
        }
    });
    let cost_max = if limit.max_cost < 2 || chance(&mut rng, 3) {
        1
    } else {
        log_uniform(&mut rng, 2, limit.max_cost.min(50))
    };
    match commit {
        Some(_) => write!(
            rule,
            r#","cost":{{"header":"x-cost","max":{cost_max}}},"commit":{{"header":"x-tokens"}}"#
        )
        .unwrap(),
        None if cost_max > 1 => {
            write!(rule, r#","cost":{{"header":"x-cost","max":{cost_max}}}"#).unwrap()
        }
        None => {}
    }
    // A rule with a commit decides every request in shared data: no reservoir.
    if commit.is_none() && chance(&mut rng, 2) {
        let max = log_uniform(&mut rng, 1, 500);
        let hold_us = log_uniform(
            &mut rng,
            MS,
            limit.scale_us.clamp(MS, MAX_RESERVOIR_HOLD_US),
        );
        write!(rule, r#","reservoir":{{"max":{max},"hold":"{hold_us}us"}}"#).unwrap();
    }
    let shadow = chance(&mut rng, 6);
    // Delays: for the algorithms with a schedule, not with a commit or in shadow mode
    // (the check refuses both). Up to a few periods, so that most holds wait for a
    // refill or a slot.
    let delays = spec_of(limit.name).can_hold && commit.is_none() && !shadow;
    if delays && chance(&mut rng, 2) {
        let max_us =
            (limit.scale_us / 4 + rng.below(limit.scale_us.saturating_mul(5))).clamp(MS, 60 * S);
        let queue = log_uniform(&mut rng, 1, 1_000);
        write!(
            rule,
            r#","on_limit":{{"delay":{{"max":"{max_us}us","queue":{queue}}}}}"#
        )
        .unwrap();
    }
    if shadow {
        rule.push_str(r#","shadow":true"#);
    }
    let max_late_us = match rng.below(3) {
        0 => 0,
        1 => rng.below(RELEASE_SLACK_US + 1),
        _ => log_uniform(&mut rng, 1, limit.scale_us.saturating_mul(2)),
    };
    // Drawn apart, so that the draws above and below stay those of the seeds found
    // before it was added.
    let mut lag_rng = Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
    let clock_lag_us = if chance(&mut lag_rng, 3) {
        log_uniform(&mut lag_rng, 1, 2 * MS)
    } else {
        0
    };
    // Enough requests to go past the limit a few times over.
    let requests = (log_uniform(&mut rng, 20, 1_200) + 3 * limit.max_cost.min(600)) as usize;
    let schedule = draw_schedule(
        &mut rng,
        &limit,
        workers,
        users,
        requests,
        cost_max,
        commit == Some(Commit::Lying),
    );
    LocalCase {
        seed,
        config: format!(r#"{{"rules":[{{{rule}}}]}}"#),
        algorithm: limit.name,
        workers,
        commit,
        max_late_us,
        clock_lag_us,
        schedule,
    }
}

/// What a local case admitted, per user: at the instant each admission was decided (a
/// held request: released), with its actual cost when the rule commits honestly, else
/// with what the rule counted.
#[derive(Default, Debug)]
struct LocalRun {
    admissions: BTreeMap<usize, Vec<Admission>>,
    requests: u64,
    admitted: u64,
    held: u64,
    late: u64,
}

enum Event {
    Arrive(usize),
    Release { context: u32 },
    Settle { commit: PendingCommit, actual: u64 },
}

fn request_of(r: &Request) -> FakeRequest {
    user(&format!("u{}", r.user))
        .header("x-cost", r.cost.to_string())
        .header("x-tokens", r.actual.to_string())
}

fn run_local(case: &LocalCase, e: &Engine, schedule: &[Request]) -> LocalRun {
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut workers: Vec<Worker> = (0..case.workers).map(|_| e.worker()).collect();
    let mut rng = Rng(case.seed | 1);
    let mut events: BTreeMap<(u64, u64), Event> = BTreeMap::new();
    let mut seq = 0u64;
    for (i, r) in schedule.iter().enumerate() {
        events.insert((r.at_us, seq), Event::Arrive(i));
        seq += 1;
    }
    // Held requests: their evaluation, request and worker.
    let mut held: BTreeMap<u32, (Evaluation, usize, usize)> = BTreeMap::new();
    let mut out = LocalRun::default();
    let mut next_context = 1u32;
    while let Some(((now, _), event)) = events.pop_first() {
        let (eval, index, worker, context) = match event {
            Event::Arrive(i) => {
                let r = &schedule[i];
                out.requests += 1;
                let read_at = now.saturating_sub(rng.below(case.clock_lag_us + 1));
                let eval = evaluate_on(e, &store, &mut workers[r.at], &request_of(r), read_at);
                next_context += 1;
                (eval, i, r.at, next_context)
            }
            Event::Release { context } => {
                let (mut eval, i, worker) = held.remove(&context).unwrap();
                workers[worker].waiting.forget(context);
                let mut facts = Facts::new(&e.config.facts, request_of(&schedule[i]));
                e.release(
                    &mut eval,
                    &store,
                    &mut workers[worker],
                    &SEED,
                    &mut facts,
                    now,
                );
                if eval.delayed.is_some_and(|d| d.late) {
                    out.late += 1;
                }
                (eval, i, worker, context)
            }
            Event::Settle { commit, actual } => {
                e.commit(&store, &commit, actual, now).unwrap();
                continue;
            }
        };
        if let Some(h) = eval.held {
            assert!(workers[worker].waiting.hold(context, h.rule, h.hold.due_us));
            out.held += 1;
            let late = rng.below(case.max_late_us + 1);
            events.insert((h.hold.due_us + late, seq), Event::Release { context });
            seq += 1;
            held.insert(context, (eval, index, worker));
            continue;
        }
        let r = &schedule[index];
        for report in &eval.reports {
            if report.outcome != RuleOutcome::Allowed {
                continue;
            }
            let cost = match case.commit {
                Some(Commit::Honest) => r.actual,
                _ => report.cost,
            };
            out.admitted += cost;
            out.admissions.entry(r.user).or_default().push(Admission {
                at_us: report.decided_at_us,
                cost,
            });
        }
        for commit in &eval.commits {
            let end = now + r.duration_us;
            // A response ends after its request was decided.
            events.insert(
                (end, seq),
                Event::Settle {
                    commit: commit.clone(),
                    actual: r.actual,
                },
            );
            seq += 1;
        }
    }
    out
}

/// The engine of a drawn config, or `None` when the config check refuses it (a
/// combination no user can write: the search counts them).
fn accepted(json: &str) -> Option<Engine> {
    match config::parse(json.as_bytes()) {
        Ok(c) => Some(Engine::new(c)),
        Err(e) => {
            if std::env::var("WEIR_SEARCH_REFUSED").is_ok() {
                println!("refused: {e}");
            }
            None
        }
    }
}

/// The first key whose admissions break `limit`'s bound.
fn violation(
    limit: &GlobalLimit,
    admissions: &BTreeMap<usize, Vec<Admission>>,
) -> Option<(usize, Violation)> {
    admissions.iter().find_map(|(user, a)| {
        let mut a = a.clone();
        a.sort_by_key(|a| a.at_us);
        conformance::check(limit, &a).err().map(|v| (*user, v))
    })
}

/// Runs a local case; a violation, with the schedule cut to the shortest prefix that
/// still breaks the bound.
fn check_local(case: &LocalCase) -> Result<Option<LocalRun>, String> {
    let Some(e) = accepted(&case.config) else {
        return Ok(None);
    };
    let limit = configured_limit(&e, RuleId(0)).unwrap();
    let run = run_local(case, &e, &case.schedule);
    let Some(_) = violation(&limit, &run.admissions) else {
        return Ok(Some(run));
    };
    // The shortest failing prefix, by bisection (a prefix's run is the same run, cut).
    let (mut good, mut bad) = (0, case.schedule.len());
    while bad - good > 1 {
        let mid = (good + bad) / 2;
        let cut = run_local(case, &e, &case.schedule[..mid]);
        if violation(&limit, &cut.admissions).is_some() {
            bad = mid;
        } else {
            good = mid;
        }
    }
    let cut = run_local(case, &e, &case.schedule[..bad]);
    let (user, v) = violation(&limit, &cut.admissions).unwrap();
    Err(format!(
        "seed {}: {} ({} workers, commit {:?}, releases up to {} us late, clock lag up to \
         {} us) breaks its bound after {} of {} requests, key u{user}: {v}\nconfig: {}\n\
         first requests: {:?}",
        case.seed,
        case.algorithm,
        case.workers,
        case.commit,
        case.max_late_us,
        case.clock_lag_us,
        bad,
        case.schedule.len(),
        case.config,
        &case.schedule[..bad.min(12)],
    ))
}

#[test]
fn random_local_configurations_keep_their_bound() {
    let mut failures = Vec::new();
    let (mut cases, mut requests, mut held, mut admitted) = (0u64, 0u64, 0u64, 0u64);
    let mut refused = 0u64;
    for seed in seeds(1_500) {
        let case = draw_local(seed);
        cases += 1;
        match check_local(&case) {
            Ok(None) => refused += 1,
            Ok(Some(run)) => {
                if std::env::var("WEIR_SEARCH_VERBOSE").is_ok() {
                    println!(
                        "seed {seed}: {} {} requests {} held {} late {}",
                        case.algorithm, case.config, run.requests, run.held, run.late
                    );
                }
                requests += run.requests;
                held += run.held;
                admitted += run.admitted;
            }
            Err(failure) => failures.push(failure),
        }
    }
    println!(
        "local search: {cases} cases ({refused} configs refused by the check), {requests} \
         requests, {held} held, {admitted} units admitted, {} violations",
        failures.len()
    );
    assert!(
        refused * 10 <= cases,
        "most drawn configs must be valid: {refused} refused"
    );
    if std::env::var("WEIR_SEARCH_VERBOSE").is_ok() {
        for f in &failures {
            println!("{}", f.lines().next().unwrap_or(""));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} local cases break their bound; the first:\n{}",
        failures.len(),
        failures.first().map_or("", String::as_str)
    );
}

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
    schedule: Vec<Request>,
}

fn draw_global(seed: u64) -> GlobalCase {
    let mut rng = Rng(seed.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1);
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
        r#"{{"bridge":{{"cluster":"weir_bridge"}},"rules":[{{"name":"r","scope":"global",
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
    let round_trip_us = 2 * case.half_latency_us;
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
                            .any(|&f| d.arrived_us < f && f <= d.arrived_us + round_trip_us);
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
/// unit: a limit below `expected_instances` gives each Envoy 1) (docs/global.md).
fn global_violation(limit: &GlobalLimit, run: &GlobalRun) -> Option<(usize, Violation)> {
    let shares = limit
        .local_share(run.instances)
        .map_or(0, |share| share.max_cost().saturating_mul(run.instances));
    let rounding = shares.saturating_sub(limit.max_cost());
    violation(limit, &run.counted).or_else(|| {
        run.with_fallback.iter().find_map(|(user, a)| {
            let in_flight = run.in_flight_at_failure.get(user).copied().unwrap_or(0);
            let loose = with_extra_units(&with_extra_bursts(limit, 2), in_flight + rounding);
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
    values[at] = values[at].saturating_add(units);
    GlobalLimit::build(spec.kind, &values).unwrap()
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
        "seed {}: global {} ({} Envoys, failure_mode {}, outage {:?}, call {} us) breaks \
         its bound after {} of {} requests, key u{user}: {v}\nconfig: {}",
        case.seed,
        case.algorithm,
        case.envoys,
        case.failure_mode,
        case.outage,
        2 * case.half_latency_us,
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

/// Cases the search found, kept with their seeds. At 4208400 (before issue 19's fixes)
/// the default local search broke the bound in 40 of 1,500 cases, every one a token
/// bucket with a delay (defect 1): seed 51 first (capacity 3, refill 4 per 407,315 µs,
/// 8 units where 7 fit), seed 192 (capacity 6, refill 6, 3 workers with reservoirs).
/// Once workers decided on clocks up to 2 ms old, fixed windows broke it too (seeds 437,
/// 1020, 1443: a request whose clock was behind the key's window counted in the later
/// window; sliding windows did the same in a deeper run).
#[test]
fn cases_the_search_found_keep_their_bound() {
    for seed in [51, 192] {
        let case = draw_local(seed);
        assert!(case.config.contains("token_bucket") && case.config.contains("delay"));
        if let Err(failure) = check_local(&case) {
            panic!("{failure}");
        }
    }
    for seed in [437, 1020, 1443] {
        let case = draw_local(seed);
        assert!(case.config.contains("fixed_window") && case.clock_lag_us > 0);
        if let Err(failure) = check_local(&case) {
            panic!("{failure}");
        }
    }
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
    for seed in [102_404, 154, 322_278] {
        let case = draw_global(seed);
        if let Err(failure) = check_global(&case) {
            panic!("{failure}");
        }
    }
}
