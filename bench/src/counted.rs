//! Counted cost: each weir scenario's plugin configuration run on a scripted Envoy
//! (`weir_core::filter::scripted`) with the scenario's traffic, counting what crosses the
//! VM's boundary per request — callbacks Envoy makes into the VM, and calls the VM makes
//! into Envoy, by kind. These counts come out the same on any machine (the scripted host
//! makes the callbacks real Envoy makes for a request answered by the benchmark's direct
//! response, body included, and answers bridge calls from weir-bridge's model at once), so CI holds them to committed
//! ceilings (`bench/counted-ceilings.json`) where a time could only flake. Real Envoy's
//! own counts of the same stats (`vm.entries`, `vm.calls.<kind>`) are in a full run's
//! results.

use std::collections::BTreeMap;

use weir_core::filter::host::{BoundaryCounts, CallKind, Host};
use weir_core::filter::scripted_envoy::Envoy;
use weir_core::filter::Action;
use weir_core::simulation::ModelBridge;

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
        envoy.advance_us(SPACING_US);
        if envoy.now_us() >= next_tick {
            let root = envoy.root;
            envoy.tick(root);
            next_tick += TICK_US;
        }
        let owned = headers(scenario.traffic(), n);
        let pairs: Vec<(&str, &str)> = owned
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let (context, action) = envoy.request(&pairs);
        if action == Action::Pause {
            for call in envoy.open_calls() {
                let now = envoy.now_us();
                match bridge.acquire(&call.body, now) {
                    Ok(reply) => envoy.answer(
                        call.token,
                        200,
                        &serde_json::to_vec(&reply).unwrap_or_default(),
                    ),
                    Err((status, body)) => envoy.answer(call.token, status, body.as_bytes()),
                }
            }
        }
        let answered_here = envoy.stream(context).and_then(|s| s.local_reply).is_some();
        if answered_here {
            if n >= WARM_UP {
                limited += 1;
            }
            envoy.deliver_local_reply(context);
        } else {
            envoy.respond(context, 200, &[], weir_e2e::envoy::DEFAULT_BODY.as_bytes());
        }
        envoy.close(context);
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

/// Every weir scenario of the default run, counted. A slowed scenario
/// ([`Scenario::slowed`]) is left out: the scripted bridge answers at once, so it would
/// count what its unslowed twin counts.
pub fn count_all(requests: u64) -> Vec<Counted> {
    Scenario::ALL
        .iter()
        .filter(|s| s.slowed().is_none())
        .filter_map(|&s| count(s, requests))
        .collect()
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
