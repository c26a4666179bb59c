//! A limit its keys share fairly (`share`, issue 36), in a real Envoy with two workers:
//! an organisation's 100 a second shared by its users, each named by the `sub` claim of
//! a token `jwt_authn` verified. One user offers 1,000 a second, nine offer 5 each: the
//! nine get all they ask, the heavy one the rest, and when it stops another heavy user
//! rises to the rest within one window; then the same across two Envoys through the
//! bridge and a Redis Cluster. Judged from Envoy's access log (what reached the
//! route, not what weir says of it): the parent's bound by `conformance::check`, every
//! user's floor by `share::check_floor`. The rule's gauges give its keys and share.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use weir_core::algorithms::{fixed_window::FixedWindow, GlobalLimit, Limit};
use weir_core::conformance::{check, Admission};
use weir_core::share::{check_floor, ShareLimit, ShareRequest};
use weir_e2e::decisions::{with_decisions, Logged, Logs};
use weir_e2e::global::GlobalStack;
use weir_e2e::jwt::{hs256, hs256_jwks};
use weir_e2e::{wasm_filter_yaml, weir_wasm, Bootstrap, Client, Envoy, Request};

const SECRET: &[u8] = b"weir-test-secret-of-32-bytes!!!!";
const SECOND_US: u64 = 1_000_000;

/// jwt_authn: a token required, its verified claims in metadata (`jwt_payload`).
fn jwt_authn() -> String {
    let jwks = hs256_jwks(SECRET);
    format!(
        r#"- name: envoy.filters.http.jwt_authn
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication
    providers:
      users:
        issuer: weir-test
        local_jwks: {{ inline_string: '{jwks}' }}
        payload_in_metadata: jwt_payload
    rules:
    - match: {{ prefix: "/" }}
      requires: {{ provider_name: users }}
"#
    )
}

/// The organisation from its claim, each user from `sub`.
const CONFIG: &str = r#"{"rules":[{"name":"per-org","stats":"detailed",
  "key":[{"jwt_claim":"org"}],
  "limit":{"algorithm":"fixed_window","limit":100,"window":"1s"},
  "share":{"by":[{"jwt_claim":"sub"}],"max_keys":64}}]}"#;

fn token(sub: &str) -> String {
    let payload = format!(r#"{{"iss":"weir-test","sub":"{sub}","org":"acme","exp":4102444800}}"#);
    format!("Bearer {}", hs256(SECRET, &payload))
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn sleep_until(at_us: u64) {
    let now = now_us();
    if at_us > now {
        std::thread::sleep(Duration::from_micros(at_us - now));
    }
}

/// Sends as user `sub` at each instant of `times` (µs since the epoch) on one connection.
fn offer(port: u16, sub: &str, times: Vec<u64>) {
    let auth = token(sub);
    let mut client = Client::connect(port).unwrap();
    for at in times {
        sleep_until(at);
        let request = Request::get("/")
            .header("authorization", &auth)
            .header("x-who", sub);
        let status = client.request(request).map(|r| r.status).unwrap_or(0);
        assert!(status == 200 || status == 429, "{sub}: {status}");
    }
}

/// Seven whole seconds from the next one, spread over `ports` (one lane each in turn):
/// heavy1 offers 1,000 a second for the first four (four lanes of 250), u1 (one of the
/// ten until then) for the last three; each light user u1…u9 asks at 20 ms × its number
/// past each 200 ms. Returns the run's first second.
fn offer_heavy_and_light(ports: &[u16]) -> u64 {
    let start = (now_us() / SECOND_US + 1) * SECOND_US;
    let port = |n: u64| ports[n as usize % ports.len()];
    std::thread::scope(|s| {
        for lane in 0..4u64 {
            let heavy = move |from: u64, to: u64| -> Vec<u64> {
                (from * 250..to * 250)
                    .map(|n| start + n * 4_000 + lane * 1_000 + 500)
                    .collect()
            };
            s.spawn(move || offer(port(lane), "heavy1", heavy(0, SWITCH)));
            s.spawn(move || offer(port(lane + 1), "u1", heavy(SWITCH, SECONDS)));
        }
        for user in 1..=9u64 {
            s.spawn(move || {
                let times = (0..SECONDS * 5)
                    .map(|n| start + n * 200_000 + user * 20_000)
                    .collect();
                offer(port(user), &format!("u{user}"), times)
            });
        }
    });
    start
}

const SECONDS: u64 = 7;
const SWITCH: u64 = 4;

/// Judges the run from every Envoy's access log: the parent's bound and every user's
/// floor, then the shares second by second.
fn judge(logs: &Logs, start: u64) {
    let lines = logs.read_until(|l| {
        l.iter().map(Vec::len).sum::<usize>() as u64 >= 9 * 5 * SECONDS + 1000 * SECONDS
    });
    let lines: Vec<&Logged> = lines.iter().flatten().collect();
    // Each request as the checker reads it: decided when weir (or Redis) says, admitted
    // when it reached the route.
    let mut requests: Vec<(String, ShareRequest)> = lines
        .iter()
        .filter_map(|line| {
            let decided = line.decision("per-org")?;
            let request = ShareRequest {
                at_us: decided.at_us,
                key: Some(key_of(&line.key)),
                weight: 1,
                cost: decided.cost,
                admitted: line.forwarded(),
            };
            Some((line.key.clone(), request))
        })
        .collect();
    requests.sort_by_key(|(_, r)| r.at_us);
    let admissions: Vec<Admission> = requests
        .iter()
        .filter(|(_, r)| r.admitted)
        .map(|(_, r)| Admission {
            at_us: r.at_us,
            cost: r.cost,
        })
        .collect();
    let parent = GlobalLimit::Slot(Limit::FixedWindow(
        FixedWindow::new(100, SECOND_US).unwrap(),
    ));
    check(&parent, &admissions).unwrap_or_else(|v| panic!("the parent's bound: {v}"));
    let limit = ShareLimit {
        limit: 100,
        window_us: SECOND_US,
        max_keys: 64,
    };
    let ordered: Vec<ShareRequest> = requests.iter().map(|(_, r)| *r).collect();
    check_floor(&limit, &ordered).unwrap_or_else(|s| panic!("a user's floor: {}", s.message));
    // Admitted per user and second of the run.
    let mut per_second: BTreeMap<(u64, &str), (u64, u64)> = BTreeMap::new();
    for (user, r) in &requests {
        let second = (r.at_us.saturating_sub(start)) / SECOND_US;
        let entry = per_second.entry((second, user.as_str())).or_default();
        entry.0 += 1;
        entry.1 += u64::from(r.admitted);
    }
    for ((second, user), (asked, admitted)) in &per_second {
        eprintln!("second {second} {user}: {admitted} of {asked}");
    }
    let admitted = |second: u64, user: &str| per_second.get(&(second, user)).map_or(0, |c| c.1);
    let asked = |second: u64, user: &str| per_second.get(&(second, user)).map_or(0, |c| c.0);
    // Seconds 1 to 3: the light users get all they ask; heavy1 the rest.
    for second in 1..SWITCH {
        for user in 1..=9 {
            let user = format!("u{user}");
            assert_eq!(
                admitted(second, &user),
                asked(second, &user),
                "{user} in second {second}"
            );
        }
        let light: u64 = (1..=9).map(|u| admitted(second, &format!("u{u}"))).sum();
        assert_eq!(
            admitted(second, "heavy1"),
            100 - light,
            "heavy1 in second {second}"
        );
    }
    // heavy1 stops; u1 offers 1,000 a second. The second after that, u1 is entitled to
    // all the eight others leave: the rest within one window. (A request of heavy1's sent
    // just before the switch may be decided just after it, by the clock that decides:
    // heavy1 is then entitled to what it asked in that second, held for it.)
    let others = (2..=9)
        .map(|u| admitted(SWITCH + 1, &format!("u{u}")))
        .sum::<u64>();
    let rest = 100 - others - asked(SWITCH, "heavy1");
    assert_eq!(
        admitted(SWITCH + 1, "u1"),
        rest,
        "u1 rises to the rest in one window"
    );
    assert!(rest >= 55, "{rest}");
}

#[test]
fn nine_light_users_get_all_they_ask_and_a_heavy_one_the_rest() {
    let config = with_decisions(CONFIG);
    let dir = tempfile::tempdir().unwrap();
    let logs = Logs::new(dir.path(), 1, "x-who");
    let bootstrap = Bootstrap::new()
        .http_filter(jwt_authn())
        .http_filter(wasm_filter_yaml(&config, &weir_wasm()));
    let envoy = Envoy::start(&logs.add_to(0, bootstrap), 2);
    let start = offer_heavy_and_light(&[envoy.http_port]);
    judge(&logs, start);
    assert!(envoy.weir_stat("rule.per-org.limited") > 0);
    // The gauges, from the last request: the nine users active in the second before it,
    // each entitled to at least ⌊100 / 9⌋.
    assert_eq!(envoy.weir_stat("rule.per-org.share_keys"), 9);
    assert_eq!(envoy.weir_stat("rule.per-org.share_units"), 11);
    assert_eq!(envoy.weir_stat("rule.per-org.share_untracked"), 0);
    envoy.assert_no_panic();
}

/// The same through the bridge and a Redis Cluster, each user's requests spread over two
/// Envoys: the parent's keys live in Redis, one quota for both.
#[test]
fn the_same_shares_across_two_envoys_through_the_bridge() {
    let global = CONFIG.replacen(
        r#""name":"per-org","#,
        r#""name":"per-org","scope":"global","#,
        1,
    );
    let global = global.replacen(
        "{",
        r#"{"bridge":{"cluster":"weir_bridge","timeout":"500ms"},"#,
        1,
    );
    let config = with_decisions(&global);
    let filters = format!("{}{}", jwt_authn(), wasm_filter_yaml(&config, &weir_wasm()));
    let stack = GlobalStack::start_filters(&[filters.clone(), filters], &[], "x-who");
    let start = offer_heavy_and_light(&stack.ports());
    judge(&stack.logs, start);
    assert!(stack.weir_stat("rule.per-org.bridge_decisions") > 7000);
    assert_eq!(stack.weir_stat("rule.per-org.failure_allowed"), 0);
    stack.assert_no_panic();
}

/// A user's name as the checker's key.
fn key_of(user: &str) -> u64 {
    user.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
