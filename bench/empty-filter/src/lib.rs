//! The empty filter: a proxy-wasm root context and an HTTP context that do nothing —
//! or, when its configuration lists host calls, those calls and nothing else.
//!
//! Envoy still creates a context per request and calls into the VM for every callback
//! the SDK exports (headers, body, trailers, log, done, delete), so what this filter
//! costs per request is the floor any proxy-wasm filter pays in this Envoy and runtime.
//! `weir-bench` runs it side by side with weir under the same `vm_config` (V8,
//! `FAIL_RELOAD`), so the difference between the two is weir's own work.
//!
//! The configuration is empty (or `{}`): nothing. Otherwise it is a comma-separated list
//! of steps run in order on every request's headers, so that the benchmark can price the
//! host calls a filter makes apart from the filter's own code:
//! - `time`: read the clock;
//! - `header:NAME`: read one request header;
//! - `shared_cas:SETS`: a compare-and-swap on one of SETS shared-data keys of 96 bytes
//!   (weir's slot-set size), picked from the bytes of the last header read: one get, one
//!   set with the version the get returned.
//!
//! An unknown step makes `on_configure` fail, so Envoy rejects the configuration.

#[cfg(target_arch = "wasm32")]
use proxy_wasm::traits::{Context, HttpContext, RootContext};
#[cfg(target_arch = "wasm32")]
use proxy_wasm::types::{Action, ContextType, MapType};
#[cfg(target_arch = "wasm32")]
use std::rc::Rc;

/// One host call (or pair) to make per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Time,
    Header(String),
    SharedCas { sets: u32 },
}

/// Parses the configuration; the error names the step that is wrong.
pub fn parse_steps(config: &str) -> Result<Vec<Step>, String> {
    let config = config.trim();
    if config.is_empty() || config == "{}" {
        return Ok(Vec::new());
    }
    config
        .split(',')
        .map(str::trim)
        .map(|step| match step.split_once(':') {
            None if step == "time" => Ok(Step::Time),
            Some(("header", name)) if !name.is_empty() => Ok(Step::Header(name.to_string())),
            Some(("shared_cas", sets)) => match sets.parse::<u32>() {
                Ok(sets) if sets > 0 => Ok(Step::SharedCas { sets }),
                _ => Err(format!("shared_cas: {sets:?} is not a number of sets ≥ 1")),
            },
            _ => Err(format!(
                "unknown step {step:?}: expected time, header:NAME or shared_cas:SETS"
            )),
        })
        .collect()
}

/// The shared-data key of `shared_cas` for a header value.
pub fn set_key(header: &[u8], sets: u32) -> String {
    let sum = header
        .iter()
        .fold(0u32, |a, &b| a.wrapping_mul(31).wrapping_add(u32::from(b)));
    format!("weir-empty-filter/{}", sum % sets)
}

#[cfg(target_arch = "wasm32")]
proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| Box::new(EmptyRoot { steps: Rc::new(Vec::new()) }));
}}

#[cfg(target_arch = "wasm32")]
struct EmptyRoot {
    steps: Rc<Vec<Step>>,
}

#[cfg(target_arch = "wasm32")]
impl Context for EmptyRoot {}

#[cfg(target_arch = "wasm32")]
impl RootContext for EmptyRoot {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        match parse_steps(&String::from_utf8_lossy(&bytes)) {
            Ok(steps) => {
                self.steps = Rc::new(steps);
                true
            }
            Err(e) => {
                proxy_wasm::hostcalls::log(proxy_wasm::types::LogLevel::Critical, &e).ok();
                false
            }
        }
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(EmptyHttp {
            steps: self.steps.clone(),
        }))
    }
}

#[cfg(target_arch = "wasm32")]
struct EmptyHttp {
    steps: Rc<Vec<Step>>,
}

#[cfg(target_arch = "wasm32")]
impl Context for EmptyHttp {}

#[cfg(target_arch = "wasm32")]
impl HttpContext for EmptyHttp {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        use proxy_wasm::hostcalls;
        let mut last_header = Vec::new();
        for step in self.steps.iter() {
            match step {
                Step::Time => {
                    let _ = hostcalls::get_current_time();
                }
                Step::Header(name) => {
                    if let Ok(Some(value)) =
                        hostcalls::get_map_value_bytes(MapType::HttpRequestHeaders, name)
                    {
                        last_header = value;
                    }
                }
                Step::SharedCas { sets } => {
                    let key = set_key(&last_header, *sets);
                    if let Ok((value, cas)) = hostcalls::get_shared_data(&key) {
                        let value = value.unwrap_or_else(|| vec![0; 96]);
                        let _ = hostcalls::set_shared_data(&key, Some(&value), cas);
                    }
                }
            }
        }
        Action::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_parse_and_errors_name_the_step() {
        assert_eq!(parse_steps("{}"), Ok(vec![]));
        assert_eq!(parse_steps(""), Ok(vec![]));
        assert_eq!(
            parse_steps("time, header:x-user, shared_cas:2500"),
            Ok(vec![
                Step::Time,
                Step::Header("x-user".into()),
                Step::SharedCas { sets: 2500 }
            ])
        );
        assert_eq!(
            parse_steps("time,clock"),
            Err("unknown step \"clock\": expected time, header:NAME or shared_cas:SETS".into())
        );
        assert_eq!(
            parse_steps("shared_cas:0"),
            Err("shared_cas: \"0\" is not a number of sets ≥ 1".into())
        );
    }

    #[test]
    fn set_keys_spread_over_the_sets() {
        let keys: std::collections::HashSet<String> = (0..1000)
            .map(|i| set_key(format!("u{i}").as_bytes(), 2500))
            .collect();
        assert!(keys.len() > 800, "{} distinct keys", keys.len());
    }
}
