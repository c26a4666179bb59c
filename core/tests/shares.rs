//! A limit its keys share fairly (`share`, issue 36): the parent's bound holds, every
//! active key that asks for its share gets it, and what one key leaves is free for the
//! others — judged by the checker's parent bound (`conformance::check`) and floor
//! (`share::check_floor`), in one Envoy whose workers race on one shared-data value.

use crate::support;

use support::{engine, evaluate, FakeRequest, T0};
use weir_core::algorithms::{fixed_window::FixedWindow, GlobalLimit, Limit};
use weir_core::conformance::{check, Admission};
use weir_core::engine::Engine;
use weir_core::share::{check_floor, ShareLimit, ShareRequest};
use weir_core::store::memory::MemoryStore;
use weir_core::time::Micros;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const SECOND: u64 = 1_000_000;

/// An organisation's 100 a second, shared by its users (a header an earlier filter
/// writes from the verified token), weighted by another.
const PER_ORG: &str = r#"{"trusted_headers":["x-user","x-weight"],"rules":[{"name":"per-org",
    "key":[{"header":"x-org"}],
    "limit":{"algorithm":"fixed_window","limit":100,"window":"1s"},
    "share":{"by":[{"header":"x-user"}],"max_keys":64,
             "weight":{"header":"x-weight","default":1,"max":10}}}]}"#;

fn user(name: &str) -> FakeRequest {
    FakeRequest::default()
        .header("x-org", "acme")
        .header("x-user", name)
}

/// One request as the checker reads it, with its key named by the test.
struct Run {
    requests: Vec<ShareRequest>,
}

impl Run {
    fn ask(
        &mut self,
        e: &Engine,
        store: &MemoryStore,
        key: u64,
        req: &FakeRequest,
        at: u64,
    ) -> bool {
        let admitted = !evaluate(e, store, req, at).denied();
        self.requests.push(ShareRequest {
            at_us: at,
            key: Some(key),
            weight: 1,
            cost: 1,
            admitted,
        });
        admitted
    }

    fn admitted_in(&self, key: u64, window: u64) -> u64 {
        let start = T0 + window * SECOND;
        self.requests
            .iter()
            .filter(|r| r.key == Some(key) && r.admitted)
            .filter(|r| (start..start + SECOND).contains(&r.at_us))
            .count() as u64
    }

    fn judge(&self, max_keys: u32) {
        let parent = GlobalLimit::Slot(Limit::FixedWindow(FixedWindow::new(100, SECOND).unwrap()));
        let admissions: Vec<Admission> = self
            .requests
            .iter()
            .filter(|r| r.admitted)
            .map(|r| Admission {
                at_us: r.at_us,
                cost: r.cost,
            })
            .collect();
        check(&parent, &admissions).unwrap();
        let limit = ShareLimit {
            limit: 100,
            window_us: SECOND,
            max_keys,
        };
        check_floor(&limit, &self.requests).unwrap();
    }
}

/// One key offering 1,000 a second and nine offering 5 each, spread over each second
/// (the heavy key first in each step); from `switch_at` on, key 1 stops and key 2 turns
/// heavy.
fn heavy_and_light(seconds: u64, switch_at: u64) -> (Run, MemoryStore) {
    let e = engine(PER_ORG);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut run = Run {
        requests: Vec::new(),
    };
    for second in 0..seconds {
        let heavy = if second < switch_at { 1 } else { 2 };
        for step in 0..1000u64 {
            let at = T0 + second * SECOND + step * 1000;
            run.ask(&e, &store, heavy, &user(&format!("u{heavy}")), at);
            // Each light key asks 5 times a second, at steps 100, 300, …, 900.
            if step % 200 == 100 {
                for key in 2..=10u64 {
                    if key != heavy {
                        run.ask(&e, &store, key, &user(&format!("u{key}")), at + key);
                    }
                }
            }
        }
    }
    (run, store)
}

#[test]
fn nine_light_keys_get_all_they_ask_and_the_heavy_one_the_rest() {
    let (run, _) = heavy_and_light(4, 4);
    run.judge(64);
    // The first second nobody is active yet: the heavy key, asking first, takes it all.
    assert_eq!(run.admitted_in(1, 0), 100);
    for second in 1..4 {
        assert_eq!(run.admitted_in(1, second), 55, "second {second}");
        for key in 2..=10 {
            assert_eq!(
                run.admitted_in(key, second),
                5,
                "key {key}, second {second}"
            );
        }
    }
}

#[test]
fn when_the_heavy_key_stops_another_rises_to_the_rest_within_one_window() {
    let (run, _) = heavy_and_light(5, 2);
    run.judge(64);
    // Second 2: key 1's entitlement (55) is still held for it; key 2 has its 5.
    assert_eq!(run.admitted_in(2, 2), 5);
    // Second 3: key 1 was idle, key 2 asked 1,000: the eight light keys' 40 and key 2
    // the remaining 60.
    assert_eq!(run.admitted_in(2, 3), 60);
    assert_eq!(run.admitted_in(2, 4), 60);
    assert_eq!(run.admitted_in(1, 3), 0);
}

#[test]
fn weights_split_the_limit_and_the_headers_give_the_keys_share() {
    let e = engine(PER_ORG);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let heavy = |name: &str, weight: &str| user(name).header("x-weight", weight);
    let mut admitted = [0u64; 3];
    for second in 0..3u64 {
        admitted = [0; 3];
        for step in 0..300u64 {
            let at = T0 + second * SECOND + step;
            for (i, (name, weight)) in [("a", "2"), ("b", "1"), ("c", "lots")].iter().enumerate() {
                admitted[i] += u64::from(!evaluate(&e, &store, &heavy(name, weight), at).denied());
            }
        }
    }
    // 2 : 1 : 1 ("lots" is not a number: the default weight, 1).
    assert_eq!(admitted, [50, 25, 25]);
    let eval = evaluate(&e, &store, &heavy("c", "lots"), T0 + 3 * SECOND);
    assert!(eval.reports[0].limit_invalid);
    let verdicts = e.rule_verdicts(&eval);
    assert_eq!(
        verdicts[0].policy.quota, 25,
        "the key's share, not the parent's 100"
    );
    assert_eq!(verdicts[0].decision.limit, 25);
}

#[test]
fn keys_past_max_keys_and_requests_naming_none_get_only_what_is_free() {
    let e = engine(&PER_ORG.replace(r#""max_keys":64"#, r#""max_keys":2"#));
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let anonymous = FakeRequest::default().header("x-org", "acme");
    let mut run = Run {
        requests: Vec::new(),
    };
    for second in 0..3u64 {
        for step in 0..200u64 {
            let at = T0 + second * SECOND + step;
            run.ask(&e, &store, 1, &user("a"), at);
            run.ask(&e, &store, 2, &user("b"), at);
            // A third user (past max_keys) and a request without a user: asking first
            // every step, they still get nothing of what a and b are entitled to.
            let _ = run.ask(&e, &store, 3, &user("c"), at);
            let _ = evaluate(&e, &store, &anonymous, at);
        }
    }
    run.judge(2);
    assert_eq!(run.admitted_in(1, 2), 50);
    assert_eq!(run.admitted_in(2, 2), 50);
    assert_eq!(run.admitted_in(3, 2), 0);
}

/// A team's token budget shared by its members (`commit`): a request is counted at its
/// estimate, and what its response did not use comes back to its member's entitlement
/// first, then to everyone, in the window it was counted in.
#[test]
fn a_shared_token_budget_gives_back_what_a_response_did_not_use() {
    let e = engine(
        r#"{"trusted_headers":["x-user"],"rules":[{"name":"team","key":[{"header":"x-team"}],
        "cost":{"header":"x-estimate","max":1000},"commit":{"header":"x-used"},
        "limit":{"algorithm":"fixed_window","limit":1000,"window":"1h"},
        "share":{"by":[{"header":"x-user"}]}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let member = |name: &str, estimate: u64| {
        FakeRequest::default()
            .header("x-team", "ml")
            .header("x-user", name)
            .header("x-estimate", estimate.to_string())
    };
    let hour = 3_600 * SECOND;
    let t = T0 - T0 % hour + hour;
    let a = evaluate(&e, &store, &member("a", 600), t);
    assert!(!a.denied());
    assert!(
        evaluate(&e, &store, &member("b", 600), t + 1).denied(),
        "400 left"
    );
    // a's answer used 100 tokens: 500 come back, and b's 600 fit.
    assert!(e.commit(&store, &a.commits[0], 100, Micros(t + 2)).unwrap());
    let b = evaluate(&e, &store, &member("b", 600), t + 3);
    assert!(!b.denied());
    assert!(e.commit(&store, &b.commits[0], 600, Micros(t + 4)).is_ok());
    // The next hour: a asked 600 and b 1,200 (in estimates), so each is entitled to 500.
    let next = t + hour;
    let a = evaluate(&e, &store, &member("a", 500), next);
    assert!(!a.denied());
    assert!(evaluate(&e, &store, &member("b", 501), next + 1).denied());
    let b = evaluate(&e, &store, &member("b", 500), next + 2);
    assert!(!b.denied());
    // A commit settled after its window ended changes nothing.
    assert!(!e
        .commit(&store, &a.commits[0], 1, Micros(next + hour))
        .unwrap());
    // a's 500 settled at 200 in its window: 300 free again, for a first.
    assert!(e
        .commit(&store, &a.commits[0], 200, Micros(next + 3))
        .unwrap());
    assert!(evaluate(&e, &store, &member("b", 301), next + 4).denied());
    assert!(!evaluate(&e, &store, &member("a", 300), next + 5).denied());
}

/// A global shared limit: every request of a key asks Redis, even one a denial would have
/// answered (its asks are its demand, which entitles it in the next window), and the
/// answer's numbers are the key's share.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn a_global_shared_limit_asks_redis_for_every_request_and_answers_with_the_share() {
    use weir_testkit::simulation::{Arrival, Simulation};
    let config = PER_ORG
        .replacen(
            r#""name":"per-org","#,
            r#""name":"per-org","scope":"global","#,
            1,
        )
        .replacen("{", r#"{"bridge":{"cluster":"weir_bridge"},"#, 1);
    let mut sim = Simulation::new(&config, 2, 50).unwrap();
    // Two users, 200 requests each per second, for three seconds, over two Envoys.
    let arrivals: Vec<Arrival<FakeRequest>> = (0..1200u64)
        .map(|i| Arrival {
            at_us: T0 + i * 2_500 + 1,
            envoy: (i % 2) as usize,
            request: user(if i % 3 == 0 { "a" } else { "b" }).header("x-weight", "1"),
        })
        .collect();
    let decided = sim.play(&arrivals);
    assert_eq!(sim.bridge.items, 1200, "every request asked Redis");
    let mut admitted = [[0u64; 2]; 3];
    for d in &decided {
        let second = ((d.arrived_us - T0) / SECOND) as usize;
        let who = usize::from(d.index % 3 != 0);
        admitted[second][who] += u64::from(!d.eval.denied());
    }
    // a asks 133 a second and b 267: from the second second on, each is entitled to
    // half (50), and the first second went to whoever asked first.
    assert_eq!(admitted[0].iter().sum::<u64>(), 100);
    assert_eq!(admitted[1], [50, 50]);
    assert_eq!(admitted[2], [50, 50]);
    let last = &decided.last().unwrap().eval;
    let engine = &sim.envoys[0].engine;
    assert_eq!(
        engine.rule_verdicts(last)[0].policy.quota,
        50,
        "the key's share"
    );
}
