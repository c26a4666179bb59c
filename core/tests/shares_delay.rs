//! A shared limit that holds what it would deny (`share` with `on_limit.delay`, issue
//! 36): a held request waits for the next window, where the ones a worker held leave in
//! weighted fair order (each key's units interleaved by its weight), not first come
//! first served, and are decided again — so the parent's bound and every key's floor
//! hold as without a delay, judged by the checker, and nobody waits past the delay's
//! `max`.

use crate::support;

use std::collections::HashMap;

use support::{engine, evaluate_on, FakeRequest, SEED, T0};
use weir_core::algorithms::{fixed_window::FixedWindow, GlobalLimit, Limit};
use weir_core::conformance::{check, Admission};
use weir_core::engine::{Engine, Evaluation};
use weir_core::share::{check_floor, ShareLimit, ShareRequest};
use weir_core::store::memory::MemoryStore;
use weir_core::time::Micros;
use weir_core::worker::Worker;

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const SECOND: u64 = 1_000_000;

/// An organisation's `limit` a second shared by its users (a header an earlier filter
/// writes), holding what it would deny for up to `max`.
fn shared_with_delay(limit: u64, max_keys: u32, delay: &str) -> Engine {
    engine(&format!(
        r#"{{"trusted_headers":["x-user"],"rules":[{{"name":"per-org",
        "key":[{{"header":"x-org"}}],
        "limit":{{"algorithm":"fixed_window","limit":{limit},"window":"1s"}},
        "share":{{"by":[{{"header":"x-user"}}],"max_keys":{max_keys}}},
        "on_limit":{{"delay":{delay}}}}}]}}"#
    ))
}

fn user(name: &str) -> FakeRequest {
    FakeRequest::default()
        .header("x-org", "acme")
        .header("x-user", name)
}

/// What became of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Admitted at this instant (on arrival, or released).
    Admitted(u64),
    /// Denied at this instant.
    Denied(u64),
}

/// One worker of one Envoy: requests arrive, the held ones wait in the worker's list,
/// and its tick releases what is due in the order the list gives.
struct Line {
    e: Engine,
    store: MemoryStore,
    worker: Worker,
    /// Held requests by context: their evaluation, user and arrival.
    held: HashMap<u32, (Evaluation, String, u64)>,
    next_context: u32,
    /// Every request's user, arrival and outcome, in arrival order.
    requests: Vec<(String, u64, Option<Outcome>)>,
    /// The requests as the floor's checker reads them: every decision, in order (a hold
    /// is an ask its window did not admit; its release asks again).
    asks: Vec<ShareRequest>,
    held_count: u64,
    pushed_out: u64,
}

impl Line {
    fn new(e: Engine) -> Line {
        let store = MemoryStore::new();
        e.prepare(&store).unwrap();
        let worker = e.worker();
        Line {
            e,
            store,
            worker,
            held: HashMap::new(),
            next_context: 1,
            requests: Vec::new(),
            asks: Vec::new(),
            held_count: 0,
            pushed_out: 0,
        }
    }

    fn arrive(&mut self, name: &str, at: u64) {
        let context = self.next_context;
        self.next_context += 1;
        self.requests.push((name.to_string(), at, None));
        let eval = evaluate_on(&self.e, &self.store, &mut self.worker, &user(name), at);
        self.settle(context, eval, name.to_string(), at, at);
    }

    /// The worker's tick at `at`: every due request, released in the list's order.
    fn tick(&mut self, at: u64) -> Vec<String> {
        let mut order = Vec::new();
        for context in self.worker.waiting.take_due(at) {
            let (mut eval, name, arrived) = self.held.remove(&context).unwrap();
            order.push(name.clone());
            let mut facts = self.e.facts(user(&name));
            self.e.release(
                &mut eval,
                &self.store,
                &mut self.worker,
                &SEED,
                &mut facts,
                Micros(at),
            );
            let delayed = eval.delayed.unwrap();
            assert!(!delayed.late, "a turn is never late");
            self.settle(context, eval, name, arrived, at);
        }
        order
    }

    fn settle(&mut self, context: u32, eval: Evaluation, name: String, arrived: u64, at: u64) {
        let key = Some(name.trim_start_matches('u').parse::<u64>().unwrap());
        let admitted = !eval.denied() && eval.held.is_none();
        self.asks.push(ShareRequest {
            at_us: at,
            key,
            weight: 1,
            cost: 1,
            admitted,
        });
        if let Some(h) = eval.held {
            assert!(h.turn.is_some(), "a shared rule holds without a place");
            assert!(
                h.hold.due_us.is_multiple_of(SECOND),
                "due when the next window starts"
            );
            assert!(self
                .worker
                .waiting
                .hold(context, h.rule, h.hold.due_us, h.turn));
            self.held_count += 1;
            self.held.insert(context, (eval, name, arrived));
            // A request another key's pushed out of the full queue is denied now.
            for out in self.worker.waiting.take_pushed_out() {
                let (mut eval, _, _) = self.held.remove(&out).unwrap();
                eval.push_out(Micros(at));
                assert!(eval.denied());
                self.pushed_out += 1;
                self.requests[(out - 1) as usize].2 = Some(Outcome::Denied(at));
            }
            return;
        }
        let outcome = match admitted {
            true => Outcome::Admitted(at),
            false => Outcome::Denied(at),
        };
        let index = (context - 1) as usize;
        self.requests[index].2 = Some(outcome);
    }

    fn admitted_in(&self, name: &str, window: u64) -> u64 {
        let start = T0 + window * SECOND;
        self.requests
            .iter()
            .filter(|(n, _, _)| n == name)
            .filter(|(_, _, o)| matches!(o, Some(Outcome::Admitted(at)) if (start..start + SECOND).contains(at)))
            .count() as u64
    }

    /// The parent's bound and every key's floor, judged from what happened.
    fn judge(&self, limit: u64, max_keys: u32) {
        let parent =
            GlobalLimit::Slot(Limit::FixedWindow(FixedWindow::new(limit, SECOND).unwrap()));
        let mut admissions: Vec<Admission> = self
            .requests
            .iter()
            .filter_map(|(_, _, o)| match o {
                Some(Outcome::Admitted(at)) => Some(Admission {
                    at_us: *at,
                    cost: 1,
                }),
                _ => None,
            })
            .collect();
        admissions.sort_by_key(|a| a.at_us);
        check(&parent, &admissions).unwrap();
        let limit = ShareLimit {
            limit,
            window_us: SECOND,
            max_keys,
        };
        check_floor(&limit, &self.asks).unwrap();
    }

    /// The longest any admitted request waited.
    fn longest_wait_us(&self) -> u64 {
        self.requests
            .iter()
            .filter_map(|(_, arrived, o)| match o {
                Some(Outcome::Admitted(at)) => Some(at - arrived),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }
}

#[test]
fn a_held_request_waits_for_the_next_window_and_is_admitted_there_within_its_share() {
    let mut line = Line::new(shared_with_delay(100, 64, r#"{"max":"2s","queue":100}"#));
    for i in 0..150 {
        line.arrive("u1", T0 + i * 1000);
    }
    assert_eq!(line.admitted_in("u1", 0), 100);
    assert_eq!(line.held_count, 50, "what the window denied waits");
    // Nothing is due before the window ends.
    assert!(line.tick(T0 + SECOND - 1).is_empty());
    assert_eq!(line.tick(T0 + SECOND).len(), 50);
    assert_eq!(line.admitted_in("u1", 1), 50);
    assert!(line.requests.iter().all(|(_, _, o)| o.is_some()));
    line.judge(100, 64);
}

/// Keys with no entitlement (past `max_keys`) share only what is free: the requests a
/// worker held for them leave in turns, so a key that held two gets one of the three
/// free units where first come, first served would give the key that held five all
/// three.
#[test]
fn held_requests_leave_in_fair_order_not_first_come_first_served() {
    let mut line = Line::new(shared_with_delay(4, 1, r#"{"max":"1500ms","queue":20}"#));
    // u1 takes the one tracked place (and is entitled to its 1 in the next window);
    // u2 then takes the 3 free units and five more wait, then u3's two.
    line.arrive("u1", T0);
    for i in 0..8 {
        line.arrive("u2", T0 + 10 + i);
    }
    for i in 0..2 {
        line.arrive("u3", T0 + 100 + i);
    }
    assert_eq!(line.admitted_in("u2", 0), 3);
    assert_eq!(line.held_count, 7);
    let order = line.tick(T0 + SECOND);
    assert_eq!(order, ["u2", "u3", "u2", "u3", "u2", "u2", "u2"]);
    assert_eq!(line.admitted_in("u2", 1), 2);
    assert_eq!(
        line.admitted_in("u3", 1),
        1,
        "its turn came before u2's third unit"
    );
    // The rest are denied: another window would pass the delay's max.
    let denied = line
        .requests
        .iter()
        .filter(|(_, _, o)| matches!(o, Some(Outcome::Denied(at)) if *at == T0 + SECOND))
        .count();
    assert_eq!(denied, 4);
    assert!(line.worker.waiting.is_empty());
    line.judge(4, 1);
}

/// The nine light keys and the heavy one, the heavy key's excess held (a queue of 100
/// per worker): no light request is denied, since a light key holding fewer requests
/// pushes the heavy key's newest out of the full queue; the light keys' requests held
/// in the first second (when nobody was entitled) are admitted in the next, their
/// backlog of the second after (asked there, so entitled to it) in the third, and from
/// the fifth second the shares are those without a delay (55 and 5 a second) with no
/// light request waiting. Nobody waits past the delay's `max`.
#[test]
fn with_a_delay_the_shares_stay_fair_and_the_heavy_keys_excess_waits() {
    let mut line = Line::new(shared_with_delay(100, 64, r#"{"max":"1s","queue":100}"#));
    for second in 0..8u64 {
        for step in 0..1000u64 {
            let at = T0 + second * SECOND + step * 1000;
            // The worker's tick runs before the requests of its instant.
            line.tick(at);
            line.arrive("u1", at);
            if step % 200 == 100 {
                for key in 2..=10u64 {
                    line.arrive(&format!("u{key}"), at + key);
                }
            }
        }
    }
    line.tick(T0 + 8 * SECOND);
    line.judge(100, 64);
    let light = |second: u64| -> Vec<u64> {
        (2..=10)
            .map(|key| line.admitted_in(&format!("u{key}"), second))
            .collect()
    };
    assert_eq!((line.admitted_in("u1", 1), light(1)), (55, vec![5; 9]));
    assert_eq!((line.admitted_in("u1", 2), light(2)), (10, vec![10; 9]));
    assert_eq!((line.admitted_in("u1", 3), light(3)), (10, vec![5; 9]));
    for second in 4..8 {
        assert_eq!(
            (line.admitted_in("u1", second), light(second)),
            (55, vec![5; 9])
        );
    }
    for (name, arrived, outcome) in &line.requests {
        if name == "u1" {
            continue;
        }
        assert!(
            matches!(outcome, Some(Outcome::Admitted(_))),
            "{name} at {arrived}"
        );
        if *arrived >= T0 + 3 * SECOND {
            assert_eq!(*outcome, Some(Outcome::Admitted(*arrived)), "{name} waited");
        }
    }
    assert!(line.pushed_out > 0);
    let released_at_a_start = line
        .requests
        .iter()
        .filter(|(n, arrived, o)| {
            n == "u1"
                && matches!(o, Some(Outcome::Admitted(at)) if at > arrived && (at - T0).is_multiple_of(SECOND))
        })
        .count();
    assert!(
        released_at_a_start >= 4 * 55,
        "the heavy key's held requests are admitted when a window starts: {released_at_a_start}"
    );
    assert!(line.longest_wait_us() <= SECOND);
}
