//! Costs known only after the response (`commit`), in simulated time: a request is
//! admitted with its estimate, its response ends later with the actual cost, and the
//! key's state is settled then — a refund while it is exact, an excess charged as debt.
//!
//! The bound: with estimates that are upper bounds, the admissions *at their actual
//! cost and admission instant* keep the algorithm's own bound (`conformance::check`),
//! however many requests are in flight. With estimates below the actual cost (a random
//! search in `commit_lying.rs`), each request
//! placed at its admission with its cost up to its estimate and its excess placed where
//! its commit lands keeps the algorithm's bound grown by the excess in flight at once
//! (docs/algorithms.md, "Estimates below the usage"); a fixed window, which carries its
//! debt, keeps that of a token bucket refilled with its limit at every window too.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::collections::BTreeMap;

use support::commits::{committed_rule, limit_of, local, WithBody};
use support::{engine, evaluate, user, Rng, T0};
use weir_core::algorithms::SlotState;
use weir_core::conformance::{self, Admission};
use weir_core::engine::{Engine, PendingCommit};
use weir_core::rules::RuleId;
use weir_core::store::memory::MemoryStore;
use weir_core::time::Micros;
use weir_core::usage::RequestBody;
use weir_testkit::simulation::configured_limit;

const MS: u64 = 1_000;
const S: u64 = 1_000_000;

/// 10,000 tokens a second. Refunds are exact until the next refill: a bucket refilled
/// every second refunds most responses shorter than that.
const BUCKET: &str =
    r#"{"algorithm":"token_bucket","capacity":20000,"refill":10000,"period":"1s"}"#;
const WINDOW: &str = r#"{"algorithm":"fixed_window","limit":20000,"window":"2s"}"#;
const SMALL_WINDOW: &str = r#"{"algorithm":"fixed_window","limit":2000,"window":"2s"}"#;

/// What a run admitted: at admission instants with actual costs, and totals.
#[derive(Default)]
struct Run {
    admissions: Vec<Admission>,
    estimated: u64,
    actual: u64,
    denied: u64,
    /// The most requests in flight at once.
    in_flight: usize,
}

/// Offers `per_s` requests per second for `secs`, each with a random estimate up to
/// `max_estimate` and an actual cost from `actual(estimate, rng)`; each response
/// ends up to `max_duration_us` after its admission, when its cost is settled.
fn run(
    e: &Engine,
    per_s: u64,
    secs: u64,
    max_estimate: u64,
    max_duration_us: u64,
    actual: impl Fn(u64, &mut Rng) -> u64,
    settle: bool,
) -> Run {
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut rng = Rng(0x0c0f_fee0_5eed);
    // Responses still open, by the instant they end.
    let mut open: BTreeMap<(u64, u64), (PendingCommit, u64)> = BTreeMap::new();
    let mut out = Run::default();
    let gap_us = S / per_s;
    for i in 0..per_s * secs {
        let now = T0 + i * gap_us;
        while let Some(entry) = open.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((end, _), (commit, cost)) = entry.remove_entry();
            if settle {
                e.commit(&store, &commit, cost, Micros(end)).unwrap();
            }
        }
        let estimate = 1 + rng.below(max_estimate);
        let request = user("alice").header("x-estimate", estimate.to_string());
        let eval = evaluate(e, &store, &request, now);
        if eval.denied() {
            assert!(eval.commits.is_empty(), "a denied request reserves nothing");
            out.denied += 1;
            continue;
        }
        let [commit] = &eval.commits[..] else {
            panic!("one commit per admitted request: {:?}", eval.commits);
        };
        let commit = commit.clone();
        assert_eq!(
            (commit.reserved, commit.counted_at),
            (estimate, Micros(now))
        );
        let cost = actual(estimate, &mut rng);
        out.estimated += estimate;
        out.actual += cost;
        out.admissions.push(Admission { at_us: now, cost });
        let end = now + rng.below(max_duration_us + 1);
        open.insert((end, i), (commit, cost));
        out.in_flight = out.in_flight.max(open.len());
    }
    out
}

#[test]
fn upper_bound_estimates_keep_the_bound_with_many_requests_in_flight() {
    for limit in [BUCKET, WINDOW] {
        let e = committed_rule(limit, 400);
        // 1,000 requests/s, estimates up to 400 (mean 200: 200,000 tokens/s asked for a
        // budget of 10,000/s), each really costing a quarter to all of its estimate;
        // responses last up to 800 ms.
        let cost =
            |estimate: u64, rng: &mut Rng| estimate / 4 + rng.below(estimate - estimate / 4 + 1);
        let settled = run(&e, 1_000, 10, 400, 800 * MS, cost, true);
        conformance::check(&limit_of(&e), &settled.admissions)
            .unwrap_or_else(|v| panic!("{limit}: {v}"));
        assert!(
            settled.in_flight >= 20,
            "{limit}: only {} in flight",
            settled.in_flight
        );
        // The budget: 20,000 at once + 10,000/s for 10 s for the bucket, 5 windows of
        // 20,000 for the window.
        let budget = if limit == BUCKET { 120_000 } else { 100_000 };
        assert!(
            settled.actual <= budget,
            "{limit}: {} > {budget}",
            settled.actual
        );
        // The refunds came back and were spent: the same run with the estimates left
        // standing admits far fewer actual tokens.
        let unsettled = run(&e, 1_000, 10, 400, 800 * MS, cost, false);
        eprintln!(
            "{limit}: actual tokens admitted {} settled / {} unsettled of a {budget} budget; \
             {} requests in flight at most",
            settled.actual, unsettled.actual, settled.in_flight
        );
        assert!(
            settled.actual * 10 >= unsettled.actual * 13,
            "{limit}: settled {} vs unsettled {}",
            settled.actual,
            unsettled.actual
        );
    }
}

#[test]
fn costs_above_the_estimates_break_the_bound_and_the_checker_says_so() {
    // The check can fail: actual costs above the estimates (estimates that are not
    // upper bounds) overshoot.
    for limit in [BUCKET, WINDOW] {
        let e = committed_rule(limit, 400);
        let r = run(
            &e,
            1_000,
            10,
            400,
            800 * MS,
            |estimate, _| estimate * 2,
            true,
        );
        assert!(
            conformance::check(&limit_of(&e), &r.admissions).is_err(),
            "{limit}: costs twice the estimates passed"
        );
    }
}

#[test]
fn underestimates_overshoot_by_at_most_the_excess_in_flight() {
    // Estimates a fifth below the actual cost, one request in flight at a time (one
    // every 20 ms, each over within 15 ms): the excess of each response is charged as
    // debt when it ends, so the admissions keep the bound of a bucket grown by the
    // largest excess (400 / 5 = 80).
    let e = committed_rule(BUCKET, 400);
    let r = run(
        &e,
        50,
        20,
        400,
        15 * MS,
        |estimate, _| estimate + estimate / 5,
        true,
    );
    assert!(r.denied > 0, "the key was at its limit");
    let grown = configured_limit(
        &committed_rule(
            r#"{"algorithm":"token_bucket","capacity":20080,"refill":10000,"period":"1s"}"#,
            400,
        ),
        RuleId(0),
    )
    .unwrap();
    conformance::check(&grown, &r.admissions).unwrap();
}

/// A bucket refilled every 100 ms, for the exact cases.
const FINE_BUCKET: &str =
    r#"{"algorithm":"token_bucket","capacity":2000,"refill":100,"period":"100ms"}"#;

fn bucket_state(tokens: u64, last_refill_us: u64) -> SlotState {
    SlotState {
        a: tokens,
        b: last_refill_us,
    }
}

#[test]
fn a_token_bucket_refunds_only_until_its_next_refill() {
    let limit = local(&committed_rule(FINE_BUCKET, 400));
    // 300 counted at T0 + 10 ms from 1,000 tokens refilled at T0.
    let after = bucket_state(700, T0);
    assert_eq!(
        limit.settle(Some(after), T0 + 10 * MS, 300, 120, T0 + 90 * MS),
        Some(bucket_state(880, T0)),
        "no refill since: the 180 unused come back"
    );
    assert_eq!(
        limit.settle(Some(after), T0 + 10 * MS, 300, 120, T0 + 150 * MS),
        None,
        "a refill came (T0 + 100 ms): the refund is forgotten"
    );
    assert_eq!(
        limit.settle(Some(bucket_state(1_950, T0)), T0, 300, 120, T0 + 50 * MS),
        Some(bucket_state(2_000, T0)),
        "never above capacity"
    );
    assert_eq!(
        limit.settle(None, T0, 300, 120, T0),
        None,
        "no state: nothing"
    );
    assert_eq!(limit.settle(Some(after), T0, 300, 300, T0), None, "exact");
}

#[test]
fn a_token_bucket_charges_an_excess_as_debt_that_delays_its_refills() {
    let e = committed_rule(FINE_BUCKET, 400);
    let limit = local(&e);
    // 50 tokens left, 400 more than estimated: 350 owed, 3.5 refills of 100 → paid by
    // the 4th refill, which leaves 50: the bucket is stored at that refill with them
    // (none before it, 50 from it on).
    assert_eq!(
        limit.settle(Some(bucket_state(100, T0)), T0, 10, 60, T0),
        Some(bucket_state(50, T0)),
        "an excess the bucket holds is taken"
    );
    assert_eq!(
        limit.settle(Some(bucket_state(50, T0)), T0, 100, 500, T0 + 20 * MS),
        Some(bucket_state(50, T0 + 400 * MS))
    );
    // A second debt on top: 30 of the 50 to come, then 80 more, 1 refill (20 left).
    let owed = Some(bucket_state(50, T0 + 400 * MS));
    assert_eq!(
        limit.settle(owed, T0, 100, 130, T0 + 30 * MS),
        Some(bucket_state(20, T0 + 400 * MS))
    );
    assert_eq!(
        limit.settle(owed, T0, 100, 230, T0 + 30 * MS),
        Some(bucket_state(20, T0 + 500 * MS))
    );

    // Through the engine: the key is denied until the debt is repaid, and says when.
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let ask = |n: u64| user("bob").header("x-estimate", n.to_string());
    let first = evaluate(&e, &store, &ask(400), T0);
    assert!(!first.denied());
    // The whole bucket (2,000) is spent and 1,000 more owed: 10 refills of 100.
    assert!(e
        .commit(&store, &first.commits[0], 3_000, Micros(T0 + 5 * MS))
        .unwrap());
    let denied = evaluate(&e, &store, &ask(100), T0 + 10 * MS);
    assert!(denied.denied());
    let retry_us = denied.verdicts[0].decision.retry_after_ns.unwrap() / 1_000;
    assert_eq!(
        T0 + 10 * MS + retry_us,
        T0 + 1_100 * MS,
        "paid by the 11th refill"
    );
    assert!(evaluate(&e, &store, &ask(100), T0 + 1_099 * MS).denied());
    assert!(!evaluate(&e, &store, &ask(100), T0 + 1_100 * MS).denied());
}

#[test]
fn a_key_without_state_is_charged_its_excess_from_a_fresh_start() {
    // Issue 19, defect 4: a key whose state is gone (its slot taken over, its Redis key
    // expired: a full bucket, a window over) while a response ran keeps the excess.
    let bucket = local(&committed_rule(FINE_BUCKET, 400));
    assert_eq!(
        bucket.settle(None, T0, 100, 600, T0 + 5 * S),
        Some(bucket_state(1_500, T0 + 5 * S)),
        "a full bucket from now, less the 500 over the estimate"
    );
    // 2,500 over: the whole bucket and 500 owed, 5 refills of 100 from now.
    assert_eq!(
        bucket.settle(None, T0, 100, 2_600, T0 + 5 * S),
        Some(bucket_state(0, T0 + 5 * S + 500 * MS))
    );
    assert_eq!(
        bucket.settle(None, T0, 600, 100, T0 + 5 * S),
        None,
        "no refund"
    );
    let window = local(&committed_rule(SMALL_WINDOW, 400));
    let counted = |count, start| SlotState { a: count, b: start };
    assert_eq!(
        window.settle(None, T0, 100, 700, T0 + 3 * S),
        Some(counted(600, T0 + 2 * S)),
        "counted in now's window"
    );
    assert_eq!(window.settle(None, T0, 700, 100, T0 + 3 * S), None);
}

#[test]
fn a_token_bucket_debt_is_exact_not_rounded_up_per_commit() {
    // Issue 19, defect 11: four commits of 240 tokens of debt each, refill 500 a second.
    // Rounded up per commit, each pushed the refills a whole second (4 s, the first 500
    // at 5 s); exactly, the 960 owed are paid at 2 s, with 40 left over from that refill.
    let e = committed_rule(
        r#"{"algorithm":"token_bucket","capacity":1000,"refill":500,"period":"1s"}"#,
        1_000,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let ask = |n: u64| user("grace").header("x-estimate", n.to_string());
    let admitted: Vec<_> = (0..4)
        .map(|_| evaluate(&e, &store, &ask(250), T0))
        .collect();
    assert!(admitted.iter().all(|a| !a.denied()), "the bucket's 1,000");
    for (i, a) in admitted.iter().enumerate() {
        assert!(e
            .commit(
                &store,
                &a.commits[0],
                490,
                Micros(T0 + (10 + i as u64) * MS)
            )
            .unwrap());
    }
    let retry_at = |n: u64, now: u64| {
        let denied = evaluate(&e, &store, &ask(n), now);
        assert!(denied.denied(), "{n} at {}", now - T0);
        now + denied.verdicts[0].decision.retry_after_ns.unwrap() / 1_000
    };
    // The 40 left over at 2 s exist from 2 s on, not before; 41 wait for the 3 s refill.
    assert_eq!(
        retry_at(40, T0 + 100 * MS),
        T0 + 2 * S,
        "honest Retry-After"
    );
    assert_eq!(retry_at(40, T0 + 2 * S - 1), T0 + 2 * S);
    assert_eq!(retry_at(41, T0 + 2 * S), T0 + 3 * S);
    assert!(!evaluate(&e, &store, &ask(40), T0 + 2 * S).denied());
    assert!(!evaluate(&e, &store, &ask(500), T0 + 3 * S).denied());
}

#[test]
fn a_fixed_window_carries_what_it_cannot_hold_into_the_next_windows() {
    // Issue 19, defect 11: an excess beyond the window's limit is debt the next windows
    // repay, `limit` per window, not forgiven when the window ends.
    let e = committed_rule(SMALL_WINDOW, 400);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let ask = |n: u64| user("heidi").header("x-estimate", n.to_string());
    let first = evaluate(&e, &store, &ask(400), T0);
    for _ in 0..4 {
        assert!(!evaluate(&e, &store, &ask(400), T0).denied());
    }
    // 4,600 over the estimate on a full window: 6,600 counted, 4,600 carried into the
    // next window, 2,600 into the one after, 600 into the third.
    assert!(e
        .commit(&store, &first.commits[0], 5_000, Micros(T0 + S))
        .unwrap());
    let next = evaluate(&e, &store, &ask(1), T0 + 2 * S);
    assert!(next.denied(), "the next window repays the debt");
    let decision = next.verdicts[0].decision;
    assert_eq!(decision.retry_after_ns, Some(4_000_000_000), "at T0 + 6 s");
    assert_eq!(
        decision.reset_after_ns, 6_000_000_000,
        "the debt ends at T0 + 8 s"
    );
    assert!(evaluate(&e, &store, &ask(1), T0 + 6 * S - 1).denied());
    assert!(!evaluate(&e, &store, &ask(400), T0 + 6 * S).denied());
    assert!(!evaluate(&e, &store, &ask(400), T0 + 6 * S).denied());
    assert!(!evaluate(&e, &store, &ask(400), T0 + 6 * S).denied());
    assert!(
        !evaluate(&e, &store, &ask(200), T0 + 6 * S).denied(),
        "1,400 left"
    );
    assert!(evaluate(&e, &store, &ask(1), T0 + 6 * S).denied());
    assert!(
        !evaluate(&e, &store, &ask(400), T0 + 8 * S).denied(),
        "paid"
    );
}

#[test]
fn a_fixed_window_refunds_in_its_window_and_charges_debt_to_the_current_one() {
    let e = committed_rule(SMALL_WINDOW, 400);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let ask = |n: u64| user("carol").header("x-estimate", n.to_string());
    // The window of T0 (a multiple of 2 s): 2,000.
    let a = evaluate(&e, &store, &ask(400), T0);
    let b = evaluate(&e, &store, &ask(400), T0);
    for _ in 0..3 {
        assert!(!evaluate(&e, &store, &ask(400), T0).denied());
    }
    assert!(evaluate(&e, &store, &ask(1), T0).denied(), "2,000 reserved");
    // `a` cost 100: 300 back in its own window.
    assert!(e
        .commit(&store, &a.commits[0], 100, Micros(T0 + 500 * MS))
        .unwrap());
    assert!(!evaluate(&e, &store, &ask(300), T0 + 600 * MS).denied());
    assert!(evaluate(&e, &store, &ask(1), T0 + 600 * MS).denied());
    // `b` ends in the next window, once the key counts in it: its refund is forgotten.
    let c = evaluate(&e, &store, &ask(100), T0 + 2_050 * MS);
    assert!(!e
        .commit(&store, &b.commits[0], 0, Micros(T0 + 2_100 * MS))
        .unwrap());
    // An excess in the current window counts there: 1,800 over → 100 left.
    assert!(e
        .commit(&store, &c.commits[0], 1_900, Micros(T0 + 2_300 * MS))
        .unwrap());
    assert!(!evaluate(&e, &store, &ask(100), T0 + 2_400 * MS).denied());
    assert!(evaluate(&e, &store, &ask(1), T0 + 2_400 * MS).denied());
}

#[test]
fn a_request_another_rule_denies_commits_nothing_and_shadow_rules_commit_too() {
    let e = engine(
        r#"{"rules":[
            {"name":"llm","key":[{"header":"x-user"}],"shadow":true,
             "limit":{"algorithm":"fixed_window","limit":1000,"window":"1m"},
             "cost":{"header":"x-estimate","max":500},"commit":{"header":"x-tokens"}},
            {"name":"requests","key":[{"header":"x-user"}],"reservoir":{"max":1},
             "limit":{"algorithm":"fixed_window","limit":1,"window":"1m"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let ask = user("dan").header("x-estimate", "500");
    let first = evaluate(&e, &store, &ask, T0);
    assert!(!first.denied());
    assert_eq!(
        first.commits.len(),
        1,
        "the shadow rule counted and will settle"
    );
    let second = evaluate(&e, &store, &ask, T0);
    assert!(
        second.denied(),
        "the second rule allows one request a minute"
    );
    // The filter settles the shadow rule's reservation at 0 (the request never reached
    // the upstream): the estimate comes back.
    assert_eq!(second.commits.len(), 1);
    assert!(e.commit(&store, &second.commits[0], 0, Micros(T0)).unwrap());
    assert!(
        !e.commit(&store, &first.commits[0], 500, Micros(T0))
            .unwrap(),
        "exact: nothing"
    );
}

/// A request with a JSON body, as the filter sees it once the body is in.
#[test]
fn a_cost_estimated_from_the_body_reads_it_only_for_the_requests_it_matches() {
    let e = engine(
        r#"{"rules":[
            {"name":"llm","match":{"path":{"prefix":"/v1/"}},"key":[{"header":"x-user"}],
             "limit":{"algorithm":"token_bucket","capacity":10000,"refill":10000,"period":"1h"},
             "cost":{"body":{"max_bytes":4096},"default":300,"max":2000},
             "commit":{"body":{}}},
            {"name":"per-user","key":[{"header":"x-user"}],
             "limit":{"algorithm":"fixed_window","limit":100,"window":"1m"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let at = |path: &str| user("erin").header(":path", path);
    let wanted = |path: &str| {
        let mut facts = e.facts(at(path));
        e.request_body_wanted(&mut facts)
    };
    assert_eq!(wanted("/v1/chat/completions"), Some(4096));
    assert_eq!(
        wanted("/health"),
        None,
        "no rule estimating from the body matches"
    );
    assert_eq!(
        engine(r#"{"rules":[{"name":"a","limit":{"algorithm":"fixed_window","limit":1,"window":"1s"}}]}"#)
            .request_body_wanted(&mut e.facts(at("/v1/x"))),
        None
    );
    let cost = |body: RequestBody<'_>| {
        let mut facts = e.facts(WithBody(at("/v1/chat/completions"), body));
        let eval = e.evaluate(
            &store,
            &mut e.worker(),
            &support::SEED,
            &mut facts,
            Micros(T0),
        );
        assert!(!eval.denied());
        eval.reports[0].cost
    };
    // 1,000 + ⌈33 / 4⌉.
    let body = br#"{"max_tokens":1000,"messages":[]}"#;
    assert_eq!(body.len(), 33);
    assert_eq!(cost(RequestBody::Complete(body)), 1_009);
    assert_eq!(
        cost(RequestBody::Complete(b"{}")),
        300,
        "no max_tokens: default"
    );
    assert_eq!(cost(RequestBody::Absent), 300, "no body: default");
    assert_eq!(cost(RequestBody::TooLarge), 2_000, "too large to read: max");
    let greedy = br#"{"max_tokens":99999}"#;
    assert_eq!(cost(RequestBody::Complete(greedy)), 2_000, "capped at max");
}

#[test]
fn a_response_claiming_a_huge_cost_is_charged_at_most_a_million() {
    let e = committed_rule(FINE_BUCKET, 400);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let ask = |n: u64| user("mallory").header("x-estimate", n.to_string());
    let first = evaluate(&e, &store, &ask(100), T0);
    assert!(e
        .commit(&store, &first.commits[0], u64::MAX, Micros(T0))
        .unwrap());
    // 1,000,000 − 100 over the 1,900 left: 998,000 owed, 9,980 refills of 100 ms.
    let denied = evaluate(&e, &store, &ask(1), T0);
    let retry_s = denied.verdicts[0].decision.retry_after_ns.unwrap() / 1_000_000_000;
    assert_eq!(retry_s, 998, "{:?}", denied.verdicts[0].decision);
}
