//! What the three window algorithms (fixed window, sliding-window counter, sliding log)
//! share: `limit` units per `window`, windows aligned to the Unix epoch.

use super::saturating::until_ns;
use super::{
    Admission, Algorithm, AlgorithmSpec, Breach, Limit, LimitParameter, ParamError, Parameter,
    Policy, Unit, MAX_SCRIPT_EXACT, NS_PER_US,
};

/// A window algorithm: what differs between the three; [`Algorithm`] follows for each.
pub(crate) trait Windowed {
    const SPEC: &'static AlgorithmSpec;

    fn window(&self) -> &Window;

    /// See [`Algorithm::local_share`].
    fn local_share(&self, instances: u64) -> Result<Limit, ParamError>;

    /// See [`Algorithm::lease_ttl_ns`].
    fn lease_ttl_ns(&self, now_us: u64) -> Option<u64>;

    /// See [`Algorithm::check_bound`].
    fn check_bound(&self, sorted: &[Admission]) -> Option<Breach>;

    /// See [`Algorithm::default_lease_ttl_us`].
    fn default_lease_ttl_us(&self, default_us: u64) -> u64 {
        default_us
    }
}

impl<T: Windowed> Algorithm for T {
    fn spec(&self) -> &'static AlgorithmSpec {
        T::SPEC
    }

    fn parameters(&self) -> Vec<u64> {
        self.window().values()
    }

    fn policy(&self) -> Policy {
        self.window().policy()
    }

    fn local_share(&self, instances: u64) -> Result<Limit, ParamError> {
        Windowed::local_share(self, instances)
    }

    fn lease_ttl_ns(&self, now_us: u64) -> Option<u64> {
        Windowed::lease_ttl_ns(self, now_us)
    }

    /// `[limit, window_us]`.
    fn script_args(&self) -> Vec<u64> {
        self.window().values()
    }

    fn check_script_exact(&self) -> Result<(), ParamError> {
        self.window().check_script_exact()
    }

    fn default_lease_ttl_us(&self, default_us: u64) -> u64 {
        Windowed::default_lease_ttl_us(self, default_us)
    }

    fn check_bound(&self, sorted: &[Admission]) -> Option<Breach> {
        Windowed::check_bound(self, sorted)
    }
}

/// `limit` and `window`, in this order.
pub(crate) const PARAMETERS: &[Parameter] = &[
    Parameter::required("limit", Unit::Count),
    Parameter::required("window", Unit::Duration),
];

/// A window's limit is its `limit`.
pub(crate) const LIMIT_PARAMETER: LimitParameter = LimitParameter {
    name: "limit",
    plus: 0,
};

/// `limit` units per `window_us`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub limit: u64,
    pub window_us: u64,
}

impl Window {
    /// `limit` (1 to `max_limit`, whose error says why) per `window_us` (≥ 1 µs).
    pub fn new(
        limit: u64,
        window_us: u64,
        max_limit: Option<(u64, &str)>,
    ) -> Result<Self, ParamError> {
        if limit == 0 {
            return Err(ParamError::new("limit", "must be at least 1"));
        }
        if let Some((max, why)) = max_limit {
            if limit > max {
                return Err(ParamError::new(
                    "limit",
                    format!("must be at most {max}{why}"),
                ));
            }
        }
        if window_us == 0 {
            return Err(ParamError::new("window", "must be at least 1us"));
        }
        Ok(Window { limit, window_us })
    }

    /// `[limit, window_us]`: the parameter values, and the Lua scripts' arguments.
    pub fn values(&self) -> Vec<u64> {
        vec![self.limit, self.window_us]
    }

    /// The start of the window `now_us` is in.
    pub fn start_of(&self, now_us: u64) -> u64 {
        now_us - now_us % self.window_us
    }

    pub fn end_of(&self, window_start_us: u64) -> u64 {
        window_start_us.saturating_add(self.window_us)
    }

    /// A window that starts after `aligned` (the start of now's): the clock went back.
    /// Misaligned starts (a state written with another window length, or garbage) are
    /// not windows and count as nothing.
    pub fn is_later_window(&self, window_start_us: u64, aligned: u64) -> bool {
        window_start_us > aligned && window_start_us.is_multiple_of(self.window_us)
    }

    /// `limit` units per window.
    pub fn policy(&self) -> Policy {
        Policy {
            quota: self.limit,
            window_ns: self.window_us.saturating_mul(NS_PER_US),
        }
    }

    /// ns until the end of the window `now_us` is in.
    pub fn until_window_end_ns(&self, now_us: u64) -> u64 {
        until_ns(self.end_of(self.start_of(now_us)), now_us)
    }

    /// One of `instances` Envoys' even share of the limit (at least 1).
    pub fn share(&self, instances: u64) -> u64 {
        (self.limit / instances.max(1)).max(1)
    }

    pub fn check_script_exact(&self) -> Result<(), ParamError> {
        if self.limit > MAX_SCRIPT_EXACT {
            return Err(ParamError::new(
                "limit",
                "must be at most 2^48 for exact arithmetic in Redis",
            ));
        }
        if self.window_us > MAX_SCRIPT_EXACT {
            return Err(ParamError::new(
                "window",
                "must be at most 2^48 us for exact arithmetic in Redis",
            ));
        }
        Ok(())
    }
}

/// The admissions of one window (fixed, or of the sliding-window counter): its number,
/// its first admission and their sum so far.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowSum {
    pub k: u64,
    pub first: usize,
    pub sum: u128,
}

impl WindowSum {
    /// `current` with admission `j` (in window `k`) added, or a new window.
    pub(crate) fn add(current: Option<WindowSum>, k: u64, j: usize, cost: u64) -> WindowSum {
        match current {
            Some(c) if c.k == k => WindowSum {
                sum: c.sum.saturating_add(u128::from(cost)),
                ..c
            },
            _ => WindowSum {
                k,
                first: j,
                sum: u128::from(cost),
            },
        }
    }
}
