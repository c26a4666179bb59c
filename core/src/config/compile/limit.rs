//! A rule's `limit`: an algorithm and its parameters, checked against the algorithm's
//! own parameter table ([`crate::algorithms::AlgorithmSpec`]), so that nothing here
//! names an algorithm or a parameter.

use super::{and_list, error, key, Interner, Result};
use crate::algorithms::{AlgorithmKind, AlgorithmSpec, GlobalLimit, ParamError};
use crate::config::raw::{RawAdaptive, RawLimit, RawValue};
use crate::field_error::{quoted, FieldError};
use crate::rules::{Adaptive, Concurrency, LimitFrom};

/// The name of the concurrency limit, which is not a rate algorithm.
pub(super) const CONCURRENCY: &str = "concurrency";
/// What a concurrency denial tells clients to wait by default.
pub const DEFAULT_CONCURRENCY_RETRY_AFTER_US: u64 = 1_000_000;

#[inline(never)] // a wasm function of its own: see `compile::compile`
pub(super) fn compile(raw: &RawLimit, at: &str) -> Result<GlobalLimit> {
    if let Some(field) = raw.concurrency.first_set() {
        return Err(error(
            format!("{at}.{field}"),
            format!(
                "`{field}` is a field of algorithm \"concurrency\", not {}",
                quoted(&raw.algorithm)
            ),
        ));
    }
    let Some(kind) = AlgorithmKind::from_name(&raw.algorithm) else {
        let names: Vec<&str> = AlgorithmKind::ALL
            .iter()
            .map(|k| k.name())
            .chain([CONCURRENCY])
            .collect();
        return Err(error(
            format!("{at}.algorithm"),
            format!(
                "unknown algorithm {}: expected one of {}",
                quoted(&raw.algorithm),
                names.join(", ")
            ),
        ));
    };
    let spec = kind.spec();
    if let Some((stray, _)) = raw
        .values
        .iter()
        .find(|(p, _)| spec.parameter(p.name).is_none())
    {
        return Err(error(
            format!("{at}.{}", stray.name),
            format!(
                "`{}` is not a parameter of {kind}; {}",
                stray.name,
                describe_parameters(spec)
            ),
        ));
    }
    let mut values = Vec::with_capacity(spec.parameters.len());
    for p in spec.parameters {
        let value = match (raw.value(p.name), p.default) {
            (Some(RawValue::Count(n)), _) => *n,
            (Some(RawValue::Duration(d)), _) => d.us,
            // Built with its default; `from_request` checks the rest.
            (Some(RawValue::FromRequest(from)), _) => from.default.ok_or_else(|| {
                error(
                    format!("{at}.{}", p.name),
                    "missing field `default`: the value of a request that gives none",
                )
            })?,
            (None, Some(default)) => default,
            (None, None) => {
                return Err(error(
                    at,
                    format!("missing field `{}`; {}", p.name, describe_parameters(spec)),
                ))
            }
        };
        values.push(value);
    }
    (spec.build)(&values).map_err(|e| param_error(e, raw, spec, at))
}

/// `algorithm: "concurrency"`: `max_in_flight`, `retry_after` and `adaptive`.
pub(super) fn concurrency(raw: &RawLimit, at: &str) -> Result<Concurrency> {
    if let Some((stray, _)) = raw.values.first() {
        return Err(error(
            format!("{at}.{}", stray.name),
            format!(
                "`{}` is not a field of concurrency; concurrency takes `max_in_flight` and \
                 optionally `retry_after` and `adaptive`",
                stray.name
            ),
        ));
    }
    let fields = &raw.concurrency;
    let Some(max_in_flight) = fields.max_in_flight else {
        return Err(error(
            at,
            "missing field `max_in_flight`; concurrency takes `max_in_flight` and optionally \
             `retry_after` and `adaptive`",
        ));
    };
    let retry_after_us = fields
        .retry_after
        .as_ref()
        .map_or(DEFAULT_CONCURRENCY_RETRY_AFTER_US, |d| d.us);
    let adaptive = match &fields.adaptive {
        Some(raw) => Some(adaptive(raw, max_in_flight, &format!("{at}.adaptive"))?),
        None => None,
    };
    Concurrency::new(max_in_flight, retry_after_us, adaptive).map_err(|e| {
        let value = match e.field {
            "max_in_flight" => max_in_flight.to_string(),
            "retry_after" => fields
                .retry_after
                .as_ref()
                .map_or_else(|| "\"1s\"".to_string(), |d| quoted(&d.text)),
            _ => String::new(),
        };
        error(
            format!("{at}.{}", e.field),
            format!("invalid value {value}: {}", e.reason),
        )
    })
}

/// Keys with a controller of their own at once, by default (`adaptive.keys`).
const DEFAULT_KEY_CONTROLLERS: u64 = 64;

/// The controller's defaults: p90 over 1 s intervals, a limit from 1 up, starting at
/// `min` (where the baseline is learnt), half of each new target taken, 25 % of latency
/// over the baseline tolerated (Envoy's default buffer).
fn adaptive(raw: &RawAdaptive, max_in_flight: u64, at: &str) -> Result<Adaptive> {
    let quantile_ppm = match &raw.latency {
        None => 900_000,
        Some(text) => parse_quantile(text).ok_or_else(|| {
            error(
                format!("{at}.latency"),
                format!(
                    "{} is not a quantile: expected \"p50\", \"p90\", \"p99\" or the like \
                     (p1 to p99.9)",
                    quoted(text)
                ),
            )
        })?,
    };
    let min_limit = raw.min.unwrap_or(1);
    let fraction = |value: Option<f64>, default: u32, field: &str| -> Result<u32> {
        match value {
            None => Ok(default),
            Some(v) if v.is_finite() && (0.0..=10.0).contains(&v) => Ok((v * 1e6).round() as u32),
            Some(v) => Err(error(
                format!("{at}.{field}"),
                format!("{v} is out of range"),
            )),
        }
    };
    let key_controllers =
        match (raw.per_key, raw.keys) {
            (Some(true), keys) => Some(keys.unwrap_or(DEFAULT_KEY_CONTROLLERS)),
            (_, None) => None,
            (_, Some(_)) => return Err(error(
                format!("{at}.keys"),
                "counts the keys with a controller of their own: it goes with \"per_key\": true"
                    .to_string(),
            )),
        };
    let adaptive = Adaptive {
        key_controllers: key_controllers.map(|k| u32::try_from(k).unwrap_or(u32::MAX)),
        quantile_ppm,
        min_limit,
        initial_limit: raw.initial.unwrap_or(min_limit),
        interval_us: raw.interval.as_ref().map_or(1_000_000, |d| d.us),
        smoothing_ppm: fraction(raw.smoothing, 500_000, "smoothing")?,
        tolerance_ppm: fraction(raw.tolerance, 1_250_000, "tolerance")?,
    };
    adaptive.check(max_in_flight).map_err(|e| {
        let field = e.field.trim_start_matches("adaptive.");
        let value = match field {
            "min" => min_limit.to_string(),
            "initial" => adaptive.initial_limit.to_string(),
            "interval" => raw
                .interval
                .as_ref()
                .map_or_else(|| "\"1s\"".to_string(), |d| quoted(&d.text)),
            "smoothing" => raw.smoothing.unwrap_or(0.5).to_string(),
            "tolerance" => raw.tolerance.unwrap_or(1.25).to_string(),
            "keys" => key_controllers.unwrap_or_default().to_string(),
            _ => String::new(),
        };
        error(
            format!("{at}.{field}"),
            format!("invalid value {value}: {}", e.reason),
        )
    })?;
    Ok(adaptive)
}

/// `"p90"` → 900,000 per million; `"p99.9"` → 999,000.
fn parse_quantile(text: &str) -> Option<u32> {
    let number = text.strip_prefix('p')?;
    if number.is_empty() || number.len() > 6 {
        return None;
    }
    let value: f64 = number.parse().ok()?;
    let ppm = (value * 10_000.0).round();
    (value.is_finite() && (10_000.0..=999_000.0).contains(&ppm)).then_some(ppm as u32)
}

/// The parameters of `limit` (built with their defaults by [`compile`]) that `raw` reads
/// from the request: each with one source (a header listed in `trusted_headers`, a JWT
/// claim, an attribute), a `default` and a `max`, and `min ≤ default ≤ max` (`min` 1
/// unless given), each of which builds a limit with the other parameters as configured.
#[inline(never)] // a wasm function of its own: see `compile::compile`
pub(super) fn from_request(
    raw: &RawLimit,
    limit: &GlobalLimit,
    at: &str,
    facts: &mut Interner,
) -> Result<Vec<LimitFrom>> {
    let spec = limit.kind().spec();
    let configured = limit.algorithm().parameters();
    let mut read = Vec::new();
    for (parameter, value) in &raw.values {
        let RawValue::FromRequest(from) = value else {
            continue;
        };
        let at = format!("{at}.{}", parameter.name);
        let Some(index) = spec
            .parameters
            .iter()
            .position(|p| p.name == parameter.name)
        else {
            continue;
        };
        let (fact, attribute) = key::value_source(from, &at, facts)?;
        let Some(max) = from.max else {
            return Err(error(
                &at,
                "missing field `max`: the most a request's value may raise it to",
            ));
        };
        let default = from.default.unwrap_or(max);
        let min = from.min.unwrap_or(1);
        if !(min <= default && default <= max) {
            return Err(error(
                &at,
                format!(
                    "expected min ≤ default ≤ max; found min {min}, default {default}, max {max}"
                ),
            ));
        }
        for (field, value) in [("min", min), ("max", max)] {
            let mut values = configured.clone();
            if let Some(slot) = values.get_mut(index) {
                *slot = value;
            }
            (spec.build)(&values).map_err(|e| {
                error(
                    format!("{at}.{field}"),
                    format!("invalid value {value}: {}", e.reason),
                )
            })?;
        }
        read.push(LimitFrom {
            parameter: index,
            fact,
            attribute,
            default,
            min,
            max,
        });
    }
    Ok(read)
}

/// A global limit must also be decided exactly by its Lua script (the bridge refuses
/// what would not be): the same check, with the config's path.
pub(super) fn check_script_exact(limit: &GlobalLimit, at: &str) -> Result<()> {
    limit.algorithm().check_script_exact().map_err(|e| {
        error(
            format!("{at}.{}", e.field),
            format!("{} (global rules run in Redis)", e.reason),
        )
    })
}

/// `gcra takes `rate` and `period` and optionally `burst``.
fn describe_parameters(spec: &AlgorithmSpec) -> String {
    let names = |required: bool| -> Vec<&str> {
        spec.parameters
            .iter()
            .filter(|p| p.default.is_none() == required)
            .map(|p| p.name)
            .collect()
    };
    let mut text = format!("{} takes {}", spec.name, and_list(&names(true)));
    let optional = names(false);
    if !optional.is_empty() {
        text.push_str(" and optionally ");
        text.push_str(&and_list(&optional));
    }
    text
}

/// `rules[i].limit.<field>: invalid value <value>: <reason>`, quoting the value as
/// written (or the default that was used).
fn param_error(e: ParamError, raw: &RawLimit, spec: &AlgorithmSpec, at: &str) -> FieldError {
    let value = match raw.value(e.field) {
        Some(RawValue::Count(n)) => Some(n.to_string()),
        Some(RawValue::FromRequest(from)) => from.default.map(|n| n.to_string()),
        Some(RawValue::Duration(d)) => Some(quoted(&d.text)),
        None => spec
            .parameter(e.field)
            .and_then(|p| p.default)
            .map(|n| n.to_string()),
    };
    let message = match value {
        Some(value) => format!("invalid value {value}: {}", e.reason),
        None => e.reason,
    };
    error(format!("{at}.{}", e.field), message)
}
