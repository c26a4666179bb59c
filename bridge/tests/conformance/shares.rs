//! Shared limits (`share`, issue 36): `lua/share.lua` on real Redis against the core's
//! `ShareLimit::decide`, in seeded random walks — parents of 1 to 2^32 − 1 units a window,
//! windows from 1 µs to 30 days, 1 to 1,024 keys tracked, crowds of keys past them,
//! weights 1 to 1,000, requests naming no key, leases (units beyond the cost, from the
//! key's own entitlement), idle windows and a clock that goes back —
//! every field of every decision compared, and the parent's count and every key's
//! weight, entitlement, use and demand compared with the core's state after each step;
//! and now and then an admitted request's cost settled (`lua/share_settle.lua` against
//! `ShareLimit::settle`), refunds and charges, in its window and after it.

use crate::common::{future_base, Redis, Rng};
use redis::Value;
use weir_bridge::scripts::{Invocation, Settle};
use weir_protocol::algorithms::{fixed_window::FixedWindow, Ask, GlobalLimit, Limit};
use weir_protocol::key::redis_share_key_id;
use weir_protocol::share::{ShareAsk, ShareLimit, ShareState, MAX_GLOBAL_SHARE_LIMIT};
use weir_protocol::wire::v2::WireShare;
use weir_testkit::scenarios::T0;

const WINDOWS: [u64; 6] = [
    1,
    999,
    1_000_000,
    7_000_001,
    3_600_000_000,
    30 * 86_400_000_000,
];

/// One parent walked by both, for `steps` requests.
async fn walk(redis: &Redis, seed: u64, steps: usize) {
    let mut rng = Rng(seed);
    let limit = if rng.chance(20) {
        rng.range(1 << 20, MAX_GLOBAL_SHARE_LIMIT)
    } else {
        rng.range(1, 200)
    };
    let window_us = rng.pick(&WINDOWS);
    let max_keys = if rng.chance(20) {
        rng.range(100, 1024) as u32
    } else {
        rng.range(1, 12) as u32
    };
    let keys = rng.range(1, u64::from(max_keys) + 6);
    let share = ShareLimit {
        limit,
        window_us,
        max_keys,
    };
    let global = GlobalLimit::Slot(Limit::FixedWindow(
        FixedWindow::new(limit, window_us).unwrap(),
    ));
    let descriptor = vec![format!("=parent-{seed}")];
    let mut state: Option<ShareState> = None;
    let mut now = future_base(T0) + rng.range(0, 86_400_000_000);
    let weights: Vec<u64> = (0..keys).map(|_| rng.range(1, 1000)).collect();
    // Admitted requests whose responses have not ended: when, whose, how much.
    let mut counted: Vec<(u64, Vec<String>, u64)> = Vec::new();
    for step in 0..steps {
        let r = rng.range(0, 99);
        if r < 60 {
            now += rng.range(0, window_us / 8 + 1);
        } else if r < 90 {
            now += window_us * rng.range(0, 2) + rng.range(0, 2);
        } else if r < 95 {
            now += window_us * rng.range(2, 4);
        } else {
            now -= rng.range(0, window_us / 4 + 1);
        }
        let key = rng.range(0, keys + 1);
        let parts: Vec<String> = if key == keys {
            Vec::new()
        } else {
            vec![format!("=user-{key}")]
        };
        let weight = weights.get(key as usize).copied().unwrap_or(1);
        let cost = if rng.chance(10) {
            rng.range(1, limit)
        } else {
            rng.range(1, limit.min(12))
        };
        let wire = WireShare {
            key: parts.clone(),
            weight,
            max_keys,
        };
        // Sometimes a lease: up to 20 units more, held up to two windows.
        let (want, ttl_us) = if rng.chance(30) {
            (cost + rng.range(0, 20), rng.range(0, 2 * window_us))
        } else {
            (cost, 0)
        };
        let ask = ShareAsk {
            key: (!parts.is_empty()).then(|| redis_share_key_id(&parts)),
            weight,
            cost,
            want,
        };
        let (decided, next) = share.decide(state.take(), now, ask);
        let asking = Ask {
            cost,
            want,
            reserve: 0,
            ttl_us,
            horizon_us: 0,
        };
        let inv = Invocation::for_share(&global, "weir", "r", &descriptor, now, (&wire, asking));
        let reply = redis.run(&inv).await;
        let ctx = format!("seed {seed} step {step} {share:?} at {now} asking {ask:?}");
        let expected = share.grant(&decided, cost, now);
        assert_eq!(reply.grant, expected, "{ctx}: Lua (left), Rust (right)");
        assert_eq!(reply.now_us, now, "{ctx}");
        let held = stored(redis, &inv.keys[0]).await;
        assert_eq!(
            held,
            written(&next),
            "{ctx}: Redis holds (left), the core keeps (right)"
        );
        state = Some(next);
        if decided.decision.allowed {
            counted.push((now, parts, decided.granted));
        }
        // Now and then a response ends: what one admitted request really cost, settled
        // both ways (sometimes after its window).
        if rng.chance(30) && !counted.is_empty() {
            let pick = rng.range(0, counted.len() as u64 - 1) as usize;
            let (at, parts, reserved) = counted.swap_remove(pick);
            let actual = if rng.chance(20) {
                reserved + rng.range(0, 5)
            } else {
                rng.range(0, reserved)
            };
            let id = (!parts.is_empty()).then(|| redis_share_key_id(&parts));
            let settled = share.settle(state.clone(), (at, now), id, (reserved, actual));
            let settle = Settle {
                counted_at_us: at,
                reserved,
                actual,
            };
            let parent = ("weir", "r", descriptor.as_slice());
            let inv = Invocation::settle_share(&global, parent, &parts, now, settle);
            let (changed, _) = redis.store.run_settle(&inv).await.unwrap();
            let ctx = format!("{ctx}, settling {reserved} at {at} as {actual}");
            assert_eq!(
                changed,
                settled.is_some(),
                "{ctx}: Lua (left), Rust (right)"
            );
            if let Some(next) = settled {
                state = Some(next);
            }
            let held = stored(redis, &inv.keys[0]).await;
            let kept = state.as_ref().map(written).unwrap_or_default();
            assert_eq!(
                held, kept,
                "{ctx}: Redis holds (left), the core keeps (right)"
            );
        }
    }
}

/// The parent's count and keys as Redis holds them: (window, used, sorted keys as
/// `weight entitled used asked`).
async fn stored(redis: &Redis, key: &str) -> (u64, u64, Vec<(u64, [u64; 4])>) {
    let Value::Array(fields) = redis.cmd(&["HGETALL", key]).await else {
        panic!("HGETALL {key}: not an array");
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("not a string: {other:?}"),
    };
    let (mut window, mut used, mut keys) = (0, 0, Vec::new());
    for pair in fields.chunks(2) {
        let (name, value) = (text(&pair[0]), text(&pair[1]));
        match name.as_str() {
            "w" => window = value.parse().unwrap(),
            "u" => used = value.parse().unwrap(),
            "r" | "s" | "n" => {}
            id => {
                let id: u64 = id.trim_start_matches('k').parse().unwrap();
                let words: Vec<u64> = value.split(' ').map(|w| w.parse().unwrap()).collect();
                keys.push((id, [words[0], words[1], words[2], words[3]]));
            }
        }
    }
    keys.sort();
    (window, used, keys)
}

/// What the core's state says Redis should hold.
fn written(state: &ShareState) -> (u64, u64, Vec<(u64, [u64; 4])>) {
    let mut keys: Vec<(u64, [u64; 4])> = state
        .entries
        .iter()
        .map(|e| (e.fingerprint, [e.weight, e.entitled, e.used, e.asked]))
        .collect();
    keys.sort();
    (state.window_start_us, state.used, keys)
}

pub async fn shares_agree(backend: crate::common::Backend) {
    let redis = Redis::start(backend).await;
    for seed in 0..24u64 {
        walk(&redis, 0x5_4a2e_0000 + seed, 250).await;
    }
}
