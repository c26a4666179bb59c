//! The search for shared limits (`share`, issue 36): random configurations over the range
//! the config accepts (limits, windows, `max_keys` 1 to 1,024, costs from a header,
//! weights from a header, some not numbers), demand skews (one key at 100× beside up to
//! a thousand at 1×, a heavy key that stops and another that starts, uniform crowds),
//! requests naming no key, keys past `max_keys`, workers that read the clock before
//! they decide, token budgets (`commit`: an estimate settled with what the response
//! used, up to two windows later; judged at what was used), and delays (`on_limit.delay`:
//! held requests released on the workers' ticks, up to 5 ms late, and decided again).
//! Every parent's admissions are judged by the fixed window's bound
//! (`conformance::check`), every key's by its floor (`share::check_floor`), and every
//! held request's wait by its delay's `max`.
//!
//! `WEIR_SEARCH_CASES` cases (default 300) from `WEIR_SEARCH_SEED` (default 1); a failure
//! prints its seed, and `WEIR_SEARCH_SEED=<seed> WEIR_SEARCH_CASES=1` replays it.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use support::search::{chance, log_uniform, seeds};
use support::{evaluate_on, FakeRequest, Rng, SEED, T0};
use weir_core::algorithms::{fixed_window::FixedWindow, GlobalLimit, Limit};
use weir_core::config;
use weir_core::conformance::{check, Admission};
use weir_core::engine::{Engine, Evaluation, PendingCommit};
use weir_core::share::{check_floor_within, ShareLimit, ShareRequest};
use weir_core::store::memory::MemoryStore;
use weir_core::time::Micros;
use weir_testkit::simulation::{Arrival, Simulation};

/// The most requests one case evaluates.
const MAX_REQUESTS: u64 = 3_000;

#[derive(Debug)]
struct Case {
    config: String,
    limit: ShareLimit,
    parents: u64,
    /// Each key's demand in units per window, per window (a key is `(parent, user)`).
    demands: Vec<Vec<u64>>,
    /// A weight header per key (`None`: sent without one), and what the rule reads.
    weights: Vec<(Option<String>, u64)>,
    /// The cost header's `max` (`None`: every request costs 1).
    max_cost: Option<u64>,
    /// Local runs: the cost is an estimate, settled with an actual cost of at most it
    /// (`commit`, a token budget), up to two windows later.
    commit: bool,
    /// Requests naming no key, per window per parent.
    anonymous: u64,
    workers: usize,
    clock_lag_us: u64,
    /// Local runs without a commit, in half the cases: the rule holds what it would
    /// deny (`on_limit.delay`) and the workers release what is due on their ticks.
    delay: Option<Delay>,
}

/// A case's delay, and how its workers' ticks release held requests.
#[derive(Debug, Clone, Copy)]
struct Delay {
    max_us: u64,
    queue: u64,
    /// A tick comes up to this late (a busy worker).
    max_late_us: u64,
}

/// How often a worker with held requests looks for the due ones (the filter's
/// `RELEASE_TICK_MS`).
const TICK_US: u64 = 1_000;

fn draw(seed: u64) -> Case {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let limit = log_uniform(&mut rng, 1, 100_000);
    let window_us = log_uniform(&mut rng, 1, 100_000_000);
    let max_keys = log_uniform(&mut rng, 1, 1024) as u32;
    let parents = 1 + rng.below(3);
    let windows = 2 + rng.below(5) as usize;
    let keys = match rng.below(4) {
        // A crowd: up to a thousand keys.
        0 => log_uniform(&mut rng, 1, 1000),
        _ => log_uniform(&mut rng, 1, 40),
    };
    let max_cost = chance(&mut rng, 3).then(|| log_uniform(&mut rng, 1, limit.min(1000)));
    let unit = max_cost.map_or(1, |m| m.div_ceil(2));
    let light = log_uniform(&mut rng, 1, (limit / (keys + 1)).max(1) * 2).max(unit);
    let pattern = rng.below(3);
    let switch_at = rng.below(windows as u64) as usize;
    let mut demands: Vec<Vec<u64>> = (0..keys)
        .map(|k| {
            (0..windows)
                .map(|w| match pattern {
                    // One heavy key at 100×; from `switch_at` on it stops and key 1 is heavy.
                    0 | 1 => {
                        let heavy = if pattern == 1 && w >= switch_at { 1 } else { 0 };
                        match k {
                            _ if k == heavy => light * 100,
                            0 => 0,
                            _ => light,
                        }
                    }
                    _ => log_uniform(&mut rng, 1, light * 4),
                })
                .collect()
        })
        .collect();
    // Keep the case to its budget of requests.
    let total: u64 = demands.iter().flatten().sum::<u64>() * parents / unit;
    if total > MAX_REQUESTS {
        let scale = total.div_ceil(MAX_REQUESTS);
        for d in demands.iter_mut().flatten() {
            *d = (*d / scale).max(u64::from(*d > 0));
        }
    }
    let weight_max = (chance(&mut rng, 2)).then(|| log_uniform(&mut rng, 1, 100));
    let weights = (0..keys)
        .map(|_| match weight_max {
            None => (None, 1),
            Some(_) if chance(&mut rng, 16) => (Some("lots".to_string()), 1),
            Some(max) => {
                let w = 1 + rng.below(max * 2);
                (Some(w.to_string()), w.clamp(1, max))
            }
        })
        .collect();
    let weight = weight_max.map_or(String::new(), |max| {
        format!(r#","weight":{{"header":"x-weight","default":1,"max":{max}}}"#)
    });
    let cost = max_cost.map_or(String::new(), |max| {
        format!(r#""cost":{{"header":"x-cost","default":1,"max":{max}}},"#)
    });
    let config = format!(
        r#"{{"trusted_headers":["x-user","x-weight"],"rules":[{{"name":"shared",{cost}
            "key":[{{"header":"x-org"}}],
            "limit":{{"algorithm":"fixed_window","limit":{limit},"window":"{window_us}us"}},
            "share":{{"by":[{{"header":"x-user"}}],"max_keys":{max_keys}{weight}}}}}]}}"#
    );
    let clock_lag_us = if chance(&mut rng, 3) {
        log_uniform(&mut rng, 1, window_us)
    } else {
        0
    };
    // In the order the case's fields were drawn before delays came.
    let anonymous = if chance(&mut rng, 4) {
        1 + rng.below(5)
    } else {
        0
    };
    let workers = 1 + rng.below(4) as usize;
    let commit = max_cost.is_some() && chance(&mut rng, 2);
    // Drawn from a generator of its own, so the cases without it are what they were.
    let mut rng_delay = Rng(seed.wrapping_mul(0xde1a_7ed5) | 1);
    let delay = (!commit && chance(&mut rng_delay, 2)).then(|| Delay {
        // From the least the config takes to a few windows (at most its 60 s).
        max_us: log_uniform(
            &mut rng_delay,
            1_000,
            (4 * window_us).clamp(1_000, 60_000_000),
        ),
        queue: log_uniform(&mut rng_delay, 1, 1_000),
        max_late_us: match chance(&mut rng_delay, 2) {
            true => 0,
            false => log_uniform(&mut rng_delay, 1, 5 * TICK_US),
        },
    });
    Case {
        config,
        limit: ShareLimit {
            limit,
            window_us,
            max_keys,
        },
        parents,
        demands,
        weights,
        max_cost,
        anonymous,
        workers,
        clock_lag_us,
        commit,
        delay,
    }
}

/// One request of a case's schedule.
#[derive(Clone, Copy)]
struct Planned {
    at_us: u64,
    parent: u64,
    /// `None`: it names no key.
    key: Option<usize>,
    cost: u64,
}

fn schedule(case: &Case, rng: &mut Rng) -> Vec<Planned> {
    let window_us = case.limit.window_us;
    let start = T0 - T0 % window_us + window_us;
    let mut out = Vec::new();
    let windows = case.demands.first().map_or(0, Vec::len) as u64;
    for parent in 0..case.parents {
        for w in 0..windows {
            let from = start + w * window_us;
            for (k, demands) in case.demands.iter().enumerate() {
                let mut left = demands.get(w as usize).copied().unwrap_or(0);
                while left > 0 {
                    let cost = case
                        .max_cost
                        .map_or(1, |m| 1 + rng.below(m))
                        .min(left.max(1));
                    left = left.saturating_sub(cost);
                    let at_us = from + rng.below(window_us);
                    out.push(Planned {
                        at_us,
                        parent,
                        key: Some(k),
                        cost,
                    });
                }
            }
            for _ in 0..case.anonymous {
                let at_us = from + rng.below(window_us);
                out.push(Planned {
                    at_us,
                    parent,
                    key: None,
                    cost: 1,
                });
            }
        }
    }
    out.sort_by_key(|p| p.at_us);
    out
}

fn request(case: &Case, p: &Planned) -> FakeRequest {
    let mut req = FakeRequest::default().header("x-org", format!("org{}", p.parent));
    if let Some(k) = p.key {
        req = req.header("x-user", format!("u{k}"));
        if let Some((Some(weight), _)) = case.weights.get(k) {
            req = req.header("x-weight", weight);
        }
    }
    if case.max_cost.is_some() {
        req = req.header("x-cost", p.cost.to_string());
    }
    req
}

/// What a local run held: requests held (a request held twice counts twice), and held
/// requests admitted when released.
#[derive(Default)]
struct Held {
    holds: u64,
    admitted: u64,
    /// Held requests another key's pushed out of a full queue.
    pushed_out: u64,
}

/// Runs a case; the first parent whose admissions break the bound or a key's floor, or
/// a held request that waited past its delay's `max`.
fn run(seed: u64, case: &Case) -> Result<Held, String> {
    let config = match (case.commit, case.delay) {
        (true, _) => {
            case.config
                .replacen(r#""cost":{"#, r#""commit":{"header":"x-used"},"cost":{"#, 1)
        }
        (false, Some(d)) => case.config.replacen(
            r#""share":"#,
            &format!(
                r#""on_limit":{{"delay":{{"max":"{}us","queue":{}}}}},"share":"#,
                d.max_us, d.queue
            ),
            1,
        ),
        (false, None) => case.config.clone(),
    };
    let engine = Engine::new(config::parse(config.as_bytes()).map_err(|e| e.to_string())?);
    // Commits to settle: when, what, and the actual cost.
    let mut unsettled: Vec<(u64, PendingCommit, u64)> = Vec::new();
    let store = MemoryStore::new();
    engine.prepare(&store).map_err(|e| e.to_string())?;
    let mut workers: Vec<_> = (0..case.workers).map(|_| engine.worker()).collect();
    let mut rng = Rng(seed ^ 0x5eed);
    let planned = schedule(case, &mut rng);
    let window_us = case.limit.window_us;
    let mut per_parent: Vec<(Vec<Admission>, Vec<ShareRequest>)> = (0..case.parents)
        .map(|_| (Vec::new(), Vec::new()))
        .collect();
    let mut latest_start = vec![0u64; case.parents as usize];
    // Held requests by context (their planned request, worker and evaluation), and the
    // workers' ticks to come; each worker ticks at its own phase of the tick.
    let mut rng_ticks = Rng(seed ^ 0x71c4);
    let phases: Vec<u64> = (0..case.workers)
        .map(|_| rng_ticks.below(TICK_US))
        .collect();
    let mut held: HashMap<u32, (usize, usize, Evaluation)> = HashMap::new();
    let mut ticks: BTreeSet<(u64, usize)> = BTreeSet::new();
    let mut next_arrival = 0;
    let mut next_context = 0u32;
    let mut out = Held::default();
    loop {
        // What was decided now: (planned request, worker, context, evaluation, when).
        let mut decided = Vec::new();
        // The instant of this step (a decision reads the clock up to `clock_lag_us`
        // before it): no tick is ever set before it.
        let now;
        let arrival_at = planned.get(next_arrival).map(|p| p.at_us);
        let tick = ticks
            .first()
            .copied()
            .filter(|(at, _)| arrival_at.is_none_or(|a| *at <= a));
        if let Some((at, w)) = tick {
            now = at;
            ticks.remove(&(at, w));
            let Some(worker) = workers.get_mut(w) else {
                continue;
            };
            for context in worker.waiting.take_due(at) {
                let Some((index, w, mut eval)) = held.remove(&context) else {
                    return Err(format!("context {context} was due but not held"));
                };
                let mut facts = engine.facts(request(case, &planned[index]));
                engine.release(&mut eval, &store, worker, &SEED, &mut facts, Micros(at));
                decided.push((index, w, context, eval, at));
            }
        } else if let Some(p) = planned.get(next_arrival) {
            let index = next_arrival;
            next_arrival += 1;
            now = p.at_us;
            // A worker reads the clock, then races: it decides up to `clock_lag_us` late.
            let read_at = p.at_us.saturating_sub(rng.below(case.clock_lag_us + 1));
            unsettled.sort_by_key(|(at, _, _)| Reverse(*at));
            while unsettled.last().is_some_and(|(at, _, _)| *at <= read_at) {
                if let Some((at, commit, actual)) = unsettled.pop() {
                    engine
                        .commit(&store, &commit, actual, Micros(at))
                        .map_err(|e| e.to_string())?;
                }
            }
            let w = rng.below(case.workers as u64) as usize;
            let Some(worker) = workers.get_mut(w) else {
                continue;
            };
            let eval = evaluate_on(&engine, &store, worker, &request(case, p), read_at);
            next_context += 1;
            decided.push((index, w, next_context, eval, read_at));
        } else {
            break;
        }
        for (index, w, context, eval, at) in decided {
            let p = &planned[index];
            let released = eval.delayed.is_some();
            let admitted = !eval.denied() && eval.held.is_none();
            let commit = eval.commits.first().filter(|_| admitted).cloned();
            if let Some(h) = eval.held {
                let (Some(delay), Some(worker)) = (case.delay, workers.get_mut(w)) else {
                    return Err("held by a rule without a delay".to_string());
                };
                if !worker.waiting.hold(context, h.rule, h.hold.due_us, h.turn) {
                    return Err("the engine held a request its worker had no room for".into());
                }
                // The worker's first tick at or after the due time, maybe late.
                let phase = phases.get(w).copied().unwrap_or(0);
                let due = h.hold.due_us;
                let tick_at = due + (TICK_US - (due + TICK_US - phase) % TICK_US) % TICK_US;
                let late = rng_ticks.below(delay.max_late_us + 1);
                ticks.insert(((tick_at + late).max(now), w));
                held.insert(context, (index, w, eval));
                out.holds += 1;
                // Requests another key's pushed out of the full queue: denied now (their
                // hold was their ask).
                for pushed in worker.waiting.take_pushed_out() {
                    let Some((_, _, mut eval)) = held.remove(&pushed) else {
                        return Err(format!("context {pushed} pushed out but not held"));
                    };
                    eval.push_out(Micros(now));
                    if !eval.denied() {
                        return Err("a request pushed out was not denied".into());
                    }
                    out.pushed_out += 1;
                }
            }
            if let (true, true, Some(delay)) = (admitted, released, case.delay) {
                out.admitted += 1;
                let waited = at.saturating_sub(p.at_us);
                if waited > delay.max_us + TICK_US + delay.max_late_us {
                    return Err(format!(
                        "a request held {waited}us: past its max {}us, a tick and a late one",
                        delay.max_us
                    ));
                }
            }
            let Some((admissions, requests)) = per_parent.get_mut(p.parent as usize) else {
                continue;
            };
            // What the admission really cost: its estimate, or what its response used.
            let mut used = p.cost;
            if let Some(commit) = commit {
                used = rng.below(p.cost + 1);
                let settle_at = at + rng.below(2 * window_us + 1);
                unsettled.push((settle_at, commit, used));
            }
            if admitted {
                admissions.push(Admission {
                    at_us: at,
                    cost: used,
                });
            }
            // A request that read the clock in a window its parent has left is not an ask
            // of that window: the harness's lag made it late, and the rule admits nothing
            // then.
            let start = at - at % window_us;
            let Some(latest) = latest_start.get_mut(p.parent as usize) else {
                continue;
            };
            if start < *latest {
                if admitted {
                    return Err(format!("admitted a request read in a window left: {at}us"));
                }
                continue;
            }
            *latest = start;
            requests.push(ShareRequest {
                at_us: at,
                key: p.key.map(|k| k as u64 + 1),
                weight: p.key.and_then(|k| case.weights.get(k)).map_or(1, |w| w.1),
                cost: p.cost,
                admitted,
            });
        }
    }
    if !held.is_empty() {
        return Err(format!("{} held requests never released", held.len()));
    }
    judge(case, &per_parent).map(|()| out)
}

/// Every parent's admissions by the fixed window's bound, and its requests (in the order
/// they were decided) by every key's floor.
fn judge(case: &Case, per_parent: &[(Vec<Admission>, Vec<ShareRequest>)]) -> Result<(), String> {
    judge_within(case, per_parent, 0)
}

/// [`judge`], each floor less `tolerance` units.
fn judge_within(
    case: &Case,
    per_parent: &[(Vec<Admission>, Vec<ShareRequest>)],
    tolerance: u64,
) -> Result<(), String> {
    let parent = GlobalLimit::Slot(Limit::FixedWindow(
        FixedWindow::new(case.limit.limit, case.limit.window_us).map_err(|e| e.reason)?,
    ));
    for (n, (admissions, requests)) in per_parent.iter().enumerate() {
        check(&parent, admissions).map_err(|v| format!("parent org{n}: {v}"))?;
        check_floor_within(&case.limit, requests, tolerance)
            .map_err(|s| format!("parent org{n}: {}", s.message))?;
    }
    Ok(())
}

/// The case's rule as a global one, through 1 to 3 Envoys and a model of the bridge and
/// Redis ([`Simulation`]), each call taking `half_latency_us` there and back: every
/// request asks Redis, whose clock decides.
fn run_global(
    seed: u64,
    case: &Case,
    envoys: usize,
    half_latency_us: u64,
    lease: Option<u64>,
) -> Result<(), String> {
    let scope = match lease {
        Some(max) => format!(r#""scope":"global","global":{{"lease":{{"max":{max}}}}},"#),
        None => r#""scope":"global","#.to_string(),
    };
    let config = case
        .config
        .replacen(
            r#""name":"shared","#,
            &format!(r#""name":"shared",{scope}"#),
            1,
        )
        .replacen(
            r#"{"trusted_headers""#,
            r#"{"bridge":{"cluster":"weir_bridge"},"trusted_headers""#,
            1,
        );
    let mut sim = Simulation::new(&config, envoys, half_latency_us)?;
    // One call at a time per key from each Envoy, as one worker's single flight: what the
    // key leased sits in at most one place per Envoy.
    sim.single_flight = true;
    let mut rng = Rng(seed ^ 0x5eed);
    let mut planned = schedule(case, &mut rng);
    // One request per µs: Redis's clock then orders its decisions as it made them.
    for (i, p) in planned.iter_mut().enumerate() {
        p.at_us += i as u64;
    }
    let arrivals: Vec<Arrival<FakeRequest>> = planned
        .iter()
        .map(|p| Arrival {
            at_us: p.at_us,
            envoy: rng.below(envoys as u64) as usize,
            request: request(case, p),
        })
        .collect();
    let mut decided: Vec<(u64, usize, bool)> = sim
        .play(&arrivals)
        .into_iter()
        .filter_map(|d| {
            let report = d.eval.reports.first()?;
            Some((report.decided_at_us, d.index, !d.eval.denied()))
        })
        .collect();
    decided.sort();
    let mut per_parent: Vec<(Vec<Admission>, Vec<ShareRequest>)> = (0..case.parents)
        .map(|_| (Vec::new(), Vec::new()))
        .collect();
    for (at_us, index, admitted) in decided {
        let Some(p) = planned.get(index) else {
            continue;
        };
        let Some((admissions, requests)) = per_parent.get_mut(p.parent as usize) else {
            continue;
        };
        if admitted {
            admissions.push(Admission {
                at_us,
                cost: p.cost,
            });
        }
        requests.push(ShareRequest {
            at_us,
            key: p.key.map(|k| k as u64 + 1),
            weight: p.key.and_then(|k| case.weights.get(k)).map_or(1, |w| w.1),
            cost: p.cost,
            admitted,
        });
    }
    // A key's units leased to an Envoy, or on their way there, are out of reach of its
    // requests elsewhere: one lease per Envoy.
    let tolerance = lease.map_or(0, |max| envoys as u64 * max.saturating_sub(1));
    judge_within(case, &per_parent, tolerance)
}

#[test]
fn every_drawn_global_share_keeps_the_parents_bound_and_every_keys_floor() {
    let mut failed = Vec::new();
    let mut leased = 0;
    for seed in seeds(150) {
        let case = draw(seed);
        let mut rng = Rng(seed ^ 0x61_0ba1);
        let envoys = 1 + rng.below(3) as usize;
        let half_latency_us = log_uniform(&mut rng, 1, case.limit.window_us.max(2));
        // Leases in half the cases: up to 32 units a take.
        let lease = chance(&mut rng, 2).then(|| log_uniform(&mut rng, 2, 32));
        leased += u64::from(lease.is_some());
        if let Err(why) = run_global(seed, &case, envoys, half_latency_us, lease) {
            failed.push(format!(
                "seed {seed}: {why}\n  {envoys} Envoys, {half_latency_us}us each way, {} keys, {:?}",
                case.demands.len(),
                case.limit
            ));
        }
    }
    println!("search_shares (global): {leased} cases with leases");
    assert!(
        failed.is_empty(),
        "{} failing:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

#[test]
fn every_drawn_share_keeps_the_parents_bound_and_every_keys_floor() {
    let mut failed = Vec::new();
    let mut skewed = 0;
    let mut crowds = 0;
    let mut commits = 0;
    let (mut delays, mut holds, mut released, mut pushed_out) = (0, 0, 0, 0);
    for seed in seeds(300) {
        let case = draw(seed);
        commits += u64::from(case.commit);
        skewed += u64::from(case.demands.iter().any(|d| d.iter().any(|x| *x >= 100)));
        crowds += u64::from(case.demands.len() >= 100);
        delays += u64::from(case.delay.is_some());
        match run(seed, &case) {
            Ok(held) => {
                holds += held.holds;
                released += held.admitted;
                pushed_out += held.pushed_out;
            }
            Err(why) => failed.push(format!(
                "seed {seed}: {why}\n  {} keys, limit {:?}, lag {}us, delay {:?}, config {}",
                case.demands.len(),
                case.limit,
                case.clock_lag_us,
                case.delay,
                case.config
            )),
        }
    }
    println!(
        "search_shares: {skewed} cases with a key at 100 or more a window, {crowds} with 100 \
         keys or more, {commits} with a commit, {delays} with a delay ({holds} holds, \
         {released} held requests admitted, {pushed_out} pushed out of a full queue)"
    );
    assert!(
        failed.is_empty(),
        "{} failing:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
