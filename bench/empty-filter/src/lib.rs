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
//!   set with the version the get returned;
//! - `call:CLUSTER:PATH`: one HTTP call to the Envoy cluster CLUSTER, `POST PATH` with
//!   weir's headers (`:authority` the cluster's name, `content-type: application/json`)
//!   and the body of [`ACQUIRE_BODY`] (a `/v2/acquire` body of the shape and size
//!   weir-global-exact sends), 250 ms timeout; the request waits for the answer and then
//!   goes on, whatever it was: nothing of it is read. The last step, if any.
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
    SharedCas {
        sets: u32,
    },
    /// Pauses the request on one HTTP call to `cluster` (see the module docs).
    Call {
        cluster: String,
        path: String,
    },
}

/// The body `call` sends: the `/v2/acquire` body weir-global-exact sends for tenant
/// `t0` (one GCRA item, cost = want = 1). weir-bench checks that it is byte for byte what
/// weir sends, so the floor follows weir's wire format.
pub const ACQUIRE_BODY: &str = include_str!("acquire.json");

/// The `call` step's timeout, as weir-bench's bridge configuration.
pub const CALL_TIMEOUT_MS: u64 = 250;

/// What a cluster name or path may hold: printable ASCII without spaces (as weir's
/// bridge settings).
fn printable(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| (0x21..0x7f).contains(&b))
}

fn parse_call(step: &str, rest: &str) -> Result<Step, String> {
    match rest.split_once(':') {
        Some((cluster, path)) if printable(cluster) && printable(path) && path.starts_with('/') => {
            Ok(Step::Call {
                cluster: cluster.to_string(),
                path: path.to_string(),
            })
        }
        _ => Err(format!(
            "{step:?}: expected call:CLUSTER:PATH, a cluster name and a path starting with /, without spaces"
        )),
    }
}

/// Parses the configuration; the error names the step that is wrong.
pub fn parse_steps(config: &str) -> Result<Vec<Step>, String> {
    let config = config.trim();
    if config.is_empty() || config == "{}" {
        return Ok(Vec::new());
    }
    let steps = config
        .split(',')
        .map(str::trim)
        .map(|step| match step.split_once(':') {
            None if step == "time" => Ok(Step::Time),
            Some(("header", name)) if !name.is_empty() => Ok(Step::Header(name.to_string())),
            Some(("shared_cas", sets)) => match sets.parse::<u32>() {
                Ok(sets) if sets > 0 => Ok(Step::SharedCas { sets }),
                _ => Err(format!("shared_cas: {sets:?} is not a number of sets ≥ 1")),
            },
            Some(("call", rest)) => parse_call(step, rest),
            _ => Err(format!(
                "unknown step {step:?}: expected time, header:NAME, shared_cas:SETS or call:CLUSTER:PATH"
            )),
        })
        .collect::<Result<Vec<Step>, String>>()?;
    // The request pauses on the call: a step after it would run before the answer.
    let calls = steps
        .iter()
        .filter(|s| matches!(s, Step::Call { .. }))
        .count();
    let last_is_call = matches!(steps.last(), Some(Step::Call { .. }));
    if calls > 1 || (calls == 1 && !last_is_call) {
        return Err("call:CLUSTER:PATH must be the last step, and the only call".into());
    }
    Ok(steps)
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
impl Context for EmptyHttp {
    /// The answer of the `call` step (or Envoy's 503/504 in its place): the request goes
    /// on. The SDK has made this request the effective context already.
    fn on_http_call_response(
        &mut self,
        _token: u32,
        _headers: usize,
        _body: usize,
        _trailers: usize,
    ) {
        let _ = proxy_wasm::hostcalls::resume_http_request();
    }
}

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
                Step::Call { cluster, path } => {
                    let headers = vec![
                        (":method", "POST"),
                        (":path", path.as_str()),
                        (":authority", cluster.as_str()),
                        ("content-type", "application/json"),
                    ];
                    let sent = hostcalls::dispatch_http_call(
                        cluster,
                        headers,
                        Some(ACQUIRE_BODY.as_bytes()),
                        vec![],
                        std::time::Duration::from_millis(CALL_TIMEOUT_MS),
                    );
                    // A call Envoy refuses (no such cluster) lets the request go on;
                    // weir-bench counts no call then, and its smoke run fails.
                    if sent.is_ok() {
                        return Action::Pause;
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
            Err("unknown step \"clock\": expected time, header:NAME, shared_cas:SETS or call:CLUSTER:PATH".into())
        );
        assert_eq!(
            parse_steps("shared_cas:0"),
            Err("shared_cas: \"0\" is not a number of sets ≥ 1".into())
        );
    }

    #[test]
    fn call_steps_parse_and_errors_name_the_step() {
        assert_eq!(
            parse_steps("call:weir_bridge:/v2/acquire"),
            Ok(vec![Step::Call {
                cluster: "weir_bridge".into(),
                path: "/v2/acquire".into()
            }])
        );
        assert_eq!(
            parse_steps("time, header:x-tenant, call:b:/x"),
            Ok(vec![
                Step::Time,
                Step::Header("x-tenant".into()),
                Step::Call {
                    cluster: "b".into(),
                    path: "/x".into()
                }
            ])
        );
        let bad = |step: &str| {
            format!(
                "{step:?}: expected call:CLUSTER:PATH, a cluster name and a path starting with /, without spaces"
            )
        };
        for step in [
            "call:weir_bridge",
            "call::/v2/acquire",
            "call:weir_bridge:",
            "call:weir_bridge:v2/acquire",
            "call:weir bridge:/v2/acquire",
        ] {
            assert_eq!(parse_steps(step), Err(bad(step)), "{step}");
        }
        let order = Err("call:CLUSTER:PATH must be the last step, and the only call".into());
        assert_eq!(parse_steps("call:b:/x, time"), order);
        assert_eq!(parse_steps("call:b:/x, call:b:/x"), order);
    }

    #[test]
    fn the_acquire_body_is_one_json_line() {
        assert!(ACQUIRE_BODY.starts_with("{\"domain\":") && ACQUIRE_BODY.ends_with("}]}"));
        assert!(!ACQUIRE_BODY.contains('\n'));
    }

    #[test]
    fn set_keys_spread_over_the_sets() {
        let keys: std::collections::HashSet<String> = (0..1000)
            .map(|i| set_key(format!("u{i}").as_bytes(), 2500))
            .collect();
        assert!(keys.len() > 800, "{} distinct keys", keys.len());
    }
}
