//! A limit its keys share fairly (`share`, issue 36), in a real Envoy with two workers:
//! an organisation's 100 a second shared by its users, each named by the `sub` claim of
//! a token `jwt_authn` verified. One user offers 1,000 a second, nine offer 5 each: the
//! nine get all they ask, the heavy one the rest, and when it stops another heavy user
//! rises to the rest within one window. Judged from Envoy's access log (what reached the
//! route, not what weir says of it): the parent's bound by `conformance::check`, every
//! user's floor by `share::check_floor`. The rule's gauges give its keys and share.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use weir_core::algorithms::{fixed_window::FixedWindow, GlobalLimit, Limit};
use weir_core::conformance::{check, Admission};
use weir_core::share::{check_floor, ShareLimit, ShareRequest};
use weir_e2e::decisions::{with_decisions, Logged, Logs};
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

#[test]
fn nine_light_users_get_all_they_ask_and_a_heavy_one_the_rest() {
    let config = with_decisions(CONFIG);
    let dir = tempfile::tempdir().unwrap();
    let logs = Logs::new(dir.path(), 1, "x-who");
    let bootstrap = Bootstrap::new()
        .http_filter(jwt_authn())
        .http_filter(wasm_filter_yaml(&config, &weir_wasm()));
    let envoy = Envoy::start(&logs.add_to(0, bootstrap), 2);
    let port = envoy.http_port;
    // Seven whole seconds from the next one: heavy1 offers 1,000 a second for the first
    // four (two connections at 500 each), heavy2 (one of the ten until then) for the
    // last three; each light user asks at 20 ms × its number past each 200 ms.
    let start = (now_us() / SECOND_US + 1) * SECOND_US;
    let (seconds, switch) = (7u64, 4u64);
    std::thread::scope(|s| {
        for lane in 0..2u64 {
            let heavy = move |from: u64, to: u64| -> Vec<u64> {
                (from * 500..to * 500)
                    .map(|n| start + n * 2_000 + lane * 1_000 + 500)
                    .collect()
            };
            s.spawn(move || offer(port, "heavy1", heavy(0, switch)));
            s.spawn(move || offer(port, "u1", heavy(switch, seconds)));
        }
        for user in 1..=9u64 {
            s.spawn(move || {
                let times = (0..seconds * 5)
                    .map(|n| start + n * 200_000 + user * 20_000)
                    .collect();
                offer(port, &format!("u{user}"), times)
            });
        }
    });
    let lines = logs.read_until(|l| l[0].len() as u64 >= 9 * 5 * seconds + 1000 * seconds);
    let lines: Vec<&Logged> = lines[0].iter().collect();
    // Each request as the checker reads it: decided when weir says, admitted when it
    // reached the route.
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
    // Seconds 1 to 3: the eight light users (u2…u9) and u1 get all they ask; heavy1 the
    // rest.
    for second in 1..switch {
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
    // all the eight others leave: the rest within one window.
    let rest = 100
        - (2..=9)
            .map(|u| admitted(switch + 1, &format!("u{u}")))
            .sum::<u64>();
    assert_eq!(
        admitted(switch + 1, "u1"),
        rest,
        "u1 rises to the rest in one window"
    );
    assert!(rest >= 55, "{rest}");
    assert!(envoy.weir_stat("rule.per-org.limited") > 0);
    // The gauges, from the last request: the nine users active in the second before it,
    // each entitled to at least ⌊100 / 9⌋.
    assert_eq!(envoy.weir_stat("rule.per-org.share_keys"), 9);
    assert_eq!(envoy.weir_stat("rule.per-org.share_units"), 11);
    assert_eq!(envoy.weir_stat("rule.per-org.share_untracked"), 0);
    envoy.assert_no_panic();
}

/// A user's name as the checker's key.
fn key_of(user: &str) -> u64 {
    user.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
