//! The differential check: the Lua scripts on real Redis against the core's pure functions,
//! with the clock pinned, on every deployment the bridge supports (`cluster::*`: a 6-node
//! Redis Cluster; `standalone::*`: one `redis-server`; `sentinel::*`: a master found through
//! a sentinel). One body per check, run on each.
//!
//! - every row of the core's scenario tables (`want = cost`), GCRA rows by their Decision;
//! - lease rows (`want > cost`);
//! - a seeded random walk per algorithm, thousands of steps, every field compared and the
//!   stored state compared word for word with the core's (so the GCRA TAT, kept in Redis
//!   as whole µs + a ns remainder, is shown to be exact);
//! - the sliding log's set: equal timestamps, denials not recorded;
//! - TTLs: deadlines where the core says the state stops carrying information, and keys
//!   that really expired decide like their state would have.
//!
//! Pinned instants are moved a day into the future (see `common::future_base`): key
//! deadlines are absolute instants of the pinned clock, so nothing expires under a test
//! that does not wait for it.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;
/// A gcra rule's rate from each request: the script's rescaled TAT against the core's.
#[path = "conformance/rates.rs"]
mod rates;
/// Costs settled after the response: the settle scripts against the core.
#[path = "conformance/settles.rs"]
mod settles;
/// Shared limits: the share script against the core.
#[path = "conformance/shares.rs"]
mod shares;

use common::{future_base, invocation, invocation_for, Backend, Redis, Rng};
use std::time::Duration;
use weir_bridge::scripts::{log_seq_key, ScriptReply};
use weir_protocol::algorithms::fixed_window::FixedWindow;
use weir_protocol::algorithms::gcra::Gcra;
use weir_protocol::algorithms::sliding_log::SlidingLog;
use weir_protocol::algorithms::sliding_window::SlidingWindow;
use weir_protocol::algorithms::token_bucket::TokenBucket;
use weir_protocol::algorithms::GlobalLimit;
use weir_protocol::algorithms::{AlgorithmKind, Ask, Decision, Limit, SlotState, Unit};
use weir_testkit::oracles;
use weir_testkit::scenarios::{expected, limit_of, log_of, Scenario, T0};

on_every_backend!(
    scenario_tables_agree,
    sliding_log_table_agrees,
    lease_rows_agree,
    random_walks_agree,
    sliding_log_keeps_equal_timestamps_and_drops_denials,
    keys_carry_deadlines_where_their_state_stops_mattering,
    expired_keys_decide_like_their_state_would_have,
    settles_agree,
    an_expired_key_is_charged_its_excess,
    shares_agree,
    changing_rates_agree,
);

use rates::changing_rates_agree;
use settles::{an_expired_key_is_charged_its_excess, settles_agree};
use shares::shares_agree;

fn decision_of(reply: &ScriptReply) -> Decision {
    reply.grant.decision
}

/// One key of a slot algorithm, decided by Rust and by Lua side by side.
struct SlotPair<'a> {
    redis: &'a Redis,
    limit: Limit,
    global: GlobalLimit,
    descriptor: String,
    state: Option<SlotState>,
    /// The key keeps the emission interval it is counted in (a gcra rule whose limit
    /// each request gives).
    keeps_interval: bool,
}

impl<'a> SlotPair<'a> {
    fn new(redis: &'a Redis, limit: Limit, descriptor: String) -> Self {
        SlotPair {
            redis,
            global: GlobalLimit::Slot(limit.clone()),
            limit,
            descriptor,
            state: None,
            keeps_interval: false,
        }
    }

    /// The limit the next requests carry.
    fn carry(&mut self, limit: Limit) {
        self.global = GlobalLimit::Slot(limit.clone());
        self.limit = limit;
    }

    /// Decides one request both ways, asserts they agree on every field and on the state
    /// written, and returns the decision.
    async fn step(&mut self, ctx: &str, now: u64, cost: u64, want: u64) -> (Decision, u64) {
        self.step_ask(ctx, now, Ask::exact(cost).with_want(want))
            .await
    }

    /// The same for any ask: leases with a hold, reservations.
    async fn step_ask(&mut self, ctx: &str, now: u64, ask: Ask) -> (Decision, u64) {
        let (grant, next) = self.limit.grant(self.state, now, ask);
        let inv = invocation_for(&self.global, &self.descriptor, now, ask)
            .keeping_interval(self.keeps_interval);
        let reply = self.redis.run(&inv).await;
        assert_eq!(
            reply.grant, grant,
            "{ctx}: Lua (left) and Rust (right) disagree at now={now} asking {ask:?}, state {:?}",
            self.state
        );
        let (decision, granted) = (grant.decision, grant.granted);
        assert_eq!(reply.now_us, now, "{ctx}: the script used the pinned clock");
        if let Some(next) = next {
            self.state = Some(next);
        }
        let stored = self.redis.slot_state(self.limit.kind(), &inv.keys[0]).await;
        // Redis's GCRA state is the TAT alone, counted in the T of the call that wrote
        // it, unless the rule's rate comes with each request: then the T is kept beside
        // it, as the core's slot keeps it (word b).
        let kept = self.state.map(|s| match self.limit.kind() {
            AlgorithmKind::Gcra if !self.keeps_interval => SlotState { b: 0, ..s },
            _ => s,
        });
        assert_eq!(
            stored, kept,
            "{ctx}: Redis holds (left), the core stores (right)"
        );
        (decision, granted)
    }
}

async fn scenario_tables_agree(backend: Backend) {
    let redis = Redis::start(backend).await;
    let base = future_base(T0);
    let all: Vec<&Scenario> = oracles::slot_tables().collect();
    assert!(all.len() >= 10, "the tables are all there");
    for (n, scenario) in all.iter().enumerate() {
        let mut pair = SlotPair::new(&redis, limit_of(scenario.algo), format!("scenario-{n}"));
        for (i, step) in scenario.steps.iter().enumerate() {
            let ctx = format!("{} step {i}", scenario.name);
            let now = step.now_us - T0 + base;
            let (decision, granted) = pair.step(&ctx, now, step.cost, step.cost).await;
            // GCRA rows are compared by their Decision, not the CL.THROTTLE reply.
            assert_eq!(decision, expected(step), "{ctx}: the core and the table");
            assert_eq!(granted, if step.allowed { step.cost } else { 0 }, "{ctx}");
        }
    }
}

/// The sliding log's rows (its oracle's `SCENARIOS`): it has no slot state, so the log is
/// kept beside the script (see [`log_step`]) and each row is decided both ways.
async fn sliding_log_table_agrees(backend: Backend) {
    let redis = Redis::start(backend).await;
    let base = future_base(T0);
    let rows = oracles::scenarios(AlgorithmKind::SlidingLog);
    assert!(!rows.is_empty());
    for (n, scenario) in rows.iter().enumerate() {
        let log = log_of(scenario.algo);
        let descriptor = format!("log-scenario-{n}");
        let mut events = Vec::new();
        for (i, step) in scenario.steps.iter().enumerate() {
            let ctx = format!("{} step {i}", scenario.name);
            let now = step.now_us - T0 + base;
            let (decision, granted) = log_step(
                &redis,
                &log,
                &descriptor,
                &mut events,
                now,
                step.cost,
                step.cost,
            )
            .await;
            assert_eq!(decision, expected(step), "{ctx}: the core and the table");
            assert_eq!(granted, if step.allowed { step.cost } else { 0 }, "{ctx}");
        }
    }
}

async fn lease_rows_agree(backend: Backend) {
    let redis = Redis::start(backend).await;
    let base = future_base(T0);
    let s = 1_000_000;
    // (limit, steps of (µs after base, cost, want, granted, remaining)).
    type Row = (u64, u64, u64, u64, u64);
    let tables: Vec<(Limit, Vec<Row>)> = vec![
        (
            // 10 per second, burst 9: a lease of at most 10 at once, then 1 per 100 ms.
            Limit::Gcra(Gcra::new(9, 10, s).unwrap()),
            vec![
                (0, 1, 16, 10, 0),
                (0, 1, 16, 0, 0),
                (250_000, 1, 16, 2, 0),
                (250_000, 0, 16, 0, 0),
                (2 * s, 3, 4, 4, 6),
            ],
        ),
        (
            // T = 333_333_333 ns: leases must add T exactly, never a rounded µs.
            Limit::Gcra(Gcra::new(5, 3, s).unwrap()),
            vec![
                (0, 2, 5, 5, 1),
                (333_334, 1, 9, 2, 0),
                (1_000_000, 1, 9, 2, 0),
            ],
        ),
        (
            Limit::TokenBucket(TokenBucket::new(10, 3, s).unwrap()),
            vec![(0, 2, 5, 5, 5), (0, 1, 100, 5, 0), (1_500_000, 2, 8, 3, 0)],
        ),
        (
            Limit::FixedWindow(FixedWindow::new(10, 10 * s).unwrap()),
            vec![
                (0, 1, 8, 8, 2),
                (s, 1, 8, 2, 0),
                (2 * s, 1, 8, 0, 0),
                (10 * s, 1, 8, 8, 2),
            ],
        ),
        (
            Limit::SlidingWindow(SlidingWindow::new(10, 10 * s).unwrap()),
            vec![
                (9 * s, 1, 10, 10, 0),
                (15 * s, 1, 10, 5, 0),
                (19 * s, 1, 10, 4, 0),
            ],
        ),
    ];
    for (n, (limit, rows)) in tables.into_iter().enumerate() {
        let mut pair = SlotPair::new(&redis, limit, format!("lease-{n}"));
        for (i, (dt, cost, want, granted, remaining)) in rows.into_iter().enumerate() {
            let ctx = format!("lease table {n} row {i}");
            let (d, g) = pair.step(&ctx, base + dt, cost, want).await;
            assert_eq!((g, d.remaining), (granted, remaining), "{ctx}");
        }
    }

    // The log: a lease takes what is free, a denial takes nothing.
    let log = SlidingLog::new(10, 10 * s).unwrap();
    let mut events = Vec::new();
    for (i, (dt, cost, want, granted)) in [
        (0, 1, 4, 4),
        (s, 2, 50, 6),
        (2 * s, 1, 1, 0),
        (10 * s, 1, 3, 3),
    ]
    .into_iter()
    .enumerate()
    {
        let (d, g) = log_step(
            &redis,
            &log,
            "lease-log",
            &mut events,
            base + dt,
            cost,
            want,
        )
        .await;
        assert_eq!(g, granted, "log row {i}: {d:?}");
    }
}

/// One request to a sliding log both ways; `events` is the core's view of the set.
async fn log_step(
    redis: &Redis,
    log: &SlidingLog,
    descriptor: &str,
    events: &mut Vec<u64>,
    now: u64,
    cost: u64,
    want: u64,
) -> (Decision, u64) {
    let ask = Ask::exact(cost).with_want(want);
    log_step_ask(redis, log, descriptor, events, now, ask).await
}

/// The same for any ask: units are logged at `now + ttl_us`.
async fn log_step_ask(
    redis: &Redis,
    log: &SlidingLog,
    descriptor: &str,
    events: &mut Vec<u64>,
    now: u64,
    ask: Ask,
) -> (Decision, u64) {
    let grant = log.grant(events, now, ask);
    let inv = invocation_for(&GlobalLimit::SlidingLog(*log), descriptor, now, ask);
    let reply = redis.run(&inv).await;
    assert_eq!(
        reply.grant, grant,
        "sliding log: Lua (left) and Rust (right) disagree at now={now} asking {ask:?}, events {events:?}"
    );
    assert_eq!(reply.now_us, now);
    let (decision, granted) = (grant.decision, grant.granted);
    // Keep the core's log sorted (the clock may go back) and trimmed like Redis's.
    let logged_at = now + ask.ttl_us;
    let at = events.partition_point(|&t| t <= logged_at);
    events.splice(at..at, std::iter::repeat_n(logged_at, granted as usize));
    if now >= log.window_us() {
        events.retain(|&t| t > now - log.window_us());
    }
    let card = redis.int(&["ZCARD", &inv.keys[0]]).await;
    assert_eq!(card as usize, events.len(), "the set holds the live events");
    (decision, granted)
}

/// Durations (µs) a limit's duration parameters are drawn from, each times 1 to 3: from
/// 1 µs, the shortest there is, to 90 days, whose products with a count can pass the
/// 2^48 µs `check_script_exact` allows.
const DURATIONS_US: [u64; 9] = [
    1,
    7,
    1_000,
    333_333,
    1_000_000,
    7_000_001,
    60_000_000,
    86_400_000_000,
    30 * 86_400_000_000,
];

/// A count parameter: mostly 0 (refused where a count must be at least 1) or 1 to 40,
/// numbers a walk fills and empties; sometimes 2^20 to `u32::MAX`, whose products with
/// durations and with other counts (the sliding window's prev × (W − e)) go far past 2^53,
/// beyond which Lua's doubles are not exact: the scripts must never form them whole.
fn random_count(rng: &mut Rng) -> u64 {
    if rng.chance(25) {
        rng.range(1 << 20, u64::from(u32::MAX))
    } else if rng.chance(5) {
        0
    } else {
        rng.range(1, 40)
    }
}

/// A random limit of `kind` within what the scripts accept, drawn through its spec: each
/// parameter by its unit, until the algorithm's builder and its `check_script_exact`
/// accept the values. Every algorithm gets the whole range: what its script cannot decide
/// exactly (a bucket that takes more than 2^48 µs to refill from empty) its
/// `check_script_exact` refuses, and a new algorithm is drawn with no line of its own.
fn random_limit(rng: &mut Rng, kind: AlgorithmKind) -> GlobalLimit {
    loop {
        let values: Vec<u64> = kind
            .spec()
            .parameters
            .iter()
            .map(|parameter| match parameter.unit {
                Unit::Count => random_count(rng),
                Unit::Duration => rng.pick(&DURATIONS_US) * rng.range(1, 3),
            })
            .collect();
        if let Ok(limit) = GlobalLimit::build(kind, &values) {
            if limit.algorithm().check_script_exact().is_ok() {
                return limit;
            }
        }
    }
}

/// The longest time scale of a walk, µs (about 6.4 days): a walk moves a key's clock by
/// at most 3 + 400 × 5 scales (a settle walk less), so from a base near today (2^50.7
/// µs in 2026) its instants stay below 2^52 µs, those the scripts are exact for (see
/// `MAX_SCRIPT_EXACT`), until about 2077. Longer windows and periods are crossed in a
/// few steps.
const MAX_SCALE_US: u64 = 1 << 39;

/// The time scale of a walk on `limit` (µs): the time an emptied key takes to be fresh
/// again (its policy's window: a window, a bucket's refill from empty, a GCRA's
/// tolerance) divided by a random power of two up to its quota (at most 64). Steps then
/// range from about the time one unit takes to come back (a GCRA's emission interval, a
/// bucket's refill period), where keys fill and deny, to whole windows, after which a key
/// decides with little or no state.
fn random_scale(rng: &mut Rng, limit: &GlobalLimit) -> u64 {
    let policy = limit.policy();
    let divisions = policy.quota.clamp(1, 64).ilog2();
    let window_us = policy.window_ns.div_ceil(1_000);
    (window_us >> rng.range(0, u64::from(divisions))).clamp(1, MAX_SCALE_US)
}

/// One key of a random walk, decided by Lua and by Rust side by side: a slot algorithm's
/// key, or the sliding log's, which has no slot state (its events are kept beside it).
enum WalkedKey<'a> {
    Slot(SlotPair<'a>),
    Log {
        redis: &'a Redis,
        log: SlidingLog,
        descriptor: String,
        events: Vec<u64>,
    },
}

impl<'a> WalkedKey<'a> {
    fn new(redis: &'a Redis, limit: &GlobalLimit, descriptor: String) -> Self {
        match limit {
            GlobalLimit::Slot(slot) => {
                WalkedKey::Slot(SlotPair::new(redis, slot.clone(), descriptor))
            }
            GlobalLimit::SlidingLog(log) => WalkedKey::Log {
                redis,
                log: *log,
                descriptor,
                events: Vec::new(),
            },
        }
    }

    /// Decides `ask` both ways and asserts they agree (see [`SlotPair::step_ask`],
    /// [`log_step_ask`]).
    async fn step(&mut self, ctx: &str, now: u64, ask: Ask) -> (Decision, u64) {
        match self {
            WalkedKey::Slot(pair) => pair.step_ask(ctx, now, ask).await,
            WalkedKey::Log {
                redis,
                log,
                descriptor,
                events,
            } => log_step_ask(redis, log, descriptor, events, now, ask).await,
        }
    }
}

/// A walk's next instant after `now` (never before `base`): mostly small steps (a few
/// per period), sometimes none, sometimes long idle spells, sometimes the clock goes back
/// a little.
fn walk_clock(rng: &mut Rng, now: u64, base: u64, scale: u64) -> u64 {
    match rng.range(0, 99) {
        0..20 => now,
        20..85 => now + scale * rng.range(0, 64) / 64 + rng.range(0, 3),
        85..95 => now + scale * rng.range(1, 5),
        _ => now - (scale * rng.range(0, 16) / 64).min(now - base),
    }
}

async fn random_walk(redis: &Redis, kind: AlgorithmKind, seed: u64, steps: usize) {
    let mut rng = Rng(seed);
    let base = future_base(T0) + rng.range(0, 86_400_000_000);
    let mut done = 0;
    let mut key_no = 0;
    while done < steps {
        // A fresh key and limit every few hundred steps.
        let limit = random_limit(&mut rng, kind);
        let scale = random_scale(&mut rng, &limit);
        let max_cost = limit.max_cost();
        let descriptor = format!("random-{kind}-{seed}-{key_no}");
        key_no += 1;
        let mut now = base + rng.range(0, scale * 3);
        let mut key = WalkedKey::new(redis, &limit, descriptor);
        for _ in 0..rng.range(50, 400) {
            now = walk_clock(&mut rng, now, base, scale);
            let cost = if rng.chance(5) {
                0
            } else if rng.chance(3) {
                max_cost + rng.range(1, 3)
            } else {
                rng.range(1, max_cost.min(12))
            };
            let want = if rng.chance(40) {
                cost
            } else {
                cost + rng.range(0, 20)
            };
            // Ttls and horizons around the limit's own scale, sometimes none.
            let ttl_us = if rng.chance(30) {
                0
            } else {
                (scale * rng.range(0, 128) / 64).min(3_600_000_000)
            };
            let (reserve, horizon_us) = if rng.chance(50) {
                (0, 0)
            } else {
                (
                    rng.range(1, 40),
                    (scale * rng.range(0, 256) / 64).min(10_000_000),
                )
            };
            let ask = Ask {
                cost,
                want,
                reserve,
                ttl_us,
                horizon_us,
            };
            let ctx = format!("{kind} seed {seed} step {done} limit {limit:?}");
            key.step(&ctx, now, ask).await;
            done += 1;
        }
    }
}

const RANDOM_STEPS: usize = 3000;

async fn random_walks_agree(backend: Backend) {
    let redis = Redis::start(backend).await;
    let mut walks = Vec::new();
    for (i, kind) in AlgorithmKind::ALL.into_iter().enumerate() {
        let redis = &redis;
        walks.push(
            async move { random_walk(redis, kind, 0x5eed_0000 + i as u64, RANDOM_STEPS).await },
        );
    }
    futures_join_all(walks).await;
}

/// Runs the futures concurrently on this task (no extra dependency for join_all).
async fn futures_join_all<F: std::future::Future<Output = ()>>(futures: Vec<F>) {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    std::future::poll_fn(|cx| {
        futures.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if futures.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

async fn sliding_log_keeps_equal_timestamps_and_drops_denials(backend: Backend) {
    let redis = Redis::start(backend).await;
    let base = future_base(T0);
    let log = SlidingLog::new(3, 1_000_000).unwrap();
    let mut events = Vec::new();
    let key = invocation(&GlobalLimit::SlidingLog(log), "log-set", base, 1, 1).keys[0].clone();

    // Two events at the same µs: both recorded, as distinct members.
    log_step(&redis, &log, "log-set", &mut events, base, 1, 1).await;
    log_step(&redis, &log, "log-set", &mut events, base, 1, 1).await;
    assert_eq!(redis.int(&["ZCARD", &key]).await, 2);
    assert_eq!(
        redis
            .int(&["ZCOUNT", &key, &base.to_string(), &base.to_string()])
            .await,
        2
    );

    // A denied request adds nothing.
    let (d, _) = log_step(&redis, &log, "log-set", &mut events, base + 10, 2, 2).await;
    assert!(!d.allowed);
    assert_eq!(redis.int(&["ZCARD", &key]).await, 2);
    log_step(&redis, &log, "log-set", &mut events, base + 10, 1, 1).await;
    let (d, _) = log_step(&redis, &log, "log-set", &mut events, base + 20, 1, 1).await;
    assert!(!d.allowed);
    assert_eq!(redis.int(&["ZCARD", &key]).await, 3);
    // The first two leave together exactly one window after they were admitted.
    assert_eq!(d.retry_after_ns, Some(999_980_000));
    let (d, g) = log_step(&redis, &log, "log-set", &mut events, base + 1_000_000, 2, 5).await;
    assert!(d.allowed && g == 2);
    assert_eq!(redis.int(&["ZCARD", &key]).await, 3);
    // Members are unique sequence numbers.
    assert_eq!(redis.get(&log_seq_key(&key)).await.as_deref(), Some("5"));
}

async fn keys_carry_deadlines_where_their_state_stops_mattering(backend: Backend) {
    let redis = Redis::start(backend).await;
    let base = future_base(T0) + 123_456;
    let s = 1_000_000;
    let limits = [
        Limit::TokenBucket(TokenBucket::new(5, 2, s).unwrap()),
        Limit::Gcra(Gcra::new(2, 3, s).unwrap()),
        Limit::FixedWindow(FixedWindow::new(5, 10 * s).unwrap()),
        Limit::SlidingWindow(SlidingWindow::new(5, 10 * s).unwrap()),
    ];
    for (n, limit) in limits.into_iter().enumerate() {
        let mut pair = SlotPair::new(&redis, limit.clone(), format!("ttl-{n}"));
        for (dt, cost) in [(0, 1), (333_333, 2)] {
            pair.step(&format!("ttl {n}"), base + dt, cost, cost).await;
            let key = invocation(&pair.global, &pair.descriptor, 0, 0, 0).keys[0].clone();
            let state = pair.state.unwrap();
            let deadline_ms = limit.idle_at_us(state).div_ceil(1000);
            assert_eq!(
                redis.int(&["PEXPIRETIME", &key]).await,
                deadline_ms as i64,
                "{limit:?}: the key lives until its state carries no information"
            );
        }
    }
    // The log: newest event + window, on both keys.
    let log = SlidingLog::new(5, 10 * s).unwrap();
    let mut events = Vec::new();
    log_step(&redis, &log, "ttl-log", &mut events, base, 1, 1).await;
    log_step(&redis, &log, "ttl-log", &mut events, base + 7, 1, 1).await;
    let keys = invocation(&GlobalLimit::SlidingLog(log), "ttl-log", 0, 0, 0).keys;
    for key in &keys {
        assert_eq!(
            redis.int(&["PEXPIRETIME", key]).await,
            (base + 7 + 10 * s).div_ceil(1000) as i64
        );
    }
    // A denial or a peek writes nothing, not even a deadline.
    let mut pair = SlotPair::new(
        &redis,
        Limit::FixedWindow(FixedWindow::new(1, 10 * s).unwrap()),
        "ttl-peek".into(),
    );
    pair.step("peek", base, 0, 0).await;
    assert_eq!(
        redis
            .get(&invocation(&pair.global, "ttl-peek", 0, 0, 0).keys[0])
            .await,
        None
    );
}

/// With Redis's own clock: write, wait until the key is really gone, and check that the
/// next decision is the one the stored state would have given.
async fn expired_keys_decide_like_their_state_would_have(backend: Backend) {
    let redis = Redis::start(backend).await;
    let ms = 1_000;
    let limits = [
        Limit::TokenBucket(TokenBucket::new(3, 1, 100 * ms).unwrap()),
        Limit::Gcra(Gcra::new(1, 10, 1_000 * ms).unwrap()),
        Limit::FixedWindow(FixedWindow::new(3, 150 * ms).unwrap()),
        Limit::SlidingWindow(SlidingWindow::new(3, 100 * ms).unwrap()),
    ];
    for (n, limit) in limits.into_iter().enumerate() {
        let g = GlobalLimit::Slot(limit.clone());
        let descriptor = format!("expiry-{n}");
        let inv = invocation(&g, &descriptor, 0, 2, 2);
        let first = redis.run(&inv).await;
        assert!(first.grant.decision.allowed);
        let state = redis
            .slot_state(limit.kind(), &inv.keys[0])
            .await
            .expect("written");
        assert!(
            expired(&redis, &inv.keys[..1]),
            "{limit:?}: the key expires"
        );
        let again = redis.run(&invocation(&g, &descriptor, 0, 2, 2)).await;
        let (with_state, _) = limit.decide(Some(state), again.now_us, 2);
        assert!(
            again.now_us >= limit.idle_at_us(state),
            "expired no earlier than the core's idle instant"
        );
        if let Limit::TokenBucket(_) = limit {
            // Full either way; only the phase of the next refill differs (as in the core).
            assert_eq!(
                (again.grant.decision.allowed, again.grant.decision.remaining),
                (with_state.allowed, with_state.remaining)
            );
        } else {
            assert_eq!(decision_of(&again), with_state, "{limit:?}");
        }
    }
    let log = SlidingLog::new(2, 100 * ms).unwrap();
    let inv = invocation(&GlobalLimit::SlidingLog(log), "expiry-log", 0, 2, 2);
    let first = redis.run(&inv).await;
    assert!(first.grant.decision.allowed);
    assert!(
        expired(&redis, &inv.keys[..2]),
        "both keys of the log expire"
    );
    let again = redis.run(&inv).await;
    let (with_events, _) = log.acquire(&[first.now_us, first.now_us], again.now_us, 2, 2);
    assert_eq!(decision_of(&again), with_events);
}

/// Runs a future to completion from synchronous code inside the multi-thread runtime.
fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// Waits, by Redis's own clock (3 s at most), until none of `keys` exists any more;
/// whether they are gone.
fn expired(redis: &Redis, keys: &[String]) -> bool {
    let mut exists = vec!["EXISTS"];
    exists.extend(keys.iter().map(String::as_str));
    weir_e2e::wait_until(Duration::from_secs(3), Duration::from_millis(5), || {
        futures_block(redis.int(&exists)) == 0
    })
}
