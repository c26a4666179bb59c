//! What one worker (one Wasm VM serving requests) keeps for a plugin beside shared
//! data: its reservoirs of local rules, its held requests, and the latencies and
//! limits of its adaptive concurrency rules, and the places it holds of concurrency
//! rules.

use crate::adaptive::{KeyedLatencies, WorkerLatency};
use crate::concurrency::Places;
use crate::delay::Waiting;
use crate::reservoir::Reservoirs;
use crate::rules::{Rule, RuleId};

#[derive(Debug)]
pub struct Worker {
    pub reservoirs: Reservoirs,
    pub waiting: Waiting,
    /// One per rule, at its id's index: `Some` for adaptive concurrency rules with one
    /// controller.
    pub latencies: Vec<Option<WorkerLatency>>,
    /// One per rule, at its id's index: `Some` for adaptive concurrency rules with a
    /// controller per key (`per_key`).
    pub keyed: Vec<Option<KeyedLatencies>>,
    /// The places this worker holds of concurrency rules' keys, re-counted every epoch
    /// and given back when their streams end (see [`crate::concurrency`]).
    pub places: Places,
}

impl Worker {
    /// Empty reservoirs and no held request, for `rules`.
    pub fn for_rules(rules: &[Rule]) -> Worker {
        Worker {
            reservoirs: Reservoirs::for_rules(rules),
            waiting: Waiting::for_rules(rules),
            latencies: rules
                .iter()
                .map(|rule| {
                    rule.adaptive()
                        .filter(|a| a.key_controllers.is_none())
                        .map(WorkerLatency::new)
                })
                .collect(),
            keyed: rules
                .iter()
                .map(|rule| {
                    rule.adaptive()
                        .and_then(|a| a.key_controllers)
                        .map(KeyedLatencies::new)
                })
                .collect(),
            places: Places::default(),
        }
    }

    /// The keys of an adaptive concurrency rule with `per_key`.
    pub fn keyed(&mut self, rule: RuleId) -> Option<&mut KeyedLatencies> {
        self.keyed.get_mut(rule.index()).and_then(Option::as_mut)
    }

    /// The latencies and limit of an adaptive concurrency rule.
    pub fn latency(&mut self, rule: RuleId) -> Option<&mut WorkerLatency> {
        self.latencies
            .get_mut(rule.index())
            .and_then(Option::as_mut)
    }
}
