//! The one list of algorithms: [`AlgorithmKind`] with its spec, and the limit types
//! that hold one of each ([`Limit`], [`GlobalLimit`]). A new algorithm is named here and
//! nowhere else outside its own module (docs/algorithms.md, "Adding an algorithm").

use std::fmt;

use super::{Algorithm, AlgorithmSpec, ParamError, Parameter, Policy, SlotAlgorithm};

/// The one list of algorithms, written once: each algorithm with slot state as
/// `Kind(module::Type)`, then each that runs only in Redis. It declares [`AlgorithmKind`]
/// with [`AlgorithmKind::ALL`] and [`AlgorithmKind::spec`], and [`Limit`] with
/// [`Limit::algorithm`]; a global-only algorithm also needs a variant of [`GlobalLimit`].
macro_rules! algorithms {
    (
        slot: $($slot:ident($slot_module:ident::$slot_type:ident)),+ ;
        global_only: $($global:ident($global_module:ident::$global_type:ident)),+ $(;)?
    ) => {
        /// The algorithms, as named in the config and on the wire.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum AlgorithmKind {
            $($slot,)+
            $($global,)+
        }

        impl AlgorithmKind {
            pub const ALL: [AlgorithmKind; [$(stringify!($slot),)+ $(stringify!($global),)+].len()] = [
                $(AlgorithmKind::$slot,)+
                $(AlgorithmKind::$global,)+
            ];

            pub fn spec(self) -> &'static AlgorithmSpec {
                match self {
                    $(AlgorithmKind::$slot => &super::$slot_module::SPEC,)+
                    $(AlgorithmKind::$global => &super::$global_module::SPEC,)+
                }
            }
        }

        /// A compiled limit whose state fits a slot: local rules and fallbacks, and most
        /// global rules. The sliding-window log keeps one entry per admitted event, so it
        /// has no fixed-size state and runs only in Redis: it is a [`GlobalLimit`], never a
        /// `Limit`.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Limit {
            $($slot(super::$slot_module::$slot_type),)+
        }

        impl Limit {
            /// The algorithm behind the limit: every other method goes through it.
            pub fn algorithm(&self) -> &dyn SlotAlgorithm {
                match self {
                    $(Limit::$slot(a) => a,)+
                }
            }
        }
    };
}

/// Calls the macro `$then` with the one list of algorithms, in [`algorithms!`]'s form:
/// `slot: Kind(module::Type), …; global_only: Kind(module::Type), …;`. The list is written
/// here once; the kind and limit types below are declared from it, and a crate that keeps
/// something per algorithm (the test kit's oracles) dispatches over it with a macro of its
/// own, so a new algorithm joins there without a line of its own.
#[macro_export]
macro_rules! with_every_algorithm {
    ($then:ident) => {
        $then! {
            slot:
                TokenBucket(token_bucket::TokenBucket),
                Gcra(gcra::Gcra),
                FixedWindow(fixed_window::FixedWindow),
                SlidingWindow(sliding_window::SlidingWindow);
            global_only:
                SlidingLog(sliding_log::SlidingLog);
        }
    };
}

with_every_algorithm!(algorithms);

impl AlgorithmKind {
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// The names of the algorithms whose spec answers `yes`, sorted: what a message
    /// offers instead when an algorithm cannot do something.
    pub fn names_where(yes: impl Fn(&AlgorithmSpec) -> bool) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = Self::ALL
            .into_iter()
            .map(AlgorithmKind::spec)
            .filter(|spec| yes(spec))
            .map(|spec| spec.name)
            .collect();
        names.sort_unstable();
        names
    }

    /// Every parameter name any algorithm takes, once each, in the order of
    /// [`AlgorithmKind::ALL`] and then of each table: what a parser of limits may meet.
    pub fn all_parameters() -> Vec<&'static Parameter> {
        let mut all: Vec<&'static Parameter> = Vec::new();
        for kind in Self::ALL {
            for p in kind.spec().parameters {
                if !all.iter().any(|seen| seen.name == p.name) {
                    all.push(p);
                }
            }
        }
        all
    }
}

impl fmt::Display for AlgorithmKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Limit {
    pub fn kind(&self) -> AlgorithmKind {
        self.algorithm().spec().kind
    }
}

/// A compiled limit of any algorithm: what a global rule counts with in Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GlobalLimit {
    /// An algorithm with slot state (it can also run locally).
    Slot(Limit),
    SlidingLog(super::sliding_log::SlidingLog),
}

impl GlobalLimit {
    /// The algorithm behind the limit.
    pub fn algorithm(&self) -> &dyn Algorithm {
        match self {
            GlobalLimit::Slot(limit) => limit.algorithm(),
            GlobalLimit::SlidingLog(a) => a,
        }
    }

    /// Builds a limit of `kind` from values in the order of its parameter table.
    pub fn build(kind: AlgorithmKind, values: &[u64]) -> Result<GlobalLimit, ParamError> {
        (kind.spec().build)(values)
    }

    pub fn kind(&self) -> AlgorithmKind {
        self.algorithm().spec().kind
    }

    /// The limit, if its state fits a slot (it can run locally).
    pub fn as_slot(&self) -> Option<&Limit> {
        match self {
            GlobalLimit::Slot(limit) => Some(limit),
            GlobalLimit::SlidingLog(_) => None,
        }
    }

    pub fn max_cost(&self) -> u64 {
        self.policy().quota
    }

    pub fn policy(&self) -> Policy {
        self.algorithm().policy()
    }

    /// See [`Algorithm::local_share`]: the quota divided evenly (at least 1), at the
    /// same pace. A sliding log becomes a sliding-window counter, which needs no log.
    pub fn local_share(&self, instances: u64) -> Result<Limit, ParamError> {
        self.algorithm().local_share(instances)
    }

    /// See [`Algorithm::lease_ttl_ns`].
    pub fn lease_ttl_ns(&self, now_us: u64) -> Option<u64> {
        self.algorithm().lease_ttl_ns(now_us)
    }
}

impl From<Limit> for GlobalLimit {
    fn from(limit: Limit) -> Self {
        GlobalLimit::Slot(limit)
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn every_kind_has_its_own_spec_and_name() {
        for kind in AlgorithmKind::ALL {
            let spec = kind.spec();
            assert_eq!(spec.kind, kind);
            assert_eq!(AlgorithmKind::from_name(spec.name), Some(kind));
            // Required parameters come first, so messages can list them in order.
            let first_optional = spec.parameters.iter().position(|p| p.default.is_some());
            if let Some(at) = first_optional {
                assert!(spec.parameters.iter().skip(at).all(|p| p.default.is_some()));
            }
        }
        assert_eq!(AlgorithmKind::from_name("leaky"), None);
    }

    #[test]
    fn a_parameter_name_means_the_same_unit_in_every_algorithm() {
        // The config and the wire parse a value by its name before they know the
        // algorithm; that needs one unit per name.
        for kind in AlgorithmKind::ALL {
            for p in kind.spec().parameters {
                let seen = AlgorithmKind::all_parameters()
                    .into_iter()
                    .find(|q| q.name == p.name)
                    .map(|q| q.unit);
                assert_eq!(seen, Some(p.unit), "{kind}: {}", p.name);
            }
        }
    }

    #[test]
    fn limits_round_trip_through_their_parameters() {
        let samples: [(AlgorithmKind, &[u64]); 5] = [
            (AlgorithmKind::TokenBucket, &[10, 2, 1_000_000]),
            (AlgorithmKind::Gcra, &[100, 1_000_000, 9]),
            (AlgorithmKind::FixedWindow, &[5, 60_000_000]),
            (AlgorithmKind::SlidingWindow, &[5, 60_000_000]),
            (AlgorithmKind::SlidingLog, &[5, 60_000_000]),
        ];
        for (kind, values) in samples {
            let limit = GlobalLimit::build(kind, values).unwrap();
            assert_eq!(limit.kind(), kind);
            assert_eq!(limit.algorithm().parameters(), values.to_vec());
            assert_eq!(limit.as_slot().is_none(), kind.spec().global_only.is_some());
            assert!(limit.algorithm().check_script_exact().is_ok());
        }
        let short = GlobalLimit::build(AlgorithmKind::Gcra, &[1]).unwrap_err();
        assert_eq!(short.field, "period");
    }

    /// A sample limit of every kind, in the order of [`AlgorithmKind::ALL`].
    fn samples() -> Vec<GlobalLimit> {
        AlgorithmKind::ALL
            .into_iter()
            .map(|kind| {
                let values: &[u64] = match kind.spec().parameters.len() {
                    2 => &[5, 60_000_000],
                    _ => &[10, 2_000_000, 3],
                };
                GlobalLimit::build(kind, values).unwrap()
            })
            .collect()
    }

    #[test]
    fn the_spec_answers_what_the_algorithm_does() {
        let now_us = 1_700_000_000_000_000;
        for limit in samples() {
            let spec = limit.kind().spec();
            // The limit is the limit parameter's value plus `plus`.
            let at = spec
                .parameters
                .iter()
                .position(|p| p.name == spec.limit_parameter.name)
                .unwrap();
            let values = limit.algorithm().parameters();
            assert_eq!(
                limit.max_cost(),
                values[at] + spec.limit_parameter.plus,
                "{}",
                spec.name
            );
            let grown = spec.with_extra_limits(&values, 2).unwrap();
            let grown = GlobalLimit::build(spec.kind, &grown).unwrap();
            assert_eq!(grown.max_cost(), 3 * limit.max_cost(), "{}", spec.name);
            let Some(slot) = limit.as_slot() else {
                assert!(!spec.can_hold && !spec.has_schedule, "{}", spec.name);
                continue;
            };
            let algorithm = slot.algorithm();
            let holds = algorithm.delay_window(now_us, 1, 0).is_some();
            assert_eq!(spec.can_hold, holds, "{}: can_hold", spec.name);
            let reserves = algorithm.reserve(None, now_us, 1, 60_000_000).is_some();
            assert_eq!(spec.has_schedule, reserves, "{}: has_schedule", spec.name);
        }
    }

    #[test]
    fn local_shares_divide_the_quota() {
        let share = |kind, values: &[u64], n| {
            GlobalLimit::build(kind, values)
                .unwrap()
                .local_share(n)
                .unwrap()
        };
        let limit = |kind, values: &[u64]| GlobalLimit::build(kind, values).unwrap();
        // Token bucket 100, 10 per second over 4: 25, 10 every 4 seconds.
        assert_eq!(
            GlobalLimit::Slot(share(AlgorithmKind::TokenBucket, &[100, 10, 1_000_000], 4)),
            limit(AlgorithmKind::TokenBucket, &[25, 10, 4_000_000])
        );
        // GCRA 100 per second, burst 99, over 3: limit 33 (burst 32) at 100 per 3 s.
        assert_eq!(
            GlobalLimit::Slot(share(AlgorithmKind::Gcra, &[100, 1_000_000, 99], 3)),
            limit(AlgorithmKind::Gcra, &[100, 3_000_000, 32])
        );
        // A log of 10 per second over 20: a sliding window of 1 (never 0).
        assert_eq!(
            GlobalLimit::Slot(share(AlgorithmKind::SlidingLog, &[10, 1_000_000], 20)),
            limit(AlgorithmKind::SlidingWindow, &[1, 1_000_000])
        );
    }
}
