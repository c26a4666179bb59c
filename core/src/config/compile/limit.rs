//! A rule's `limit`: an algorithm and its parameters, checked against the algorithm's
//! own parameter table ([`crate::algorithms::AlgorithmSpec`]), so that nothing here
//! names an algorithm or a parameter.

use super::{and_list, error, Result};
use crate::algorithms::{AlgorithmKind, AlgorithmSpec, GlobalLimit, ParamError};
use crate::config::raw::{RawLimit, RawValue};
use crate::field_error::{quoted, FieldError};

pub(super) fn compile(raw: &RawLimit, at: &str) -> Result<GlobalLimit> {
    let Some(kind) = AlgorithmKind::from_name(&raw.algorithm) else {
        let names: Vec<&str> = AlgorithmKind::ALL.iter().map(|k| k.name()).collect();
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
