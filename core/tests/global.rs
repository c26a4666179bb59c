//! Global rules through the engine, with the bridge's replies written out by hand (the
//! real bridge is exercised by weir-bridge's suites and the end-to-end suite): what a
//! rule asks for, what a reply leaves in the key's slot (units held, a reservation, a
//! cached denial), failure modes and the backoff.

use crate::support;

use support::{engine, evaluate, user, T0};
use weir_core::engine::{
    BridgeError, Engine, Evaluation, FailureOutcome, RuleOutcome, Source, BRIDGE_FAILING_FOR_US,
    BRIDGE_FAILURES_TO_SKIP,
};
use weir_core::rules::Scope;
use weir_core::store::memory::MemoryStore;
use weir_core::store::SharedStore;
use weir_core::time::Micros;
use weir_core::wire::v2::{self, Granted};
use weir_core::wire::ReplyError;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

mod failures;
mod saturated;

const MS: u64 = 1_000;

/// A bucket of 100 per minute per `x-user`, plus `extra` rule fields.
fn global(extra: &str) -> Engine {
    engine(&format!(
        r#"{{"bridge":{{"cluster":"weir_bridge"}},"rules":[{{"name":"tenant","scope":"global",
            "key":[{{"header":"x-user"}}],
            "limit":{{"algorithm":"token_bucket","capacity":100,"refill":100,"period":"1m"}}{extra}}}]}}"#
    ))
}

fn eval_at(e: &Engine, store: &MemoryStore, now: u64) -> Evaluation {
    evaluate(e, store, &user("acme"), now)
}

/// A result for rule 0 at T0.
fn result(allowed: bool, granted: u64, remaining: u64) -> Granted {
    Granted {
        id: 0,
        allowed,
        granted,
        limit: 100,
        remaining,
        retry_after_ns: (!allowed).then_some(5_000_000_000),
        reset_after_ns: 60_000_000_000,
        now_us: T0,
        due_ns: 0,
        spacing_ns: 0,
        valid_ns: 0,
    }
}

fn reply(items: Vec<Granted>) -> Result<v2::Reply, ReplyError> {
    Ok(v2::Reply { items })
}

/// A fresh store where acme's first request, at T0, got `answer` at once.
fn answered_at_t0(e: &Engine, answer: Result<v2::Reply, ReplyError>) -> (MemoryStore, Evaluation) {
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(e, &store, T0);
    e.complete(&mut eval, &store, Micros(T0), Micros(T0), answer);
    (store, eval)
}

/// Fails [`BRIDGE_FAILURES_TO_SKIP`] calls in a row with `error`, spread evenly over
/// [`BRIDGE_FAILING_FOR_US`] up to `last`, checking that only the last one starts the
/// backoff; the last evaluation.
fn fail_in_a_row(e: &Engine, store: &MemoryStore, last: u64, error: ReplyError) -> Evaluation {
    let calls = u64::from(BRIDGE_FAILURES_TO_SKIP);
    let mut eval = Evaluation::default();
    for n in 1..=calls {
        let now = last - BRIDGE_FAILING_FOR_US * (calls - n) / (calls - 1);
        eval = eval_at(e, store, now);
        assert_eq!(eval.pending.len(), 1, "{error}: call {n} was made");
        e.complete(
            &mut eval,
            store,
            Micros(now),
            Micros(now),
            Err(error.clone()),
        );
    }
    eval
}

#[test]
fn failures_in_a_row_skip_the_bridge_only_once_they_span_a_while() {
    let e = global("");
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    // A batch of calls failing at once (one connection that could not be made): many
    // failures, no time: not skipped.
    for n in 0..10 {
        let mut eval = eval_at(&e, &store, T0 + n);
        assert_eq!(eval.pending.len(), 1, "call {n}");
        e.complete(
            &mut eval,
            &store,
            Micros(T0 + n),
            Micros(T0 + n),
            Err(ReplyError::Unreachable),
        );
    }
    // Still failing a while later: skipped.
    let last = T0 + BRIDGE_FAILING_FOR_US;
    let mut eval = eval_at(&e, &store, last);
    e.complete(
        &mut eval,
        &store,
        Micros(last),
        Micros(last),
        Err(ReplyError::Unreachable),
    );
    assert_eq!(
        eval_at(&e, &store, last + 1).bridge_error,
        Some(BridgeError::Skipped)
    );
}

/// The request body the engine would send, parsed back as the bridge reads it.
fn sent_items(e: &Engine, eval: &Evaluation) -> Vec<v2::Item> {
    v2::Request::parse(&e.bridge_request(&eval.pending))
        .unwrap_or_else(|err| panic!("the bridge would refuse it: {err}"))
        .items
        .into_iter()
        .map(|checked| checked.item)
        .collect()
}

#[test]
fn exact_global_rules_ask_the_bridge_every_time() {
    let e = global("");
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    for _ in 0..3 {
        let mut eval = eval_at(&e, &store, T0);
        let items = sent_items(&e, &eval);
        let item = &items[0];
        assert_eq!((item.id, item.cost, item.want, item.reserve), (0, 1, 1, 0));
        assert_eq!((item.ttl_us, item.horizon_us, item.shadow), (0, 0, false));
        assert_eq!(item.descriptor, ["=acme"]);
        e.complete(
            &mut eval,
            &store,
            Micros(T0),
            Micros(T0),
            reply(vec![result(true, 1, 50)]),
        );
        assert!(!eval.denied());
        assert_eq!(eval.verdicts[0].decision.remaining, 50);
        assert_eq!(eval.reports[0].source, Some(Source::Bridge));
    }
}

#[test]
fn leases_are_sized_by_demand_and_spent_locally() {
    // 10 requests a millisecond; units may wait 10 ms.
    let e = global(r#","global":{"lease":{"max":1000,"ttl":"10ms"}}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut wants = Vec::new();
    let mut calls = 0;
    for i in 0..2_000 {
        let now = T0 + i * 100;
        let mut eval = eval_at(&e, &store, now);
        if let Some(item) = eval.pending.first() {
            calls += 1;
            wants.push(item.want);
            let want = item.want;
            let mut granted = result(true, want, 10_000);
            granted.valid_ns = 10_000_000;
            e.complete(
                &mut eval,
                &store,
                Micros(now),
                Micros(now),
                reply(vec![granted]),
            );
        } else {
            assert_eq!(eval.reports[0].source, Some(Source::Lease));
        }
        assert!(!eval.denied());
    }
    assert_eq!(wants[0], 1, "a first request has no demand yet");
    // At 10,000 per second, 10 ms of demand is 100 units.
    let settled = *wants.last().unwrap();
    assert!((90..=120).contains(&settled), "{wants:?}");
    assert!(calls < 40, "{calls} calls for 2,000 requests: {wants:?}");
}

#[test]
fn held_units_are_spent_only_within_their_validity() {
    let e = global(r#","global":{"lease":{"max":100,"ttl":"10ms"}}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    let mut granted = result(true, 50, 50);
    granted.valid_ns = 10_000_000;
    // The call left at T0 and came back 2 ms later: units expire 10 ms after T0.
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0 + 2 * MS),
        reply(vec![granted]),
    );
    let eval = eval_at(&e, &store, T0 + 10 * MS);
    assert_eq!(eval.reports[0].source, Some(Source::Lease));
    let eval = eval_at(&e, &store, T0 + 10 * MS + 1);
    assert_eq!(
        eval.pending.len(),
        1,
        "expired units are dropped, not spent"
    );
}

#[test]
fn lease_served_requests_report_the_global_quota() {
    let e = engine(
        r#"{"bridge":{"cluster":"b"},"rules":[{"name":"tenant","scope":"global",
            "limit":{"algorithm":"fixed_window","limit":1000,"window":"1h"},
            "global":{"lease":{"max":10}}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    let mut granted = result(true, 10, 900);
    granted.limit = 1000;
    granted.valid_ns = 1_000_000_000;
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0),
        reply(vec![granted]),
    );
    let eval = eval_at(&e, &store, T0 + MS);
    assert_eq!(eval.reports[0].source, Some(Source::Lease));
    // What Redis had left plus the 8 units this Envoy still holds: not the lease's own 8.
    let d = eval.verdicts[0].decision;
    assert_eq!((d.limit, d.remaining), (1000, 908));
    assert!(d.reset_after_ns > 59_000_000_000);
}

#[test]
fn a_denial_is_cached_for_its_cost_and_above() {
    let e = engine(
        r#"{"bridge":{"cluster":"b"},"rules":[{"name":"tenant","scope":"global",
            "cost":{"header":"x-cost"},
            "limit":{"algorithm":"fixed_window","limit":100,"window":"1h"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let cost = |n: &str| user("acme").header("x-cost", n);
    let mut eval = evaluate(&e, &store, &cost("10"), T0);
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0),
        reply(vec![result(false, 0, 4)]),
    );
    assert!(eval.denied());
    for t in [1, MS, 4_999_999] {
        let eval = evaluate(&e, &store, &cost("10"), T0 + t);
        assert!(eval.pending.is_empty(), "a cached denial called the bridge");
        assert_eq!(eval.reports[0].source, Some(Source::DenialCache));
        let retry = eval.verdicts[0].decision.retry_after_ns.unwrap();
        assert_eq!(retry, (5_000_000 - t) * 1_000);
        assert!(evaluate(&e, &store, &cost("20"), T0 + t).denied());
    }
    // A smaller request may fit: it asks Redis (the bug of envoyproxy/ratelimit#1077).
    assert_eq!(evaluate(&e, &store, &cost("1"), T0 + MS).pending.len(), 1);
    assert_eq!(
        evaluate(&e, &store, &cost("10"), T0 + 5_000_000)
            .pending
            .len(),
        1
    );
}

#[test]
fn a_denial_from_the_lease_slot_writes_nothing() {
    // Under attack every request of a denied key is answered from its lease slot: one
    // read of shared data, no CAS, so workers do not contend on the key. (Before, each
    // denial wrote its demand into the slot.)
    let e = global("");
    let (store, _) = answered_at_t0(&e, reply(vec![result(false, 0, 0)]));
    store.fail_next_writes(1, weir_core::store::StoreError::Host(1));
    for t in [1, MS, 2 * MS] {
        let eval = eval_at(&e, &store, T0 + t);
        assert!(eval.denied() && eval.pending.is_empty());
        assert_eq!(eval.reports[0].source, Some(Source::DenialCache));
    }
    assert_eq!(store.failures_left(), 1, "a denial wrote shared data");
}

#[test]
fn a_shadow_global_rule_does_not_switch_off_the_rules_after_it() {
    let e = engine(
        r#"{"bridge":{"cluster":"b"},"rules":[
            {"name":"trial","scope":"global","shadow":true,"limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}},
            {"name":"enforced","scope":"global","limit":{"algorithm":"fixed_window","limit":5,"window":"1h"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    let items = sent_items(&e, &eval);
    assert_eq!(
        items.iter().map(|i| (i.id, i.shadow)).collect::<Vec<_>>(),
        [(0, true), (1, false)]
    );
    // The bridge goes on past the shadow denial and denies the enforcing rule too.
    let shadow_denied = result(false, 0, 0);
    let mut enforced = result(false, 0, 0);
    enforced.id = 1;
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0),
        reply(vec![shadow_denied, enforced]),
    );
    assert_eq!(eval.shadow_limited.len(), 1);
    assert!(eval.denied(), "the enforcing rule decided");
    assert_eq!(e.rule_name(eval.denied_by.unwrap()), "enforced");
}

#[test]
fn rules_after_a_bridge_denial_are_not_charged() {
    let e = engine(
        r#"{"bridge":{"cluster":"b"},"rules":[
            {"name":"first","scope":"global","limit":{"algorithm":"fixed_window","limit":5,"window":"1m"}},
            {"name":"second","scope":"global","limit":{"algorithm":"fixed_window","limit":5,"window":"1m"}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    assert_eq!(eval.pending.len(), 2, "both rules go in one call");
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0),
        reply(vec![result(false, 0, 0)]),
    );
    assert!(eval.denied());
    assert_eq!(eval.reports.len(), 1, "the second rule was not evaluated");
}

#[test]
fn a_waiting_request_is_served_from_what_another_call_left() {
    let e = global(r#","global":{"lease":{"max":100,"ttl":"1s"}}"#);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    // Two requests miss at once; the first one's call brings back units for both.
    let mut first = eval_at(&e, &store, T0);
    let mut waiting = eval_at(&e, &store, T0);
    assert_eq!((first.pending.len(), waiting.pending.len()), (1, 1));
    let mut granted = result(true, 5, 50);
    granted.valid_ns = 1_000_000_000;
    e.complete(
        &mut first,
        &store,
        Micros(T0),
        Micros(T0 + 1),
        reply(vec![granted]),
    );
    e.revisit(&mut waiting, &store, Micros(T0 + 1), 1);
    assert!(waiting.pending.is_empty() && !waiting.denied());
    assert_eq!(waiting.reports[0].source, Some(Source::Lease));
}

/// Issue 19, defect 8: the config accepted a `horizon` of a minute and the bridge refused
/// every call of the rule (400). The longest `ttl` and `horizon` the config accepts travel
/// to the bridge and are accepted there; one µs more is refused by the config check.
#[test]
fn the_longest_lease_a_config_accepts_is_one_the_bridge_accepts() {
    let gcra = |ttl: &str, horizon: &str| {
        format!(
            r#"{{"bridge":{{"cluster":"weir_bridge"}},"rules":[{{"name":"tenant","scope":"global",
                "key":[{{"header":"x-user"}}],
                "limit":{{"algorithm":"gcra","rate":1,"period":"1s","burst":100000}},
                "global":{{"lease":{{"max":50,"ttl":"{ttl}","horizon":"{horizon}"}}}}}}]}}"#
        )
    };
    let e = engine(&gcra("1h", "10s"));
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let eval = eval_at(&e, &store, T0);
    let sent = sent_items(&e, &eval);
    assert_eq!(
        (sent[0].ttl_us, sent[0].horizon_us),
        (3_600_000_000, 10_000_000)
    );
    for (ttl, horizon, field) in [
        ("1h", "10000001us", "horizon"),
        ("3600000001us", "10s", "ttl"),
    ] {
        let err = weir_core::config::parse(gcra(ttl, horizon).as_bytes()).unwrap_err();
        assert_eq!(err.path, format!("rules[0].global.lease.{field}"), "{err}");
    }
}

/// Issue 19, defect 7: a global rule's local fallback admitted requests with their
/// estimate and never settled them (the commit looked for a local rule's table): a
/// response that used less refunded nothing, one that used more was never charged.
#[test]
fn a_global_rules_local_fallback_settles_its_commits() {
    let e = engine(
        r#"{"bridge":{"cluster":"weir_bridge"},"rules":[{"name":"llm","scope":"global",
            "key":[{"header":"x-user"}],
            "limit":{"algorithm":"token_bucket","capacity":1000,"refill":1000,"period":"1m"},
            "cost":{"header":"x-estimate","max":1000},"commit":{"header":"x-tokens"},
            "global":{"failure_mode":"local","expected_instances":2}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let ask = |estimate: u64, now: u64| {
        let mut eval = evaluate(
            &e,
            &store,
            &user("acme").header("x-estimate", estimate.to_string()),
            now,
        );
        e.complete(
            &mut eval,
            &store,
            Micros(now),
            Micros(now),
            Err(ReplyError::NoResponse),
        );
        eval
    };
    // The local share: 500 tokens. An estimate of 400 is admitted by the fallback…
    let first = ask(400, T0);
    assert_eq!(
        first.reports[0].outcome,
        RuleOutcome::BridgeFailed(FailureOutcome::Local { allowed: true })
    );
    let [commit] = &first.commits[..] else {
        panic!("the fallback reserved the estimate: {:?}", first.commits);
    };
    assert!(!commit.is_global(), "counted in this Envoy's shared data");
    // …and used 10: 390 come back, so 450 more fit.
    assert!(
        e.commit(&store, commit, 10, Micros(T0 + MS)).unwrap(),
        "settled"
    );
    let second = ask(450, T0 + 2 * MS);
    assert!(!second.denied(), "{:?}", second.reports);
    // Used 950: 500 more than reserved are charged; nothing fits now.
    assert!(e
        .commit(&store, &second.commits[0], 950, Micros(T0 + 3 * MS))
        .unwrap());
    assert!(ask(1, T0 + 4 * MS).denied());
}

#[test]
fn what_became_of_leased_units_is_counted() {
    let e = global(r#","global":{"lease":{"max":50,"ttl":"20ms"}}"#);
    let granted = |valid_ms: u64| Granted {
        valid_ns: valid_ms * 1_000_000,
        ..result(true, 10, 90)
    };
    // An answer 1 ms after its call: 9 units beyond the request's own, kept.
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0 + MS),
        reply(vec![granted(20)]),
    );
    let report = &eval.reports[0];
    assert_eq!(
        (
            report.lease_units_granted,
            report.lease_units_late,
            report.lease_units_expired
        ),
        (9, 0, 0)
    );
    // Two are spent; the other seven are dropped by the first write after they expired
    // (20 ms from the call), and counted once.
    for at in [T0 + 2 * MS, T0 + 3 * MS] {
        let eval = eval_at(&e, &store, at);
        assert_eq!(eval.reports[0].source, Some(Source::Lease));
        assert_eq!(eval.reports[0].lease_units_expired, 0);
    }
    let mut after = eval_at(&e, &store, T0 + 21 * MS);
    assert_eq!(after.pending.len(), 1, "nothing left: it asks");
    let at = Micros(T0 + 21 * MS);
    e.complete(&mut after, &store, at, at, reply(vec![result(true, 1, 50)]));
    assert_eq!(after.reports[0].lease_units_expired, 7);
    let mut again = eval_at(&e, &store, T0 + 22 * MS);
    let at = Micros(T0 + 22 * MS);
    e.complete(&mut again, &store, at, at, reply(vec![result(true, 1, 50)]));
    assert_eq!(again.reports[0].lease_units_expired, 0, "counted once");

    // An answer slower than the units were valid: granted, and all of them late.
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut eval = eval_at(&e, &store, T0);
    e.complete(
        &mut eval,
        &store,
        Micros(T0),
        Micros(T0 + 25 * MS),
        reply(vec![granted(20)]),
    );
    let report = &eval.reports[0];
    assert!(!eval.denied(), "the request's own unit is Redis's decision");
    assert_eq!(
        (report.lease_units_granted, report.lease_units_late),
        (9, 9)
    );
}
