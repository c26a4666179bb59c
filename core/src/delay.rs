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

use crate::rules::{Rule, RuleId};
use std::collections::{BTreeSet, HashMap};

/// How often (ms) a worker with held requests looks for the ones due.
pub const RELEASE_TICK_MS: u32 = 1;

/// How late a release may come after its request's due time and still use the slot it
/// was given: two release ticks.
pub const RELEASE_SLACK_US: u64 = 2_000;

/// One worker's held requests.
#[derive(Debug, Default)]
pub struct Waiting {
    /// Per rule, at its id's index: most requests held at once (0: the rule never holds).
    capacity: Vec<u32>,
    /// Per rule: requests held now.
    held: Vec<u32>,
    /// `(due_us, context)` of every held request.
    by_due: BTreeSet<(u64, u32)>,
    /// Every held request's due time and rule, by its context.
    by_context: HashMap<u32, (u64, RuleId)>,
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

    /// Holds the request `context` for `rule` until `due_us`. False (nothing held) when
    /// the rule has no room or the request is already held.
    pub fn hold(&mut self, context: u32, rule: RuleId, due_us: u64) -> bool {
        if !self.has_room(rule) || self.by_context.contains_key(&context) {
            return false;
        }
        if let Some(held) = self.held.get_mut(rule.index()) {
            *held += 1;
        }
        self.by_due.insert((due_us, context));
        self.by_context.insert(context, (due_us, rule));
        true
    }

    /// Takes the requests due at `now_us` out of the list, earliest first.
    pub fn take_due(&mut self, now_us: u64) -> Vec<u32> {
        let mut due = Vec::new();
        while let Some(&(at_us, context)) = self.by_due.first() {
            if at_us > now_us {
                break;
            }
            self.forget(context);
            due.push(context);
        }
        due
    }

    /// Takes every held request out of the list (the plugin is going away).
    pub fn take_all(&mut self) -> Vec<u32> {
        self.take_due(u64::MAX)
    }

    /// Takes the request `context` out of the list; the rule it was held for, if it was.
    pub fn forget(&mut self, context: u32) -> Option<RuleId> {
        let (due_us, rule) = self.by_context.remove(&context)?;
        self.by_due.remove(&(due_us, context));
        if let Some(held) = self.held.get_mut(rule.index()) {
            *held = held.saturating_sub(1);
        }
        Some(rule)
    }

    /// Requests held now.
    pub fn len(&self) -> usize {
        self.by_context.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_context.is_empty()
    }
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
        assert!(w.hold(7, rule, 300));
        assert!(w.hold(5, rule, 100));
        assert!(w.hold(6, rule, 200));
        assert_eq!(w.take_due(99), Vec::<u32>::new());
        assert_eq!(w.take_due(200), vec![5, 6]);
        assert_eq!(w.len(), 1);
        assert_eq!(w.take_all(), vec![7]);
        assert!(w.is_empty());
    }

    #[test]
    fn a_rule_holds_at_most_its_queue_and_a_forgotten_request_frees_its_place() {
        let (mut w, rule, plain) = waiting(2);
        assert!(w.hold(1, rule, 10));
        assert!(w.hold(2, rule, 10));
        assert!(!w.has_room(rule));
        assert!(!w.hold(3, rule, 10), "the queue is full");
        assert!(
            !w.hold(4, plain, 10),
            "a rule without a delay holds nothing"
        );
        assert_eq!(w.forget(1), Some(rule));
        assert_eq!(w.forget(1), None, "forgotten once");
        assert!(w.hold(3, rule, 10));
        assert!(!w.hold(3, rule, 20), "a request is held once");
        assert_eq!(w.take_due(10), vec![2, 3]);
        assert!(w.has_room(rule));
    }
}
