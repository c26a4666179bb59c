//! What the two searches (`search.rs`, local; `search_global.rs`) share: how many cases
//! from which seed, log-uniform draws, a random limit over the whole range the config
//! accepts, and a schedule of bursts and idle gaps.
#![allow(dead_code)]

use super::{user, FakeRequest, Rng, T0};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use weir_core::algorithms::{AlgorithmKind, AlgorithmSpec, GlobalLimit, Unit};
use weir_core::config;
use weir_core::conformance::{self, Admission, Violation};
use weir_core::engine::{Engine, BRIDGE_BACKOFF_US};
use weir_testkit::simulation::with_extra_bursts;

pub const MS: u64 = 1_000;
/// The longest reservoir hold the config accepts (1 min).
pub const MAX_RESERVOIR_HOLD_US: u64 = 60 * S;
pub const S: u64 = 1_000_000;

pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The seeds of one search: `WEIR_SEARCH_SEED..+WEIR_SEARCH_CASES`.
pub fn seeds(default_cases: u64) -> std::ops::Range<u64> {
    let from = env_u64("WEIR_SEARCH_SEED", 1);
    from..from + env_u64("WEIR_SEARCH_CASES", default_cases)
}

/// A number drawn log-uniformly from `lo..=hi` (every order of magnitude as likely), so
/// that 3 and 37,911 are drawn as often as 100.
pub fn log_uniform(rng: &mut Rng, lo: u64, hi: u64) -> u64 {
    let (lo_f, hi_f) = ((lo.max(1)) as f64, (hi.max(lo.max(1))) as f64);
    let unit = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
    let x = (lo_f.ln() + unit * (hi_f.ln() - lo_f.ln())).exp();
    (x as u64).clamp(lo, hi)
}

pub fn chance(rng: &mut Rng, one_in: u64) -> bool {
    rng.below(one_in) == 0
}

/// A limit, drawn: its JSON, its units per second (about), and its largest cost.
pub struct DrawnLimit {
    pub json: String,
    pub name: &'static str,
    pub per_s: f64,
    pub max_cost: u64,
    /// The time scale of the limit (period or window), µs.
    pub scale_us: u64,
}

/// What the algorithm called `name` can do.
pub fn spec_of(name: &str) -> &'static AlgorithmSpec {
    AlgorithmKind::from_name(name).unwrap().spec()
}

/// The algorithms the search drew from before it drew from [`AlgorithmKind::ALL`], by
/// config name (names never change), in the order it drew them: the history of the draw.
/// A seed's first draw picks one of these exactly as before, so every seed found before
/// still draws its case. A new algorithm is never added here: [`draw_kind`] gives it its
/// share from a generator of its own. Reordering or removing one changes every seed.
const DRAWN_BEFORE: [&str; 5] = [
    "gcra",
    "token_bucket",
    "fixed_window",
    "sliding_window",
    "sliding_log",
];

/// Where a drawn limit runs, so which algorithms it may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// A local rule: only the algorithms whose state fits a slot.
    Local,
    /// A global rule: any algorithm.
    Global,
}

/// The algorithm of a limit that runs in `scope`. `rng` picks one of [`DRAWN_BEFORE`]
/// that runs there, as it always did. With `n` of those and `k` algorithms of
/// [`AlgorithmKind::ALL`] added since, `added` replaces the pick by one of the added with
/// probability `k/(n+k)`, so that each gets about an equal share and only the cases
/// replaced change; `added` is not drawn from while nothing was added (`k = 0`), and
/// `added: None` keeps the pick (a kept seed's case as it was found).
fn draw_kind(rng: &mut Rng, added: Option<&mut Rng>, scope: Scope) -> AlgorithmKind {
    let runs_here =
        |kind: &AlgorithmKind| scope == Scope::Global || kind.spec().global_only.is_none();
    let history: Vec<AlgorithmKind> = DRAWN_BEFORE
        .iter()
        .map(|name| AlgorithmKind::from_name(name).unwrap())
        .filter(runs_here)
        .collect();
    let picked = history[rng.below(history.len() as u64) as usize];
    let since: Vec<AlgorithmKind> = AlgorithmKind::ALL
        .into_iter()
        .filter(|kind| runs_here(kind) && !history.contains(kind))
        .collect();
    match added {
        Some(added) if !since.is_empty() => {
            let at = added.below((history.len() + since.len()) as u64) as usize;
            since.get(at).copied().unwrap_or(picked)
        }
        _ => picked,
    }
}

/// A limit that runs in `scope`, its algorithm drawn by [`draw_kind`]. The algorithms of
/// the history keep the draws they had (seeds replay them); any other is drawn from its
/// parameter table ([`draw_from_spec`]), with no arm of its own.
pub fn draw_limit(rng: &mut Rng, added: Option<&mut Rng>, scope: Scope) -> DrawnLimit {
    let kind = draw_kind(rng, added, scope);
    let name = kind.name();
    // A period or window from 1 ms to 1 min, any µs count.
    let scale_us = log_uniform(rng, MS, 60 * S);
    if !DRAWN_BEFORE.contains(&name) {
        return draw_from_spec(rng, kind, scale_us);
    }
    match kind {
        AlgorithmKind::Gcra => {
            let rate = log_uniform(rng, 1, 5_000);
            let burst = if chance(rng, 4) {
                0
            } else {
                log_uniform(rng, 1, 300)
            };
            DrawnLimit {
                json: format!(
                    r#"{{"algorithm":"gcra","rate":{rate},"period":"{scale_us}us","burst":{burst}}}"#
                ),
                name,
                per_s: rate as f64 * S as f64 / scale_us as f64,
                max_cost: burst + 1,
                scale_us,
            }
        }
        AlgorithmKind::TokenBucket => {
            let capacity = log_uniform(rng, 1, 2_000);
            let refill = if chance(rng, 3) {
                capacity
            } else {
                log_uniform(rng, 1, capacity.saturating_mul(2))
            };
            DrawnLimit {
                json: format!(
                    r#"{{"algorithm":"token_bucket","capacity":{capacity},"refill":{refill},"period":"{scale_us}us"}}"#
                ),
                name,
                per_s: refill.min(capacity) as f64 * S as f64 / scale_us as f64,
                max_cost: capacity,
                scale_us,
            }
        }
        // The rest of the history are windows: a `limit` per `window`.
        _ => {
            let limit = log_uniform(rng, 1, 2_000);
            DrawnLimit {
                json: format!(
                    r#"{{"algorithm":"{name}","limit":{limit},"window":"{scale_us}us"}}"#
                ),
                name,
                per_s: limit as f64 * S as f64 / scale_us as f64,
                max_cost: limit,
                scale_us,
            }
        }
    }
}

/// A limit of `kind` written from its parameter table alone, so that an algorithm added
/// after the history is drawn with no arm of its own: every count log-uniform from 1 to
/// 2,000 (the range of the history's limits and capacities), the first duration
/// `scale_us`, any other from the same 1 ms .. 1 min. Its pace and largest cost are asked
/// of the limit the values build; values it refuses are left for the config check to
/// refuse (the search counts refusals and fails when they are many).
pub fn draw_from_spec(rng: &mut Rng, kind: AlgorithmKind, scale_us: u64) -> DrawnLimit {
    let spec = kind.spec();
    let mut json = format!(r#"{{"algorithm":"{}""#, spec.name);
    let mut values = Vec::new();
    let mut scale = Some(scale_us);
    for parameter in spec.parameters {
        let value = match parameter.unit {
            Unit::Count => {
                let count = log_uniform(rng, 1, 2_000);
                write!(json, r#","{}":{count}"#, parameter.name).unwrap();
                count
            }
            Unit::Duration => {
                let us = scale.take().unwrap_or_else(|| log_uniform(rng, MS, 60 * S));
                write!(json, r#","{}":"{us}us""#, parameter.name).unwrap();
                us
            }
        };
        values.push(value);
    }
    json.push('}');
    let (per_s, max_cost) = match GlobalLimit::build(kind, &values) {
        Ok(limit) => {
            let policy = limit.policy();
            let per_s = policy.quota as f64 * 1e9 / policy.window_ns.max(1) as f64;
            (per_s, limit.max_cost())
        }
        Err(_) => (S as f64 / scale_us as f64, 1),
    };
    DrawnLimit {
        json,
        name: spec.name,
        per_s,
        max_cost,
        scale_us,
    }
}

/// One request of a schedule.
#[derive(Clone, Debug)]
pub struct Request {
    pub at_us: u64,
    /// A worker (local) or an Envoy (global).
    pub at: usize,
    pub user: usize,
    /// Its cost, or its estimate when the rule commits.
    pub cost: u64,
    /// What it really costs (commit): the usage its response reports.
    pub actual: u64,
    /// How long its response takes, µs.
    pub duration_us: u64,
}

/// A schedule of bursts, steady stretches and idle gaps around the limit's rate, at most
/// `max_requests` long.
#[allow(clippy::too_many_arguments)]
pub fn draw_schedule(
    rng: &mut Rng,
    limit: &DrawnLimit,
    places: usize,
    users: usize,
    max_requests: usize,
    cost_max: u64,
    lying: bool,
) -> Vec<Request> {
    let mut out = Vec::new();
    let mut at = T0 + rng.below(limit.scale_us.max(1));
    while out.len() < max_requests {
        match rng.below(4) {
            // Idle: from a sliver of the period to several of them.
            0 => at += log_uniform(rng, 1, limit.scale_us.saturating_mul(4)),
            // A burst: many requests within a few µs.
            1 => {
                for _ in 0..log_uniform(rng, 2, 200) {
                    at += rng.below(3);
                    out.push(draw_request(rng, at, places, users, cost_max, lying, limit));
                }
            }
            // Steady at 0.1× to 30× the rate.
            _ => {
                let factor = log_uniform(rng, 1, 300) as f64 / 10.0;
                let gap_us = (S as f64 / (limit.per_s * factor)).max(1.0);
                for _ in 0..log_uniform(rng, 5, 400) {
                    at += 1 + rng.below((2.0 * gap_us) as u64 + 1);
                    out.push(draw_request(rng, at, places, users, cost_max, lying, limit));
                }
            }
        }
    }
    out.truncate(max_requests);
    out
}

pub fn draw_request(
    rng: &mut Rng,
    at_us: u64,
    places: usize,
    users: usize,
    cost_max: u64,
    lying: bool,
    limit: &DrawnLimit,
) -> Request {
    let cost = if cost_max <= 1 || chance(rng, 2) {
        1
    } else {
        1 + rng.below(cost_max)
    };
    let actual = if lying {
        cost.saturating_add(rng.below(cost.saturating_mul(2) + 1))
    } else {
        rng.below(cost + 1)
    };
    Request {
        at_us,
        at: rng.below(places as u64) as usize,
        user: rng.below(users as u64) as usize,
        cost,
        actual,
        duration_us: rng.below(limit.scale_us.saturating_mul(3) + 1),
    }
}

/// The engine of a drawn config, or `None` when the config check refuses it (a
/// combination no user can write: the search counts them).
pub fn accepted(json: &str) -> Option<Engine> {
    match config::parse(json.as_bytes()) {
        Ok(c) => Some(Engine::new(c)),
        Err(e) => {
            if std::env::var("WEIR_SEARCH_REFUSED").is_ok() {
                println!("refused: {e}");
            }
            None
        }
    }
}
pub fn request_of(r: &Request) -> FakeRequest {
    let request = user(&format!("u{}", r.user))
        .header("x-cost", r.cost.to_string())
        .header("x-tokens", r.actual.to_string());
    match stated_deadline(r) {
        Some((header, value, _)) => request.header(header, value),
        None => request,
    }
}

/// The deadline a request states, if any: the header, its value and the timeout in µs.
/// A quarter of the requests state none, half `grpc-timeout` (in µs or ms), a quarter
/// `x-envoy-expected-rq-timeout-ms`, from 0 to about a second. Drawn from the request's
/// arrival and user, not the schedule's generator, so schedules (and the seeds the search
/// found) stay what they were.
pub fn stated_deadline(r: &Request) -> Option<(&'static str, String, u64)> {
    let mut z = (r.at_us ^ ((r.user as u64) << 48)).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    // Log-uniform up to 2^20 µs.
    let magnitude = 1u64 << ((z >> 8) % 21);
    let timeout_us = magnitude + (z >> 16) % magnitude;
    match z % 4 {
        0 => Some(("grpc-timeout", format!("{timeout_us}u"), timeout_us)),
        1 => {
            let ms = timeout_us / 1_000;
            Some(("grpc-timeout", format!("{ms}m"), ms * 1_000))
        }
        2 => {
            let ms = timeout_us / 1_000;
            Some(("x-envoy-expected-rq-timeout-ms", ms.to_string(), ms * 1_000))
        }
        _ => None,
    }
}

/// The first key whose admissions break `limit`'s bound.
pub fn violation(
    limit: &GlobalLimit,
    admissions: &BTreeMap<usize, Vec<Admission>>,
) -> Option<(usize, Violation)> {
    admissions.iter().find_map(|(user, a)| {
        let mut a = a.clone();
        a.sort_by_key(|a| a.at_us);
        conformance::check(limit, &a).err().map(|v| (*user, v))
    })
}

/// The trusted header a drawn tenant's limit is read from.
pub const TENANT_HEADER: &str = "x-tenant-limit";

/// A tenant's own limit (issue 36): one count parameter of the rule's limit read from
/// [`TENANT_HEADER`], its value per user changing from one stretch of the run to the next
/// (`min`, `default`, `max`, one in between, or 1 in 16 not a number).
#[derive(Clone, Debug)]
pub struct TenantLimit {
    /// The parameter's index in the algorithm's table.
    pub parameter: usize,
    pub min: u64,
    pub default: u64,
    pub max: u64,
    pub stretch_us: u64,
    pub salt: u64,
}

impl TenantLimit {
    /// Reads one count parameter of `limit` (drawn as `"name":value`) from the header,
    /// around its drawn value: `None` when the limit has none to read.
    pub fn draw(rng: &mut Rng, limit: &mut DrawnLimit, span_us: u64) -> Option<TenantLimit> {
        let spec = spec_of(limit.name);
        let counts: Vec<usize> = (0..spec.parameters.len())
            .filter(|&i| spec.parameters[i].unit == Unit::Count)
            .collect();
        let parameter = counts[rng.below(counts.len() as u64) as usize];
        let name = spec.parameters[parameter].name;
        let field = format!(r#""{name}":"#);
        let at = limit.json.find(&field)? + field.len();
        let digits = limit.json[at..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        let default: u64 = limit.json[at..at + digits]
            .parse()
            .ok()
            .filter(|&v| v > 0)?;
        let min = log_uniform(rng, 1, default);
        let max = log_uniform(rng, default, default.saturating_mul(8));
        let from = format!(
            r#"{{"header":"{TENANT_HEADER}","default":{default},"min":{min},"max":{max}}}"#
        );
        limit.json.replace_range(at..at + digits, &from);
        Some(TenantLimit {
            parameter,
            min,
            default,
            max,
            stretch_us: (span_us / (1 + rng.below(6))).max(1),
            salt: rng.next(),
        })
    }

    /// The header value request `r` sends.
    pub fn value(&self, r: &Request) -> String {
        let stretch = r.at_us.saturating_sub(T0) / self.stretch_us;
        let mut z = Rng(self.salt ^ ((r.user as u64) << 40) ^ stretch.wrapping_mul(0x9e37_79b9));
        match z.below(16) {
            0 => "many".to_string(),
            1..=4 => self.min.to_string(),
            5..=8 => self.default.to_string(),
            9..=12 => self.max.to_string(),
            _ => (self.min + z.below(self.max - self.min + 1)).to_string(),
        }
    }

    /// The limit request `r` carries under `configured` (the rule's limit with its
    /// default), as docs/configuration.md says weir reads it: a whole number clamped to
    /// `min..=max`, else the default; values that build no limit, the configured one.
    pub fn carried(&self, configured: &GlobalLimit, r: &Request) -> GlobalLimit {
        let value = self
            .value(r)
            .parse::<u64>()
            .map_or(self.default, |v| v.clamp(self.min, self.max));
        let mut values = configured.algorithm().parameters();
        values[self.parameter] = value;
        GlobalLimit::build(configured.kind(), &values).unwrap_or_else(|_| configured.clone())
    }
}

/// What request `r` sends: its user, cost and usage ([`request_of`]), and its tenant's
/// limit when the case draws one.
pub fn request_with(tenant: Option<&TenantLimit>, r: &Request) -> FakeRequest {
    let request = request_of(r);
    match tenant {
        Some(tenant) => request.header(TENANT_HEADER, tenant.value(r)),
        None => request,
    }
}

impl TenantLimit {
    /// The limit at every request's most: `configured` with the parameter at `max`.
    pub fn largest(&self, configured: &GlobalLimit) -> GlobalLimit {
        let mut values = configured.algorithm().parameters();
        values[self.parameter] = self.max;
        GlobalLimit::build(configured.kind(), &values).unwrap_or_else(|_| configured.clone())
    }

    /// The first user whose admissions (`admitted[user]`, made by the requests
    /// `requests[user]` of `schedule`), each with the limit its request carried, break
    /// [`conformance::check_each_limit`].
    pub fn violation(
        &self,
        configured: &GlobalLimit,
        schedule: &[Request],
        admitted: &BTreeMap<usize, Vec<Admission>>,
        requests: &BTreeMap<usize, Vec<usize>>,
    ) -> Option<(usize, String)> {
        admitted.iter().find_map(|(user, admissions)| {
            let carried: Vec<(GlobalLimit, Admission)> = requests[user]
                .iter()
                .zip(admissions)
                .map(|(&i, a)| (self.carried(configured, &schedule[i]), *a))
                .collect();
            conformance::check_each_limit(&carried).err().map(|v| {
                let why = v.map_or("limits of more than one algorithm".to_string(), |v| {
                    v.to_string()
                });
                (
                    *user,
                    format!("{why} (limit per request from {TENANT_HEADER}: {self:?})"),
                )
            })
        })
    }
}

/// A global rule drawn over the whole range the config accepts, as `search_global.rs` and
/// `search_hostile.rs` draw it: its limit, the bridge timeout, leases (`lease.max` 1 a
/// quarter of the time), the failure mode, shadow mode, costs, Envoys and users.
pub struct DrawnGlobal {
    pub limit: DrawnLimit,
    pub timeout_us: u64,
    pub envoys: usize,
    pub users: usize,
    pub cost_max: u64,
    /// The `global` object's lease member (`,"lease":{…}`).
    pub lease: String,
    pub failure_mode: &'static str,
    pub shadow: bool,
}

impl DrawnGlobal {
    /// Draws one from `rng`, and from `more` what was added to the draw later (so the
    /// seeds kept before still draw their cases).
    pub fn draw(rng: &mut Rng, more: &mut Rng) -> DrawnGlobal {
        let timeout_us = if chance(more, 2) {
            log_uniform(more, MS, 250 * MS)
        } else {
            50 * MS
        };
        // The algorithms added since the history take their share from a generator
        // derived from `more` as it stands, not drawn from it, so that `more`'s later
        // draws stay what they were too.
        let mut added = Rng(more.0.wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1);
        let limit = draw_limit(rng, Some(&mut added), Scope::Global);
        let envoys = 1 + rng.below(3) as usize;
        let users = 1 + rng.below(2) as usize;
        let cost_max = if limit.max_cost < 2 || chance(rng, 3) {
            1
        } else {
            log_uniform(rng, 2, limit.max_cost.min(20))
        };
        let lease = if chance(rng, 4) {
            r#","lease":{"max":1}"#.to_string()
        } else {
            let max = log_uniform(rng, 1, 200);
            let ttl_us = log_uniform(rng, MS, limit.scale_us.clamp(MS, 10 * S));
            let mut lease = format!(r#","lease":{{"max":{max},"ttl":"{ttl_us}us""#);
            if chance(more, 2) {
                let round_trip_us = log_uniform(more, 1, 100 * MS);
                lease.push_str(&format!(r#","round_trip":"{round_trip_us}us""#));
            }
            if spec_of(limit.name).has_schedule && chance(rng, 2) {
                let horizon_us = log_uniform(rng, MS, 10 * S);
                lease.push_str(&format!(r#","horizon":"{horizon_us}us""#));
            }
            lease.push('}');
            lease
        };
        let failure_mode = ["allow", "deny", "local"][rng.below(3) as usize];
        let shadow = chance(rng, 6);
        DrawnGlobal {
            limit,
            timeout_us,
            envoys,
            users,
            cost_max,
            lease,
            failure_mode,
            shadow,
        }
    }

    /// The plugin config of one global rule `r`, keyed by `x-user`, its cost from
    /// `x-cost`; `top` adds members to the top level (`,"response":{…}`).
    pub fn config(&self, top: &str) -> String {
        let cost = if self.cost_max > 1 {
            format!(r#","cost":{{"header":"x-cost","max":{}}}"#, self.cost_max)
        } else {
            String::new()
        };
        let shadow = if self.shadow { r#","shadow":true"# } else { "" };
        format!(
            r#"{{"bridge":{{"cluster":"weir_bridge","timeout":"{}us"}}{top},"rules":[{{"name":"r","scope":"global",
            "key":[{{"header":"x-user"}}],"limit":{}{cost}{shadow},
            "global":{{"failure_mode":"{}","expected_instances":{}{}}}}}]}}"#,
            self.timeout_us, self.limit.json, self.failure_mode, self.envoys, self.lease
        )
    }
}

/// The bound docs/global.md states for a global rule around a bridge fault ("The bound
/// under `local`"): `limit` plus two bursts, plus what Redis admitted for the calls in
/// flight when the fault was seen (`in_flight`), plus what the `envoys`' fallback shares
/// add up to beyond one limit (a share is at least one unit), plus one backoff's worth
/// (a second) of the limit's rate: an Envoy stays on its fallback until its backoff ends
/// while Redis already serves the others. Seed 1114829 of `search_global.rs` (a deep run)
/// found the bound without that last term too strict.
pub fn loose(limit: &GlobalLimit, envoys: u64, in_flight: u64) -> GlobalLimit {
    let shares = limit
        .local_share(envoys)
        .map_or(0, |share| share.max_cost().saturating_mul(envoys));
    let rounding = shares.saturating_sub(limit.max_cost());
    let policy = limit.policy();
    let backoff_ns = u128::from(BRIDGE_BACKOFF_US) * 1_000;
    let after_outage = u64::try_from(
        (u128::from(policy.quota) * backoff_ns).div_ceil(u128::from(policy.window_ns.max(1))),
    )
    .unwrap_or(u64::MAX);
    with_extra_units(
        &with_extra_bursts(limit, 2),
        in_flight + rounding + after_outage,
    )
}

/// `limit` admitting `units` more at once: the GCRA burst, the bucket's capacity, the
/// window's limit grown by them (by less where a parameter has a ceiling: a sliding log
/// keeps at most 100,000 entries).
pub fn with_extra_units(limit: &GlobalLimit, units: u64) -> GlobalLimit {
    let spec = limit.kind().spec();
    let mut values = limit.algorithm().parameters();
    let at = spec
        .parameters
        .iter()
        .position(|p| p.name == spec.limit_parameter.name)
        .unwrap();
    let base = values[at];
    let mut extra = units;
    loop {
        values[at] = base.saturating_add(extra);
        if let Ok(loose) = GlobalLimit::build(spec.kind, &values) {
            return loose;
        }
        if extra == 0 {
            return limit.clone();
        }
        extra /= 2;
    }
}
