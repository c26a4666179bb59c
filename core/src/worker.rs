//! What one worker (one Wasm VM serving requests) keeps for a plugin beside shared
//! data: its reservoirs of local rules and its held requests.

use crate::delay::Waiting;
use crate::reservoir::Reservoirs;
use crate::rules::Rule;

#[derive(Debug)]
pub struct Worker {
    pub reservoirs: Reservoirs,
    pub waiting: Waiting,
}

impl Worker {
    /// Empty reservoirs and no held request, for `rules`.
    pub fn for_rules(rules: &[Rule]) -> Worker {
        Worker {
            reservoirs: Reservoirs::for_rules(rules),
            waiting: Waiting::for_rules(rules),
        }
    }
}
