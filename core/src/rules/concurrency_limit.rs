//! A concurrency rule's limit, its parameters validated: `algorithm: "concurrency"`
//! ([`Concurrency`]) and its `adaptive` controller ([`Adaptive`]). What a limit does with
//! requests in flight is `crate::concurrency`'s, what the controller does with
//! latencies `crate::adaptive`'s.

use crate::algorithms::ParamError;

/// The most requests of one key a rule may let in flight at once.
pub const MAX_IN_FLIGHT: u64 = 1_000_000;

/// `algorithm: "concurrency"`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    /// The most units in flight per key (with `adaptive`: the ceiling of the limit).
    pub max_in_flight: u64,
    /// What a denial tells the client to wait (`Retry-After`), µs: the time in which
    /// a request of the key usually ends.
    pub retry_after_us: u64,
    /// The limit follows the observed latency, between `adaptive.min` and
    /// `max_in_flight`.
    pub adaptive: Option<Adaptive>,
}

impl Concurrency {
    pub fn new(
        max_in_flight: u64,
        retry_after_us: u64,
        adaptive: Option<Adaptive>,
    ) -> Result<Concurrency, ParamError> {
        if !(1..=MAX_IN_FLIGHT).contains(&max_in_flight) {
            return Err(ParamError::new(
                "max_in_flight",
                format!("must be 1 to {MAX_IN_FLIGHT}"),
            ));
        }
        if !(1_000..=3_600_000_000).contains(&retry_after_us) {
            return Err(ParamError::new("retry_after", "must be 1ms to 1h"));
        }
        if let Some(adaptive) = &adaptive {
            adaptive.check(max_in_flight)?;
        }
        Ok(Concurrency {
            max_in_flight,
            retry_after_us,
            adaptive,
        })
    }
}

/// `adaptive`: parameters of the controller, validated. Fractions are in parts per
/// million so that rules stay comparable for equality.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Adaptive {
    /// The latency quantile sampled, per million (p90: 900,000).
    pub quantile_ppm: u32,
    /// The limit never goes below it.
    pub min_limit: u64,
    /// The limit a rule starts with.
    pub initial_limit: u64,
    pub interval_us: u64,
    /// Weight of the new target in the limit, per million (1,000,000: no smoothing).
    pub smoothing_ppm: u32,
    /// Latency allowed over the baseline before the limit shrinks, per million
    /// (1,250,000: 25 % more).
    pub tolerance_ppm: u32,
    /// `per_key`: a controller for each key, for up to this many keys at once (`keys`);
    /// `None`: one controller for the rule.
    pub key_controllers: Option<u32>,
}

/// The most keys a rule may give controllers of their own (`adaptive.keys`): each is a
/// record of [`crate::adaptive::RECORD_BYTES`] in shared data, created when the plugin starts.
pub const MAX_KEY_CONTROLLERS: u32 = 1_024;
impl Adaptive {
    /// Checks every field but `initial_limit` against the rule's `max_in_flight`.
    pub fn check(&self, max_in_flight: u64) -> Result<(), ParamError> {
        if !(1..1_000_000).contains(&self.quantile_ppm) {
            return Err(ParamError::new("adaptive.latency", "must be p1 to p99.9"));
        }
        if self.min_limit == 0 || self.min_limit > max_in_flight {
            return Err(ParamError::new(
                "adaptive.min",
                format!("must be 1 to max_in_flight ({max_in_flight})"),
            ));
        }
        if !(self.min_limit..=max_in_flight).contains(&self.initial_limit) {
            return Err(ParamError::new(
                "adaptive.initial",
                format!("must be adaptive.min to max_in_flight ({max_in_flight})"),
            ));
        }
        if !(10_000..=600_000_000).contains(&self.interval_us) {
            return Err(ParamError::new("adaptive.interval", "must be 10ms to 10m"));
        }
        if !(1..=1_000_000).contains(&self.smoothing_ppm) {
            return Err(ParamError::new(
                "adaptive.smoothing",
                "must be above 0 and at most 1",
            ));
        }
        if !(1_000_000..=10_000_000).contains(&self.tolerance_ppm) {
            return Err(ParamError::new("adaptive.tolerance", "must be 1 to 10"));
        }
        if let Some(keys) = self.key_controllers {
            if !(1..=MAX_KEY_CONTROLLERS).contains(&keys) {
                return Err(ParamError::new(
                    "adaptive.keys",
                    format!("must be 1 to {MAX_KEY_CONTROLLERS}"),
                ));
            }
        }
        Ok(())
    }
}
