//! Counted cost: each weir scenario's plugin configuration run on a scripted Envoy
//! (`weir_scripted::scripted_host`) with the scenario's traffic, counting what crosses the
//! VM's boundary per request — callbacks Envoy makes into the VM, and calls the VM makes
//! into Envoy, by kind. These counts come out the same on any machine (the scripted host
//! makes the callbacks real Envoy makes for a request answered by the benchmark's direct
//! response, body included, and answers bridge calls from weir-bridge's model at once), so CI holds them to committed
//! ceilings (`bench/counted-ceilings.json`) where a time could only flake. Real Envoy's
//! own counts of the same stats (`vm.entries`, `vm.calls.<kind>`) are in a full run's
//! results.

use std::collections::BTreeMap;

use weir_core::filter::host::{BoundaryCounts, CallKind, Host};
use weir_core::filter::Action;
use weir_scripted::scripted_envoy::Envoy;
use weir_testkit::simulation::ModelBridge;

use crate::scenario::Scenario;
use crate::wrk::{Traffic, TENANTS, USERS};

/// Requests before counting: every user and tenant has its key's state, leases are warm.
const WARM_UP: u64 = 3_000;
/// Simulated time between requests (10,000 requests a second).
const SPACING_US: u64 = 100;
/// Envoy's tick of an idle plugin: every 100 ms (what weir asks for when nothing waits).
const TICK_US: u64 = 100_000;
const T0: u64 = 1_750_000_000_000_000;

/// What one scenario's requests cost, per request.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Counted {
    pub scenario: String,
    pub requests: u64,
    /// Callbacks into the VM per request.
    pub entries: f64,
    /// Calls into Envoy per request, all kinds.
    pub host_calls: f64,
    /// Calls into Envoy per request, by kind (`vm.calls.<kind>`).
    pub calls: BTreeMap<String, f64>,
    /// Bridge calls per request.
    pub bridge_calls: f64,
    /// Requests answered 429 by the filter.
    pub limited: u64,
}

/// The headers of request `n` of `traffic` (as the benchmark's wrk script sends them).
fn headers(traffic: Traffic, n: u64) -> Vec<(String, String)> {
    let (users, tenants) = (u64::from(USERS), u64::from(TENANTS));
    let (user, tenant) = match traffic {
        Traffic::HalfNew if n.is_multiple_of(2) => (format!("new-{n}"), n / 2 % tenants),
        _ => (format!("u{}", n % users), n % users % tenants),
    };
    vec![
        (":path".to_string(), "/".to_string()),
        (":method".to_string(), "GET".to_string()),
        ("x-user".to_string(), user),
        ("x-tenant".to_string(), format!("t{tenant}")),
    ]
}

/// Runs `requests` requests of `scenario` (after a warm-up) and counts them; `None` for a
/// scenario that is not weir.
pub fn count(scenario: Scenario, requests: u64) -> Option<Counted> {
    let config = scenario.plugin_config()?;
    let mut envoy = Envoy::new(&config).unwrap_or_else(|e| panic!("{}: {e}", scenario.id()));
    let mut bridge = ModelBridge::default();
    envoy.set_now_us(T0);
    let mut next_tick = T0 + TICK_US;
    let mut before = BoundaryCounts::default();
    let (mut limited, mut bridge_calls_before) = (0, 0);
    for n in 0..WARM_UP + requests {
        if n == WARM_UP {
            before = envoy.host.counts();
            bridge_calls_before = bridge.calls;
        }
        let limited_here = serve(&mut envoy, &mut bridge, scenario, n, &mut next_tick);
        if limited_here && n >= WARM_UP {
            limited += 1;
        }
    }
    let after = envoy.host.counts();
    let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / requests as f64;
    let calls = CallKind::ALL
        .iter()
        .map(|kind| {
            let i = kind.index();
            (
                kind.stat_name().to_string(),
                per(after.calls[i], before.calls[i]),
            )
        })
        .collect();
    Some(Counted {
        scenario: scenario.id().to_string(),
        requests,
        entries: per(after.entries, before.entries),
        host_calls: per(after.total_calls(), before.total_calls()),
        calls,
        bridge_calls: per(bridge.calls, bridge_calls_before),
        limited,
    })
}

/// Serves request `n` of `scenario` on `envoy` (the tick first when it is due): headers,
/// the bridge calls answered by `bridge`, the response, the end. Whether the filter
/// answered it (429).
fn serve(
    envoy: &mut Envoy,
    bridge: &mut ModelBridge,
    scenario: Scenario,
    n: u64,
    next_tick: &mut u64,
) -> bool {
    envoy.advance_us(SPACING_US);
    if envoy.now_us() >= *next_tick {
        let root = envoy.root;
        envoy.tick(root);
        *next_tick += TICK_US;
    }
    let (context, action) = open(envoy, scenario, n);
    if action == Action::Pause {
        answer_calls(envoy, bridge);
    }
    finish(envoy, context)
}

/// Request `n` of `scenario`'s traffic, up to its headers: its context and what the
/// filter said.
fn open(envoy: &mut Envoy, scenario: Scenario, n: u64) -> (u32, Action) {
    let owned = headers(scenario.traffic(), n);
    let pairs: Vec<(&str, &str)> = owned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    envoy.request(&pairs)
}

/// Answers every open call the way weir-bridge would.
fn answer_calls(envoy: &mut Envoy, bridge: &mut ModelBridge) {
    for call in envoy.open_calls() {
        let (status, body) = model_answer(bridge, &call.body, envoy.now_us());
        envoy.answer(call.token, status, &body);
    }
}

/// weir-bridge's answer to `body` at `now_us`, from its model: status and body.
fn model_answer(bridge: &mut ModelBridge, body: &[u8], now_us: u64) -> (u16, Vec<u8>) {
    match bridge.acquire(body, now_us) {
        Ok(reply) => (200, serde_json::to_vec(&reply).unwrap_or_default()),
        Err((status, body)) => (status, body.into_bytes()),
    }
}

/// The response of `context` (the upstream's, or the filter's local reply) and its end;
/// whether the filter answered it.
fn finish(envoy: &mut Envoy, context: u32) -> bool {
    let answered_here = envoy.stream(context).and_then(|s| s.local_reply).is_some();
    if answered_here {
        envoy.deliver_local_reply(context);
    } else {
        envoy.respond(
            context,
            200,
            &[],
            weir_e2e::bootstrap::DEFAULT_BODY.as_bytes(),
        );
    }
    envoy.close(context);
    answered_here
}

/// Every weir scenario of the default run, counted. A twin ([`Scenario::twin`]: slowed,
/// or on a single Redis) is left out: the scripted bridge answers at once whatever is
/// behind it, so it would count what its twin counts.
pub fn count_all(requests: u64) -> Vec<Counted> {
    Scenario::ALL
        .iter()
        .filter(|s| s.twin().is_none())
        .filter_map(|&s| count(s, requests))
        .collect()
}

// One bridge call, callback by callback (issue 21, item 4): where the VM's share of an
// exact global decision goes.

/// What one of a request's callbacks into the VM cost.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Callback {
    /// The `proxy_on_*` callbacks Envoy made.
    pub callback: String,
    /// Entries into the VM, the callbacks and the copies Envoy allocated in the VM.
    pub entries: u64,
    /// Calls into Envoy by kind (`vm.calls.<kind>`), the kinds it made.
    pub calls: BTreeMap<String, u64>,
}

/// One request of a scenario that makes a bridge call, on the scripted Envoy after the
/// warm-up: its callbacks, and the call as it went out and came back.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CallTrace {
    pub scenario: String,
    pub callbacks: Vec<Callback>,
    /// The call's headers, as the filter handed them to Envoy.
    pub call_headers: Vec<(String, String)>,
    /// The `/v2/acquire` body the filter sent.
    pub call_body: String,
    /// weir-bridge's answer to it (from the bridge's model), read back into the VM.
    pub reply_body: String,
}

/// The request after the warm-up of `scenario`, callback by callback; `None` for a
/// scenario that is not weir or whose request makes no bridge call.
pub fn trace_call(scenario: Scenario) -> Option<CallTrace> {
    let config = scenario.plugin_config()?;
    let mut envoy = Envoy::new(&config).ok()?;
    let mut bridge = ModelBridge::default();
    envoy.set_now_us(T0);
    let mut next_tick = T0 + TICK_US;
    for n in 0..WARM_UP {
        serve(&mut envoy, &mut bridge, scenario, n, &mut next_tick);
    }
    // The traced request is not a tick's.
    envoy.advance_us(SPACING_US);
    let mut callbacks = Vec::new();
    let mut mark = envoy.host.counts();
    let mut step = |envoy: &Envoy, callback: &str| {
        let now = envoy.host.counts();
        let calls = CallKind::ALL
            .iter()
            .map(|k| {
                (
                    k.stat_name().to_string(),
                    now.calls[k.index()] - mark.calls[k.index()],
                )
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        callbacks.push(Callback {
            callback: callback.to_string(),
            entries: now.entries - mark.entries,
            calls,
        });
        mark = now;
    };
    let (context, action) = open(&mut envoy, scenario, WARM_UP);
    step(&envoy, "on_context_create, on_request_headers");
    let call = envoy
        .open_calls()
        .into_iter()
        .next()
        .filter(|_| action == Action::Pause)?;
    let (status, reply) = model_answer(&mut bridge, &call.body, envoy.now_us());
    envoy.answer(call.token, status, &reply);
    step(&envoy, "on_http_call_response");
    envoy.respond(
        context,
        200,
        &[],
        weir_e2e::bootstrap::DEFAULT_BODY.as_bytes(),
    );
    step(&envoy, "on_response_headers, on_response_body");
    envoy.close(context);
    step(&envoy, "on_done, on_delete");
    Some(CallTrace {
        scenario: scenario.id().to_string(),
        callbacks,
        call_headers: call.headers,
        call_body: String::from_utf8_lossy(&call.body).into_owned(),
        reply_body: String::from_utf8_lossy(&reply).into_owned(),
    })
}

/// The table `weir-bench counted` prints.
pub fn table(counted: &[Counted]) -> String {
    let kinds: Vec<&str> = CallKind::ALL.iter().map(|k| k.stat_name()).collect();
    let mut out = format!(
        "| scenario | VM entries/req | host calls/req | {} | bridge calls/req |\n|---|---|---|{}---|\n",
        kinds.join(" | "),
        "---|".repeat(kinds.len())
    );
    for c in counted {
        let by_kind: Vec<String> = kinds
            .iter()
            .map(|k| format!("{:.2}", c.calls.get(*k).copied().unwrap_or(0.0)))
            .collect();
        out.push_str(&format!(
            "| {} | {:.2} | {:.2} | {} | {:.4} |\n",
            c.scenario,
            c.entries,
            c.host_calls,
            by_kind.join(" | "),
            c.bridge_calls
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed ceilings: per scenario, the most VM entries and host calls a
    /// request may cost. A change that costs more fails here; one that costs less lowers
    /// them (`weir-bench counted` prints the figures).
    #[derive(serde::Deserialize)]
    struct Ceiling {
        entries: f64,
        host_calls: f64,
    }

    #[test]
    fn counted_cost_stays_under_the_committed_ceilings() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/counted-ceilings.json");
        let text = std::fs::read_to_string(path).unwrap();
        let ceilings: BTreeMap<String, Ceiling> = serde_json::from_str(&text).unwrap();
        let counted = count_all(2_000);
        println!("{}", table(&counted));
        let mut over = Vec::new();
        for c in &counted {
            let Some(ceiling) = ceilings.get(&c.scenario) else {
                over.push(format!("{}: no ceiling in {path}", c.scenario));
                continue;
            };
            if c.entries > ceiling.entries + 1e-9 {
                over.push(format!(
                    "{}: {:.3} VM entries per request, ceiling {}",
                    c.scenario, c.entries, ceiling.entries
                ));
            }
            if c.host_calls > ceiling.host_calls + 1e-9 {
                over.push(format!(
                    "{}: {:.3} host calls per request, ceiling {}",
                    c.scenario, c.host_calls, ceiling.host_calls
                ));
            }
        }
        assert!(over.is_empty(), "{}", over.join("\n"));
    }

    /// The bridge-call floor makes weir-global-exact's call: the same headers to the same
    /// cluster, and the body weir sends byte for byte. A change to weir's body fails here:
    /// copy the new one into `bench/empty-filter/src/acquire.json`.
    #[test]
    fn the_bridge_call_floor_sends_what_weir_sends() {
        let trace = trace_call(Scenario::WeirGlobalExact).unwrap();
        let floor_body = include_str!("../empty-filter/src/acquire.json");
        assert_eq!(
            trace.call_body, floor_body,
            "weir's body changed: update bench/empty-filter/src/acquire.json"
        );
        let header = |name: &str| {
            trace
                .call_headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
                .unwrap_or_default()
        };
        // The empty filter sends these four, `:authority` the cluster's name.
        assert_eq!(trace.call_headers.len(), 4, "{:?}", trace.call_headers);
        assert_eq!(header(":method"), "POST");
        assert_eq!(header("content-type"), "application/json");
        assert_eq!(
            crate::scenario::BRIDGE_CALL_FLOOR,
            format!("call:{}:{}", header(":authority"), header(":path"))
        );
        assert!(weir_core::wire::v2::Request::parse(floor_body.as_bytes()).is_ok());
    }

    /// The page's reading of a bridge call (page/bridge_call.rs, `BRIDGE_CALL_READING`) walks
    /// through these calls: a change to them must change it too.
    #[test]
    fn an_exact_bridge_call_makes_the_host_calls_the_page_describes() {
        let trace = trace_call(Scenario::WeirGlobalExact).unwrap();
        let kinds = |i: usize| -> Vec<(&str, u64)> {
            trace.callbacks[i]
                .calls
                .iter()
                .map(|(k, n)| (k.as_str(), *n))
                .collect()
        };
        assert_eq!(
            kinds(0),
            // The bridge-down key is read by a worker's first call (then every 10 ms), and
            // the instant Envoy took a call of the plugin written (then every 10 ms). The
            // key's cached denials are not read: Redis last had units left for it (the
            // warm-up's answer; `LastAnswers`).
            [
                ("clock", 1),
                ("dispatch", 1),
                ("header", 1),
                ("shared_get", 1),
                ("shared_set", 1)
            ]
        );
        assert_eq!(
            kinds(1),
            // The answer's body (its status is not read when the body is the reply),
            // the switch into the request and its resume, and the latency stat (the
            // traced request is the first answer in a millisecond).
            [("body", 1), ("clock", 1), ("stats", 1), ("stream", 2)]
        );
        // 6 per request once a worker has read the bridge-down key and written the
        // instant of its last call (each at most every 10 ms), and the answer's clock
        // and latency stat read and recorded at most once a millisecond.
        let total: u64 = trace.callbacks.iter().flat_map(|c| c.calls.values()).sum();
        assert_eq!(total, 10);
        assert_eq!(trace.call_body.len(), 228);
    }

    #[test]
    fn the_half_limited_scenario_limits_half_and_the_others_none() {
        for c in count_all(1_000) {
            match c.scenario.as_str() {
                "weir-local-half-limited" => assert_eq!(c.limited, 500, "{c:?}"),
                "weir-global-saturated" => assert!(c.limited > 0, "{c:?}"),
                _ => assert_eq!(c.limited, 0, "{c:?}"),
            }
        }
    }
}
