//! Costs settled after the response (`/v3/commit`), the settle scripts on real Redis
//! against the core's `settle`: a seeded walk on fixed and random limits, and keys that
//! expired while a response ran. Run on every backend by `on_every_backend!` in
//! `conformance.rs`, with the other checks.

use super::common::{future_base, invocation, Backend, Redis, Rng};
use super::{expired, random_limit, random_scale, SlotPair};
use weir_bridge::scripts::{Invocation, Settle};
use weir_protocol::algorithms::fixed_window::FixedWindow;
use weir_protocol::algorithms::token_bucket::TokenBucket;
use weir_protocol::algorithms::{AlgorithmKind, GlobalLimit, Limit};
use weir_testkit::scenarios::T0;

impl SlotPair<'_> {
    /// Settles one reservation both ways (`commit`): whether the state changed, and the
    /// state written, must agree.
    async fn settle(&mut self, ctx: &str, now: u64, counted_at: u64, reserved: u64, actual: u64) {
        let next = self
            .limit
            .settle(self.state, counted_at, reserved, actual, now);
        let inv = Invocation::settle(
            &self.global,
            "weir-test",
            "conformance",
            &[format!("={}", self.descriptor)],
            now,
            Settle {
                counted_at_us: counted_at,
                reserved,
                actual,
            },
        );
        let (changed, redis_now) = self.redis.store.run_settle(&inv).await.unwrap();
        assert_eq!(redis_now, now, "{ctx}: the pinned clock");
        assert_eq!(
            changed,
            next.is_some(),
            "{ctx}: Lua (left) and Rust (right) disagree on settling {reserved} → {actual} \
             counted at {counted_at}, at now={now}, state {:?}",
            self.state
        );
        if let Some(next) = next {
            self.state = Some(next);
        }
        let stored = self.redis.slot_state(self.limit.kind(), &inv.keys[0]).await;
        assert_eq!(
            stored, self.state,
            "{ctx}: Redis holds (left), the core stores (right)"
        );
        if let (Some(next), Some(_)) = (next, stored) {
            assert_eq!(
                self.redis.int(&["PEXPIRETIME", &inv.keys[0]]).await,
                self.limit.idle_at_us(next).div_ceil(1000) as i64,
                "{ctx}: a settled key lives until its state (its debt) carries no information"
            );
        }
    }
}

impl SlotPair<'_> {
    /// The key expires, as Redis lets it once its state carries no information: the
    /// core's state is gone too (a slot taken over).
    async fn expire(&mut self) {
        let key = invocation(&self.global, &self.descriptor, 0, 0, 0).keys[0].clone();
        self.redis.int(&["DEL", &key]).await;
        self.state = None;
    }
}

/// Costs settled after the response (`/v3/commit`): a seeded walk of acquires and
/// settles — refunds in and out of their window or refill period, excesses, debts over
/// many refills or windows, settles on keys that expired while the response ran —
/// decided by the settle scripts and by the core side by side, on fixed limits and on
/// random ones over the range the scripts accept (a refill period of 30 days, whose
/// debts reach past the 2^48 µs a settle carries them).
pub(super) async fn settles_agree(backend: Backend) {
    let redis = Redis::start(backend).await;
    let base = future_base(T0);
    let mut limits = vec![
        Limit::TokenBucket(TokenBucket::new(100, 10, 1_000_000).unwrap()),
        // A refill above the capacity: the debt is paid a bucketful per period.
        Limit::TokenBucket(TokenBucket::new(5, 100, 9_000).unwrap()),
        Limit::FixedWindow(FixedWindow::new(100, 10_000_000).unwrap()),
        Limit::TokenBucket(TokenBucket::new(3, 1, 30 * 86_400_000_000).unwrap()),
    ];
    // Random limits of every algorithm that settles, in turn.
    let settling: Vec<AlgorithmKind> = AlgorithmKind::ALL
        .into_iter()
        .filter(|kind| kind.spec().settles())
        .collect();
    // Draws the random limits and each limit's time scale, apart from each walk's steps.
    let mut drawing = Rng(0x005e_771e_0000);
    for i in 0..12 {
        let kind = settling[i % settling.len()];
        if let GlobalLimit::Slot(limit) = random_limit(&mut drawing, kind) {
            limits.push(limit);
        }
    }
    let (mut expired_settles, mut debts_carried) = (0, 0);
    let (mut total_settled, mut total_changed) = (0, 0);
    for (n, limit) in limits.into_iter().enumerate() {
        let mut rng = Rng(0x5e771e + n as u64);
        let mut pair = SlotPair::new(&redis, limit.clone(), format!("settle-{n}"));
        let max = limit.max_cost();
        let scale = random_scale(&mut drawing, &GlobalLimit::Slot(limit.clone()));
        let mut now = base;
        // Reservations not settled yet: (counted at, units).
        let mut open: Vec<(u64, u64)> = Vec::new();
        let (mut settled, mut changed) = (0, 0);
        for step in 0..600 {
            let ctx = format!("{limit:?} step {step}");
            now += if n < 3 {
                rng.range(0, 400_000)
            } else if rng.chance(90) {
                scale * rng.range(0, 64) / 64 + rng.range(0, 3)
            } else {
                (scale * rng.range(1, 12)).min(3_600_000_000)
            };
            // Expired keys: Redis drops a key once its state carries no information
            // (a millisecond after, at most); then a settle finds none.
            if let Some(state) = pair.state {
                if now >= limit.idle_at_us(state) + 1_000 && rng.chance(60) {
                    pair.expire().await;
                }
            }
            if !open.is_empty() && rng.chance(45) {
                let (counted_at, reserved) =
                    open.swap_remove(rng.range(0, open.len() as u64 - 1) as usize);
                let actual = if n >= 3 && rng.chance(10) {
                    // A debt of many refills or windows, up to what a commit may carry.
                    rng.range(reserved, 1_000_000)
                } else if rng.chance(5) {
                    rng.range(reserved, reserved + 2 * max)
                } else {
                    rng.range(0, 2 * reserved)
                };
                let before = pair.state;
                if before.is_none() && actual > reserved {
                    expired_settles += 1;
                }
                pair.settle(&ctx, now, counted_at, reserved, actual).await;
                settled += 1;
                if pair.state != before {
                    changed += 1;
                }
                if pair
                    .state
                    .is_some_and(|s| limit.idle_at_us(s) > now + 2 * scale)
                {
                    debts_carried += 1;
                }
                continue;
            }
            let cost = rng.range(1, max.min(30));
            let (decision, _) = pair.step(&ctx, now, cost, cost).await;
            if decision.allowed {
                open.push((now, cost));
            }
        }
        // The random limits, and the 30-day bucket deep in debt, settle less.
        assert!(
            n >= 3 || (settled > 80 && changed > 30),
            "{}: {settled} settles, {changed} changed a state",
            limit.kind()
        );
        (total_settled, total_changed) = (total_settled + settled, total_changed + changed);
    }
    eprintln!("{total_settled} settles, {total_changed} changed a state");
    assert!(
        expired_settles > 20 && debts_carried > 50,
        "{expired_settles} excesses settled on expired keys, {debts_carried} debts carried"
    );
    eprintln!("{expired_settles} excesses settled on expired keys, {debts_carried} debts carried");
}

/// Issue 19, defect 4: with Redis's own clock, a key that really expired while a response
/// ran (a full bucket, a window over) is charged the response's excess from a fresh start,
/// as the core charges a key without state.
pub(super) async fn an_expired_key_is_charged_its_excess(backend: Backend) {
    let redis = Redis::start(backend).await;
    let ms = 1_000;
    let limits = [
        Limit::TokenBucket(TokenBucket::new(3, 1, 100 * ms).unwrap()),
        Limit::FixedWindow(FixedWindow::new(3, 150 * ms).unwrap()),
    ];
    for (n, limit) in limits.into_iter().enumerate() {
        let g = GlobalLimit::Slot(limit.clone());
        let descriptor = format!("expired-settle-{n}");
        let inv = invocation(&g, &descriptor, 0, 1, 1);
        let first = redis.run(&inv).await;
        assert!(first.grant.decision.allowed);
        assert!(
            expired(&redis, &inv.keys[..1]),
            "{limit:?}: the key expires"
        );
        // Counted at 1, cost 8: 7 over a fresh key of 3.
        let settle = Invocation::settle(
            &g,
            "weir-test",
            "conformance",
            &[format!("={descriptor}")],
            0,
            Settle {
                counted_at_us: first.now_us,
                reserved: 1,
                actual: 8,
            },
        );
        let (changed, now) = redis.store.run_settle(&settle).await.unwrap();
        let expected = limit.settle(None, first.now_us, 1, 8, now);
        assert!(
            changed && expected.is_some(),
            "{limit:?}: the excess is charged"
        );
        assert_eq!(
            redis.slot_state(limit.kind(), &settle.keys[0]).await,
            expected,
            "{limit:?}: Redis holds (left), the core (right)"
        );
        let after = redis.run(&invocation(&g, &descriptor, 0, 1, 1)).await;
        assert!(
            !after.grant.decision.allowed,
            "{limit:?}: the debt denies the next request"
        );
    }
}
