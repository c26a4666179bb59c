//! A shared limit's run in real Envoys (issue 36), for the e2e tests and `weir-bench
//! features`: an organisation's 100 a second shared by its users, each named by the `sub`
//! claim of a token `jwt_authn` verified. One user (`heavy1`) offers 1,000 a second and
//! nine (`u1`…`u9`) 5 each; at the switch `heavy1` stops and `u1` offers 1,000 a second.
//! [`ShareRun`] reads what happened from the access logs — what reached the route, not
//! what weir says of it — and judges it: the parent's bound (`conformance::check`) and
//! every user's floor (`share::check_floor`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use weir_core::algorithms::{fixed_window::FixedWindow, GlobalLimit, Limit};
use weir_core::conformance::{check, Admission};
use weir_core::filter::DELAY_HEADER;
use weir_core::share::{check_floor, check_floor_within, ShareLimit, ShareRequest};

use crate::decisions::{Logged, Logs};
use crate::jwt::{hs256, jwt_authn_filter};
use crate::{Client, Request};

const SECRET: &[u8] = b"weir-test-secret-of-32-bytes!!!!";
pub const SECOND_US: u64 = 1_000_000;
/// The parent's limit per second.
pub const LIMIT: u64 = 100;
/// The name of the rule, and the header each request names its user in for the log.
pub const RULE: &str = "per-org";
pub const WHO_HEADER: &str = "x-who";

/// jwt_authn: a token required, its verified claims in metadata (`jwt_payload`).
pub fn jwt_authn() -> String {
    jwt_authn_filter(SECRET, "users", "", false)
}

/// A rule's `scope` and the config's `bridge`, for a global rule; nothing for a local one.
fn scoped(global: bool) -> (&'static str, &'static str) {
    if global {
        (
            r#""scope":"global","#,
            r#""bridge":{"cluster":"weir_bridge","timeout":"500ms"},"#,
        )
    } else {
        ("", "")
    }
}

/// The organisation's rule: keyed by its claim, shared by `sub` when `shared`, local or
/// global (with the bridge's cluster).
pub fn config(shared: bool, global: bool) -> String {
    let share = if shared {
        r#","share":{"by":[{"jwt_claim":"sub"}],"max_keys":64}"#
    } else {
        ""
    };
    let (scope, bridge) = scoped(global);
    format!(
        r#"{{{bridge}"rules":[{{"name":"{RULE}",{scope}"stats":"detailed",
  "key":[{{"jwt_claim":"org"}}],
  "limit":{{"algorithm":"fixed_window","limit":{LIMIT},"window":"1s"}}{share}}}]}}"#
    )
}

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

/// Sends as user `sub` at each instant of `times` (µs since the epoch) on one connection,
/// each request built by `request` and carrying `sub`'s token (one after another: a
/// request held delays the next). Returns how many were answered.
fn offer(port: u16, sub: &str, times: Vec<u64>, request: impl Fn() -> Request) -> u64 {
    offer_until(port, sub, times, u64::MAX, request)
}

/// [`offer`], sending nothing once `end_us` has passed (a lane held back by held
/// requests does not catch up after the run).
fn offer_until(
    port: u16,
    sub: &str,
    times: Vec<u64>,
    end_us: u64,
    request: impl Fn() -> Request,
) -> u64 {
    let auth = token(sub);
    let Ok(mut client) = Client::connect(port) else {
        return 0;
    };
    let mut answered = 0;
    for at in times {
        sleep_until(at);
        if now_us() >= end_us {
            break;
        }
        let status = client
            .request(request().header("authorization", &auth))
            .map(|r| r.status)
            .unwrap_or(0);
        assert!(status == 200 || status == 429, "{sub}: {status}");
        answered += 1;
    }
    answered
}

/// A request of the heavy-and-light run, naming `sub` for the log.
fn plain(sub: &str) -> impl Fn() -> Request + '_ {
    move || Request::get("/").header(WHO_HEADER, sub)
}

/// The run's phases: whole seconds from the next one, `heavy1` heavy until `switch`, `u1`
/// after it.
#[derive(Debug, Clone, Copy)]
pub struct Phases {
    pub seconds: u64,
    pub switch: u64,
}

/// Offers the run over `ports` (one lane each in turn): the heavy user in four lanes of
/// 250 a second, each light user `n` at 20 ms × `n` past each 200 ms. Returns the run's
/// first second (µs since the epoch).
pub fn offer_heavy_and_light(ports: &[u16], phases: Phases) -> u64 {
    let Phases { seconds, switch } = phases;
    let start = (now_us() / SECOND_US + 1) * SECOND_US;
    let port = |n: u64| lane(ports, n);
    std::thread::scope(|s| {
        for lane in 0..4u64 {
            let heavy = move |from: u64, to: u64| -> Vec<u64> {
                (from * 250..to * 250)
                    .map(|n| start + n * 4_000 + lane * 1_000 + 500)
                    .collect()
            };
            s.spawn(move || offer(port(lane), "heavy1", heavy(0, switch), plain("heavy1")));
            s.spawn(move || offer(port(lane + 1), "u1", heavy(switch, seconds), plain("u1")));
        }
        for user in 1..=9u64 {
            s.spawn(move || {
                let times = (0..seconds * 5)
                    .map(|n| start + n * 200_000 + user * 20_000)
                    .collect();
                let sub = format!("u{user}");
                offer(port(user), &sub, times, plain(&sub))
            });
        }
    });
    start
}

/// The organisation's shared rule, local, holding what it would deny for up to a second
/// (`on_limit.delay`, 100 requests a worker).
pub fn delayed_config() -> String {
    config(true, false).replacen(
        r#","share":"#,
        r#","on_limit":{"delay":{"max":"1s","queue":100}},"share":"#,
        1,
    )
}

/// Access logs keyed by the user and how long weir held the request (`-` when it did
/// not), for [`ShareRun::read_delayed`].
pub fn delayed_logs(dir: &std::path::Path) -> Logs {
    Logs::keyed(
        dir,
        1,
        &format!("%REQ({WHO_HEADER})% %RESP({DELAY_HEADER})%"),
    )
}

/// Offers a run of `seconds` to `port`: the heavy user in four lanes of 250 a second,
/// one request after another (a held request holds its lane), and each light user `n`
/// at 20 ms × `n` past each 200 ms, each request on a connection of its own (a held
/// request holds back none of its user's next). Returns the run's first second and how
/// many requests were answered.
pub fn offer_heavy_and_open_light(port: u16, seconds: u64) -> (u64, u64) {
    let start = (now_us() / SECOND_US + 1) * SECOND_US;
    let answered = std::thread::scope(|s| {
        let mut sends = Vec::new();
        for lane in 0..4u64 {
            let times = (0..seconds * 250)
                .map(|n| start + n * 4_000 + lane * 1_000 + 500)
                .collect();
            let end = start + seconds * SECOND_US;
            sends.push(s.spawn(move || offer_until(port, "heavy1", times, end, plain("heavy1"))));
        }
        for user in 1..=9u64 {
            for n in 0..seconds * 5 {
                let at = start + n * 200_000 + user * 20_000;
                sends.push(s.spawn(move || {
                    let sub = format!("u{user}");
                    offer(port, &sub, vec![at], plain(&sub))
                }));
            }
        }
        sends.into_iter().map(|send| send.join().unwrap_or(0)).sum()
    });
    (start, answered)
}

/// What a run did, read from the access logs.
pub struct ShareRun {
    pub start_us: u64,
    pub phases: Phases,
    /// Every request the rule decided, by the time it was decided: (user, request).
    pub requests: Vec<(String, ShareRequest)>,
    /// (asked, admitted) per (second of the run, user).
    pub per_second: BTreeMap<(u64, String), (u64, u64)>,
    /// Requests weir held, then released: (user, when released, ms waited).
    pub held: Vec<(String, u64, u64)>,
}

impl ShareRun {
    /// Reads the run from `logs` once its requests are there (or after 5 s).
    pub fn read(logs: &Logs, start_us: u64, phases: Phases) -> ShareRun {
        let expected = (9 * 5 + 1000) * phases.seconds;
        let lines = logs.read_until(|l| l.iter().map(Vec::len).sum::<usize>() as u64 >= expected);
        let lines: Vec<&Logged> = lines.iter().flatten().collect();
        let requests: Vec<(String, ShareRequest)> = lines
            .iter()
            .filter_map(|line| Some((line.key.clone(), decided(line, &line.key)?)))
            .collect();
        ShareRun::of(requests, Vec::new(), start_us, phases)
    }

    /// Reads a run of a rule that holds what it would deny from [`delayed_logs`], once
    /// `answered` requests are there. The log gives a held request's last decision, at
    /// its release; its hold was an ask too, of the window before (a hold lasts to its
    /// window's end, and a delay of at most a window holds a request once): it is put at
    /// that window's end, not admitted.
    pub fn read_delayed(logs: &Logs, start_us: u64, seconds: u64, answered: u64) -> ShareRun {
        let lines = logs.read_until(|l| l.iter().map(Vec::len).sum::<usize>() as u64 >= answered);
        let mut requests = Vec::new();
        let mut held = Vec::new();
        for line in lines.iter().flatten() {
            let (who, waited) = line.key.split_once(' ').unwrap_or((&line.key, "-"));
            let Some(request) = decided(line, who) else {
                continue;
            };
            if let Ok(ms) = waited.parse::<u64>() {
                held.push((who.to_string(), request.at_us, ms));
                let window_start = request.at_us - request.at_us % SECOND_US;
                requests.push((
                    who.to_string(),
                    ShareRequest {
                        at_us: window_start - 1,
                        admitted: false,
                        ..request
                    },
                ));
            }
            requests.push((who.to_string(), request));
        }
        let phases = Phases {
            seconds,
            switch: seconds,
        };
        ShareRun::of(requests, held, start_us, phases)
    }

    fn of(
        mut requests: Vec<(String, ShareRequest)>,
        held: Vec<(String, u64, u64)>,
        start_us: u64,
        phases: Phases,
    ) -> ShareRun {
        requests.sort_by_key(|(_, r)| r.at_us);
        let mut per_second: BTreeMap<(u64, String), (u64, u64)> = BTreeMap::new();
        for (user, r) in &requests {
            let second = r.at_us.saturating_sub(start_us) / SECOND_US;
            let entry = per_second.entry((second, user.clone())).or_default();
            entry.0 += 1;
            entry.1 += u64::from(r.admitted);
        }
        ShareRun {
            start_us,
            phases,
            requests,
            per_second,
            held,
        }
    }

    pub fn admitted(&self, second: u64, user: &str) -> u64 {
        self.per_second
            .get(&(second, user.to_string()))
            .map_or(0, |c| c.1)
    }

    pub fn asked(&self, second: u64, user: &str) -> u64 {
        self.per_second
            .get(&(second, user.to_string()))
            .map_or(0, |c| c.0)
    }

    /// What the eight light users u2…u9 were admitted in `second`.
    pub fn light(&self, second: u64) -> u64 {
        (2..=9)
            .map(|u| self.admitted(second, &format!("u{u}")))
            .sum()
    }

    /// The parent's bound over every admission: `Err` with the violation.
    pub fn parent_bound(&self) -> Result<usize, String> {
        let admissions: Vec<Admission> = self
            .requests
            .iter()
            .filter(|(_, r)| r.admitted)
            .map(|(_, r)| Admission {
                at_us: r.at_us,
                cost: r.cost,
            })
            .collect();
        let parent = GlobalLimit::Slot(Limit::FixedWindow(
            FixedWindow::new(LIMIT, SECOND_US).map_err(|e| e.reason)?,
        ));
        check(&parent, &admissions).map_err(|v| v.to_string())?;
        Ok(admissions.len())
    }

    /// Every user's floor, in the order the requests were decided.
    pub fn floor(&self) -> Result<(), String> {
        self.floor_within(0)
    }

    /// [`ShareRun::floor`], each floor less `tolerance` units (leases held elsewhere).
    pub fn floor_within(&self, tolerance: u64) -> Result<(), String> {
        let limit = ShareLimit {
            limit: LIMIT,
            window_us: SECOND_US,
            max_keys: 64,
        };
        let ordered: Vec<ShareRequest> = self.requests.iter().map(|(_, r)| *r).collect();
        check_floor_within(&limit, &ordered, tolerance).map_err(|s| s.message)
    }
}

/// Lane `n`'s port: the ports in turn.
fn lane(ports: &[u16], n: u64) -> u16 {
    ports
        .get(n as usize % ports.len().max(1))
        .copied()
        .unwrap_or(0)
}

/// A logged request as the checker reads it, by `who`: decided when weir (or Redis)
/// says, admitted when it reached the route. `None` when the rule did not decide it.
fn decided(line: &Logged, who: &str) -> Option<ShareRequest> {
    let decided = line.decision(RULE)?;
    Some(ShareRequest {
        at_us: decided.at_us,
        key: Some(key_of(who)),
        weight: 1,
        cost: decided.cost,
        admitted: line.forwarded(),
    })
}

/// A user's name as the checker's key.
fn key_of(user: &str) -> u64 {
    user.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A team's token budget of [`TOKENS`] a second shared by its members (`commit`): each
/// request counted at its estimate (`x-estimate`) and settled with what the stand-in LLM
/// says it used (`x-tokens-used`).
pub fn token_config(global: bool) -> String {
    let (scope, bridge) = scoped(global);
    format!(
        r#"{{{bridge}"rules":[{{"name":"{RULE}",{scope}"stats":"detailed",
  "key":[{{"jwt_claim":"org"}}],
  "cost":{{"header":"x-estimate","max":{TOKENS}}},"commit":{{"header":"x-tokens-used"}},
  "limit":{{"algorithm":"fixed_window","limit":{TOKENS},"window":"1s"}},
  "share":{{"by":[{{"jwt_claim":"sub"}}],"max_keys":64}}}}]}}"#
    )
}

/// The team's tokens a second.
pub const TOKENS: u64 = 1000;

/// Offers the token run over `ports` for `seconds` whole seconds from the next one: the
/// heavy member a request every 5 ms estimated at 50 tokens that uses 10, each of the nine
/// others two a second estimated at 25 that use 12. Each request names its member and
/// what it will use in [`WHO_HEADER`] (`member/used`). Returns the first second.
pub fn offer_tokens(ports: &[u16], seconds: u64) -> u64 {
    let start = (now_us() / SECOND_US + 1) * SECOND_US;
    let port = |n: u64| lane(ports, n);
    let send = move |port: u16, sub: String, times: Vec<u64>, estimate: u64, used: u64| {
        let who = format!("{sub}/{used}");
        let request = || {
            Request::get("/v1/chat")
                .header(WHO_HEADER, &who)
                .header("x-estimate", estimate.to_string())
                .header("x-llm-format", "header")
                .header("x-llm-usage", used.to_string())
        };
        offer(port, &sub, times, request)
    };
    std::thread::scope(|s| {
        for lane in 0..2u64 {
            let times = (0..seconds * 100)
                .map(|n| start + n * 10_000 + lane * 5_000 + 700)
                .collect();
            s.spawn(move || send(port(lane), "heavy1".into(), times, 50, 10));
        }
        for user in 1..=9u64 {
            let times = (0..seconds * 2)
                .map(|n| start + n * 500_000 + user * 20_000)
                .collect();
            s.spawn(move || send(port(user), format!("u{user}"), times, 25, 12));
        }
    });
    start
}

/// What a token run did: per (second, member), (requests, admitted, tokens used); and
/// the checker's verdicts — the budget's bound at what responses used, every member's
/// floor in estimates.
pub struct TokenRun {
    pub per_second: BTreeMap<(u64, String), (u64, u64, u64)>,
    pub parent_bound: Result<u64, String>,
    pub floor: Result<(), String>,
}

impl TokenRun {
    pub fn read(logs: &Logs, start_us: u64, seconds: u64) -> TokenRun {
        let expected = (9 * 2 + 200) * seconds;
        let lines = logs.read_until(|l| l.iter().map(Vec::len).sum::<usize>() as u64 >= expected);
        let mut requests: Vec<(String, u64, ShareRequest)> = lines
            .iter()
            .flatten()
            .filter_map(|line| {
                let (who, used) = line.key.split_once('/')?;
                Some((who.to_string(), used.parse().ok()?, decided(line, who)?))
            })
            .collect();
        requests.sort_by_key(|(_, _, r)| r.at_us);
        let mut per_second: BTreeMap<(u64, String), (u64, u64, u64)> = BTreeMap::new();
        let mut admissions = Vec::new();
        for (who, used, r) in &requests {
            let second = r.at_us.saturating_sub(start_us) / SECOND_US;
            let entry = per_second.entry((second, who.clone())).or_default();
            entry.0 += 1;
            if r.admitted {
                entry.1 += 1;
                entry.2 += used;
                admissions.push(Admission {
                    at_us: r.at_us,
                    cost: *used,
                });
            }
        }
        let parent_bound = FixedWindow::new(TOKENS, SECOND_US)
            .map_err(|e| e.reason)
            .and_then(|w| {
                check(&GlobalLimit::Slot(Limit::FixedWindow(w)), &admissions)
                    .map_err(|v| v.to_string())
            })
            .map(|()| admissions.iter().map(|a| a.cost).sum());
        let limit = ShareLimit {
            limit: TOKENS,
            window_us: SECOND_US,
            max_keys: 64,
        };
        let ordered: Vec<ShareRequest> = requests.iter().map(|(_, _, r)| *r).collect();
        let floor = check_floor(&limit, &ordered).map_err(|s| s.message);
        TokenRun {
            per_second,
            parent_bound,
            floor,
        }
    }

    /// (requests, admitted, tokens used) of `who` in `second`.
    pub fn of(&self, second: u64, who: &str) -> (u64, u64, u64) {
        self.per_second
            .get(&(second, who.to_string()))
            .copied()
            .unwrap_or_default()
    }
}
