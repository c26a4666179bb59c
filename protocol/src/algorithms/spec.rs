//! What the config, the wire and the bridge know about an algorithm before they hold
//! one: its [`AlgorithmSpec`] and the parameters in it.

use std::fmt;

use super::{AlgorithmKind, GlobalLimit};

/// A parameter an algorithm cannot work with. `field` is the parameter's name in its
/// algorithm's [`AlgorithmSpec::parameters`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamError {
    pub field: &'static str,
    pub reason: String,
}

impl ParamError {
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        ParamError {
            field,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// How a parameter's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// A whole number of units (requests, tokens).
    Count,
    /// A duration: `"500ms"` in the config, whole µs on the wire (`<name>_us`).
    Duration,
}

/// One parameter of an algorithm, as the config and the wire name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parameter {
    /// The config's name (`period`); the wire's is [`Parameter::wire_name`].
    pub name: &'static str,
    pub unit: Unit,
    /// The value when the config leaves it out; `None`: required.
    pub default: Option<u64>,
}

impl Parameter {
    pub const fn required(name: &'static str, unit: Unit) -> Parameter {
        Parameter {
            name,
            unit,
            default: None,
        }
    }

    pub const fn optional(name: &'static str, unit: Unit, default: u64) -> Parameter {
        Parameter {
            name,
            unit,
            default: Some(default),
        }
    }

    /// `period` → `period_us`: on the wire every duration is whole µs.
    pub fn wire_name(&self) -> String {
        match self.unit {
            Unit::Count => self.name.to_string(),
            Unit::Duration => format!("{}_us", self.name),
        }
    }
}

/// Everything the config, the wire and the bridge need to know about an algorithm
/// before they hold one: its name, its parameters, where it can run and how to build it.
#[derive(Debug)]
pub struct AlgorithmSpec {
    pub kind: AlgorithmKind,
    /// As written in the config and on the wire.
    pub name: &'static str,
    /// Required parameters first; values are passed to `build` in this order, with
    /// defaults applied.
    pub parameters: &'static [Parameter],
    /// Why the algorithm cannot keep its state in a shared-data slot (and so runs only in
    /// Redis, for global rules); `None` when it can run locally.
    pub global_only: Option<&'static str>,
    /// Its Lua script's file name in `bridge/lua/`, without `.lua`.
    pub script: &'static str,
    /// The Lua script that settles a cost after the response (`commit`,
    /// [`SlotAlgorithm::settle`]) in Redis, for the algorithms that can.
    pub settle_script: Option<&'static str>,
    /// The script's KEYS after the state key, as suffixes of it (same hash slot).
    pub extra_script_keys: &'static [&'static str],
    /// Validates the values (in the order of `parameters`) and builds the limit.
    pub build: fn(&[u64]) -> Result<GlobalLimit, ParamError>,
    /// The parameter the limit (the most a key admits at once) is made of.
    pub limit_parameter: LimitParameter,
    /// Whether a request that does not fit yet can be held until it does
    /// (`on_limit.delay`): [`SlotAlgorithm::delay_window`] answers for it.
    ///
    /// [`SlotAlgorithm::delay_window`]: super::SlotAlgorithm::delay_window
    pub can_hold: bool,
    /// Whether the key has a future schedule whose slots can be reserved ahead of the
    /// requests that will spend them (`lease.horizon`): [`SlotAlgorithm::reserve`]
    /// answers for it.
    ///
    /// [`SlotAlgorithm::reserve`]: super::SlotAlgorithm::reserve
    pub has_schedule: bool,
    /// Whether a saturated key frees a unit or two at a time (a refill, a window sliding
    /// on), so that every Envoy would ask Redis for each: a global rule with a lease then
    /// asks about such a key at most once per horizon (a choice of the engine, not a
    /// property a test can prove).
    pub frees_gradually: bool,
    /// Whether the whole limit comes back at once at every epoch-aligned window boundary,
    /// and only then (its [`Policy`](super::Policy) is exactly the limit per window): what
    /// a shared limit (`share`, [`crate::share`]) splits among its keys window by window.
    pub resets_each_window: bool,
}

/// The parameter a limit is made of: the most a key admits at once is its value plus
/// `plus` (GCRA: `burst + 1`; a bucket's capacity, a window's limit: `+ 0`). What a bound
/// a few bursts looser grows (the simulation's local fallback, the search's slack).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitParameter {
    pub name: &'static str,
    pub plus: u64,
}

impl AlgorithmSpec {
    /// The parameter called `name`, if the algorithm takes one.
    pub fn parameter(&self, name: &str) -> Option<&'static Parameter> {
        self.parameters.iter().find(|p| p.name == name)
    }

    /// Whether a cost can be settled after the response (`commit`): the algorithm can
    /// take back or add units, in shared data ([`SlotAlgorithm::settle`]) and in Redis
    /// (its settle script).
    ///
    /// [`SlotAlgorithm::settle`]: super::SlotAlgorithm::settle
    pub fn settles(&self) -> bool {
        self.settle_script.is_some()
    }

    /// `values` (in the order of `parameters`) with the limit's parameter grown so that
    /// the limit is `extra + 1` times what it was, or `None` when they are too few.
    pub fn with_extra_limits(&self, values: &[u64], extra: u64) -> Option<Vec<u64>> {
        let LimitParameter { name, plus } = self.limit_parameter;
        let at = self.parameters.iter().position(|p| p.name == name)?;
        let mut values = values.to_vec();
        let value = values.get_mut(at)?;
        *value = value.saturating_add(extra.saturating_mul(value.saturating_add(plus)));
        Some(values)
    }
}

/// Values in the order of `params`, or the error naming the first one missing.
pub(super) fn values_of<const N: usize>(
    values: &[u64],
    params: &[Parameter],
) -> Result<[u64; N], ParamError> {
    <[u64; N]>::try_from(values).map_err(|_| {
        let missing = params.get(values.len()).map_or("parameters", |p| p.name);
        ParamError::new(missing, format!("expected {N} parameter values"))
    })
}
