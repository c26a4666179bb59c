//! Requests held instead of denied (`on_limit.delay`), per worker.
//!
//! A local GCRA or token-bucket rule with a delay holds a request it would deny when the
//! request fits within the delay's `max`: the request's place in the key's schedule is
//! taken at once ([`crate::algorithms::Limit::hold`]), so waiting guarantees its
//! admission, and the worker releases it when it is due. [`Waiting`] is the worker's
//! list of held requests, ordered by the instant each is due, with at most `queue`
//! requests per rule: its memory is bounded by the configuration.
//!
//! The filter wakes every [`RELEASE_TICK_MS`] while a request waits and releases what
//! is due. A release comes at most [`RELEASE_SLACK_US`] after the request's due time on
//! a machine that keeps up; the key's state counts the request as if released that late
//! (see [`crate::algorithms::SlotAlgorithm::delay_window`]), so a release anywhere in
//! that span keeps the algorithm's bound. A release later still has lost its slot: the
//! request is decided again, as a new one would be, with what is left of its `max`.
//!
//! A shared rule (`share`, a fixed window split among keys) has no schedule to place a
//! request in: it holds a request it would deny until its window ends, then decides
//! it again. Such requests wait their key's [`Turn`]: the ones due together leave in
//! weighted fair order, each key's units interleaved by its weight, not in the order
//! they came, so the free units of a new window go round the keys that waited.

use crate::key::KeyHash;
use crate::rules::{Rule, RuleId};
use std::collections::{BTreeSet, HashMap, VecDeque};

/// How often (ms) a worker with held requests looks for the ones due.
pub const RELEASE_TICK_MS: u32 = 1;

/// How late a release may come after its request's due time and still use the slot it
/// was given: two release ticks.
pub const RELEASE_SLACK_US: u64 = 2_000;

/// The place in line of a request a shared rule holds: its key and what it asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Turn {
    /// The parent's key.
    pub parent: KeyHash,
    /// The key within the parent (`None`: the request named none; such requests take
    /// turns as one key).
    pub key: Option<u64>,
    pub weight: u64,
    pub cost: u64,
}

/// The requests of one key of a shared rule a worker holds: the rule, the parent and the
/// key within it.
type Flow = (RuleId, KeyHash, Option<u64>);

impl Turn {
    fn flow(&self, rule: RuleId) -> Flow {
        (rule, self.parent, self.key)
    }
}

/// One worker's held requests.
#[derive(Debug, Default)]
pub struct Waiting {
    /// Per rule, at its id's index: most requests held at once (0: the rule never holds).
    capacity: Vec<u32>,
    /// Per rule: requests held now.
    held: Vec<u32>,
    /// `(due_us, context)` of every held request.
    by_due: BTreeSet<(u64, u32)>,
    /// Every held request's due time, rule and turn, by its context.
    by_context: HashMap<u32, (u64, RuleId, Option<Turn>)>,
    /// The requests waiting a turn, per key, in the order they were held (released
    /// from the front, pushed out from the back: a request leaves in O(1) but when its
    /// client leaves mid-line).
    flows: HashMap<Flow, VecDeque<u32>>,
    /// Requests pushed out of a full queue by another key's (see [`Waiting::hold`]):
    /// to be answered as limited.
    pushed_out: Vec<u32>,
}

impl Waiting {
    /// An empty list for `rules`, with each delaying rule's `queue` as its capacity.
    pub fn for_rules(rules: &[Rule]) -> Waiting {
        Waiting {
            capacity: rules
                .iter()
                .map(|rule| rule.delay.map_or(0, |d| d.queue))
                .collect(),
            held: vec![0; rules.len()],
            ..Waiting::default()
        }
    }

    /// Whether `rule` may hold one more request.
    pub fn has_room(&self, rule: RuleId) -> bool {
        let i = rule.index();
        matches!(
            (self.held.get(i), self.capacity.get(i)),
            (Some(held), Some(capacity)) if held < capacity
        )
    }

    /// Whether `rule` may hold one more request of the key `turn` names: when its queue
    /// is full, so long as another key holds more than this one would, by weight (see
    /// [`Waiting::hold`]).
    pub fn has_room_for(&self, rule: RuleId, turn: &Turn) -> bool {
        self.has_room(rule) || self.longest_other(rule, turn).is_some()
    }

    /// The key of `rule` that holds the most requests for its weight, if it holds more
    /// than `turn`'s key would with one more: `held_j / w_j > (held_k + 1) / w_k`.
    fn longest_other(&self, rule: RuleId, turn: &Turn) -> Option<Flow> {
        let own = turn.flow(rule);
        let mine = self.flows.get(&own).map_or(0, VecDeque::len) as u128 + 1;
        let weight_of = |contexts: &VecDeque<u32>| {
            let newest = contexts.back().and_then(|c| self.by_context.get(c));
            u128::from(
                newest
                    .and_then(|(_, _, t)| *t)
                    .map_or(1, |t| t.weight.max(1)),
            )
        };
        let own_weight = u128::from(turn.weight.max(1));
        self.flows
            .iter()
            .filter(|(flow, _)| flow.0 == rule && **flow != own)
            .map(|(flow, contexts)| {
                let newest = contexts.back().copied().unwrap_or(0);
                (*flow, contexts.len() as u128, weight_of(contexts), newest)
            })
            .filter(|&(_, held, weight, _)| held * own_weight > mine * weight)
            // The longest (held_a / w_a > held_b / w_b, compared without dividing); of
            // two as long, the one holding the newer request.
            .max_by(|a, b| (a.1 * b.2).cmp(&(b.1 * a.2)).then(a.3.cmp(&b.3)))
            .map(|(flow, _, _, _)| flow)
    }

    /// Holds the request `context` for `rule` until `due_us`, waiting its `turn` when a
    /// shared rule holds it. False (nothing held) when the rule has no room or the
    /// request is already held. A shared rule's full queue makes room for a key that
    /// holds fewer requests than another, by weight: the newest request of the key
    /// holding the most for its weight is pushed out (see [`Waiting::take_pushed_out`]),
    /// so one key cannot keep the others' requests out of the queue.
    pub fn hold(&mut self, context: u32, rule: RuleId, due_us: u64, turn: Option<Turn>) -> bool {
        if self.by_context.contains_key(&context) {
            return false;
        }
        if !self.has_room(rule) {
            let victim = turn.and_then(|t| self.longest_other(rule, &t));
            let newest = victim.and_then(|flow| self.flows.get(&flow)?.back().copied());
            let Some(newest) = newest else {
                return false;
            };
            self.remove(newest);
            self.pushed_out.push(newest);
        }
        if let Some(held) = self.held.get_mut(rule.index()) {
            *held += 1;
        }
        self.by_due.insert((due_us, context));
        self.by_context.insert(context, (due_us, rule, turn));
        if let Some(turn) = turn {
            self.flows
                .entry(turn.flow(rule))
                .or_default()
                .push_back(context);
        }
        true
    }

    /// The requests pushed out of a full queue since the last call: answer each as
    /// limited.
    pub fn take_pushed_out(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.pushed_out)
    }

    /// Takes the requests due at `now_us` out of the list: earliest first, then the ones
    /// waiting a turn in fair order (see [`in_fair_order`]).
    pub fn take_due(&mut self, now_us: u64) -> Vec<u32> {
        let mut placed = Vec::new();
        let mut turns = Vec::new();
        while let Some(&(at_us, context)) = self.by_due.first() {
            if at_us > now_us {
                break;
            }
            match self.remove(context) {
                Some((rule, Some(turn))) => turns.push((context, rule, turn)),
                _ => placed.push(context),
            }
        }
        placed.extend(in_fair_order(turns));
        placed
    }

    /// Takes every held request out of the list, and those pushed out (the plugin is
    /// going away).
    pub fn take_all(&mut self) -> Vec<u32> {
        let mut all = self.take_pushed_out();
        all.extend(self.take_due(u64::MAX));
        all
    }

    /// Takes the request `context` out of the list; the rule it was held for, if it was.
    pub fn forget(&mut self, context: u32) -> Option<RuleId> {
        self.pushed_out.retain(|c| *c != context);
        self.remove(context).map(|(rule, _)| rule)
    }

    /// Takes the held request `context` out of the list: its rule and turn.
    fn remove(&mut self, context: u32) -> Option<(RuleId, Option<Turn>)> {
        let (due_us, rule, turn) = self.by_context.remove(&context)?;
        self.by_due.remove(&(due_us, context));
        if let Some(flow) = turn.map(|t| t.flow(rule)) {
            if let Some(contexts) = self.flows.get_mut(&flow) {
                if contexts.front() == Some(&context) {
                    contexts.pop_front();
                } else if contexts.back() == Some(&context) {
                    contexts.pop_back();
                } else {
                    contexts.retain(|c| *c != context);
                }
                if contexts.is_empty() {
                    self.flows.remove(&flow);
                }
            }
        }
        if let Some(held) = self.held.get_mut(rule.index()) {
            *held = held.saturating_sub(1);
        }
        Some((rule, turn))
    }

    /// Requests held now.
    pub fn len(&self) -> usize {
        self.by_context.len()
    }

    /// No request is held, and none pushed out waits for its answer.
    pub fn is_empty(&self) -> bool {
        self.by_context.is_empty() && self.pushed_out.is_empty()
    }
}

/// Fixed-point scale of a turn's finish tag: a unit of a key of weight `w` advances its
/// tag by `TAG_SCALE / w` (weights are at most 1,000, so the rounding never reorders
/// keys whose exact tags differ by a unit of any weight).
const TAG_SCALE: u128 = 1 << 40;

/// Requests that waited a turn (context, rule, turn, in the order they were held), in
/// weighted fair order: each request's finish tag is its key's units so far, itself
/// included, over the key's weight (per rule and key); the least tag leaves first,
/// ties by context (the order Envoy made the requests in). A key of weight 2 then has two units out for every one of
/// a key of weight 1, and a key holding one request goes before another's tenth.
pub fn in_fair_order(turns: Vec<(u32, RuleId, Turn)>) -> Vec<u32> {
    let mut so_far: HashMap<(RuleId, KeyHash, Option<u64>), u128> = HashMap::new();
    let mut tagged: Vec<(u128, usize, u32)> = turns
        .into_iter()
        .enumerate()
        .map(|(order, (context, rule, turn))| {
            let tag = so_far.entry((rule, turn.parent, turn.key)).or_insert(0);
            let step = u128::from(turn.cost.max(1)) * TAG_SCALE / u128::from(turn.weight.max(1));
            *tag = tag.saturating_add(step);
            (*tag, order, context)
        })
        .collect();
    tagged.sort_unstable();
    tagged.into_iter().map(|(_, _, context)| context).collect()
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;
    use crate::config;

    fn waiting(queue: u32) -> (Waiting, RuleId, RuleId) {
        let json = format!(
            r#"{{"rules": [
                {{"name": "held", "limit": {{"algorithm": "gcra", "rate": 10, "period": "1s", "burst": 1}},
                  "on_limit": {{"delay": {{"max": "1s", "queue": {queue}}}}}}},
                {{"name": "plain", "limit": {{"algorithm": "gcra", "rate": 10, "period": "1s", "burst": 1}}}}
            ]}}"#
        );
        let config = config::parse(json.as_bytes()).expect("valid config");
        let (a, b) = (config.rules[0].id, config.rules[1].id);
        (Waiting::for_rules(&config.rules), a, b)
    }

    #[test]
    fn requests_leave_in_the_order_they_are_due_and_only_when_due() {
        let (mut w, rule, _) = waiting(10);
        assert!(w.hold(7, rule, 300, None));
        assert!(w.hold(5, rule, 100, None));
        assert!(w.hold(6, rule, 200, None));
        assert_eq!(w.take_due(99), Vec::<u32>::new());
        assert_eq!(w.take_due(200), vec![5, 6]);
        assert_eq!(w.len(), 1);
        assert_eq!(w.take_all(), vec![7]);
        assert!(w.is_empty());
    }

    #[test]
    fn a_rule_holds_at_most_its_queue_and_a_forgotten_request_frees_its_place() {
        let (mut w, rule, plain) = waiting(2);
        assert!(w.hold(1, rule, 10, None));
        assert!(w.hold(2, rule, 10, None));
        assert!(!w.has_room(rule));
        assert!(!w.hold(3, rule, 10, None), "the queue is full");
        assert!(
            !w.hold(4, plain, 10, None),
            "a rule without a delay holds nothing"
        );
        assert_eq!(w.forget(1), Some(rule));
        assert_eq!(w.forget(1), None, "forgotten once");
        assert!(w.hold(3, rule, 10, None));
        assert!(!w.hold(3, rule, 20, None), "a request is held once");
        assert_eq!(w.take_due(10), vec![2, 3]);
        assert!(w.has_room(rule));
    }

    fn turn(key: u64, weight: u64, cost: u64) -> Option<Turn> {
        let parent = KeyHash {
            set_hash: 1,
            fingerprint: 2,
        };
        Some(Turn {
            parent,
            key: Some(key),
            weight,
            cost,
        })
    }

    #[test]
    fn requests_waiting_a_turn_leave_in_weighted_fair_order_not_the_order_they_came() {
        let (mut w, rule, _) = waiting(20);
        // Key 1 holds four requests before key 2 holds two and key 3 (weight 2) four.
        for context in 1..=4 {
            assert!(w.hold(context, rule, 100, turn(1, 1, 1)));
        }
        assert!(w.hold(5, rule, 100, turn(2, 1, 1)));
        assert!(w.hold(6, rule, 100, turn(2, 1, 1)));
        for context in 7..=10 {
            assert!(w.hold(context, rule, 100, turn(3, 2, 1)));
        }
        // A request with a place in a schedule leaves first.
        assert!(w.hold(11, rule, 100, None));
        assert!(w.hold(12, rule, 101, turn(2, 1, 1)), "not due yet");
        // Tags: key 1 at 1, 2, 3, 4; key 2 at 1, 2; key 3 at ½, 1, 1½, 2.
        assert_eq!(w.take_due(100), vec![11, 7, 1, 5, 8, 9, 2, 6, 10, 3, 4]);
        assert_eq!(w.take_due(101), vec![12]);
    }

    #[test]
    fn a_costly_request_waits_its_cost_in_turns() {
        let (mut w, rule, _) = waiting(20);
        assert!(w.hold(1, rule, 100, turn(1, 1, 3)));
        assert!(w.hold(2, rule, 100, turn(2, 1, 1)));
        assert!(w.hold(3, rule, 100, turn(2, 1, 1)));
        assert!(w.hold(4, rule, 100, turn(2, 1, 1)));
        assert!(w.hold(5, rule, 100, turn(2, 1, 1)));
        // Key 1's one request of 3 units ties with key 2's third unit: held first, it
        // goes first.
        assert_eq!(w.take_due(100), vec![2, 3, 1, 4, 5]);
    }

    #[test]
    fn a_full_queue_pushes_out_the_newest_request_of_the_key_holding_the_most() {
        let (mut w, rule, _) = waiting(4);
        for context in 1..=3 {
            assert!(w.hold(context, rule, 100, turn(1, 1, 1)));
        }
        assert!(w.hold(4, rule, 100, turn(2, 1, 1)));
        // Full: key 2 would hold 2, key 1 holds 3: key 1's newest makes room.
        assert!(w.has_room_for(rule, &turn(2, 1, 1).unwrap()));
        assert!(w.hold(5, rule, 100, turn(2, 1, 1)));
        assert_eq!(w.take_pushed_out(), vec![3]);
        // Now 2 and 2: nobody holds more than key 2 would with a third.
        assert!(!w.has_room_for(rule, &turn(2, 1, 1).unwrap()));
        assert!(!w.hold(6, rule, 100, turn(2, 1, 1)));
        // A key of weight 3 holding none takes a place from a key holding 2 of weight 1.
        assert!(w.hold(7, rule, 100, turn(3, 3, 1)));
        assert_eq!(w.take_pushed_out().len(), 1);
        // A request with a place in a schedule never pushes one out.
        assert!(!w.hold(8, rule, 100, None));
        assert_eq!(w.len(), 4);
    }

    #[test]
    fn a_request_that_leaves_mid_line_leaves_its_keys_line_in_order() {
        let (mut w, rule, _) = waiting(10);
        for context in 1..=4 {
            assert!(w.hold(context, rule, 100, turn(1, 1, 1)));
        }
        assert_eq!(w.forget(2), Some(rule), "its client left");
        assert_eq!(w.forget(4), Some(rule));
        assert!(w.hold(5, rule, 100, turn(2, 1, 1)));
        assert_eq!(w.take_due(100), vec![1, 5, 3]);
        assert!(w.is_empty());
        // The key's line is gone with its last request: a new one starts afresh.
        assert!(w.hold(6, rule, 100, turn(1, 1, 1)));
        assert_eq!(w.take_due(100), vec![6]);
    }
}
