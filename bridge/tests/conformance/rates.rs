//! A `gcra` rule whose rate each request gives (issue 36): the key's state in Redis keeps
//! the emission interval it was counted in, and a request carrying another rate reads
//! what the key owes in its own (`Gcra::tat_in_own_interval`). Random walks over keys
//! whose requests switch among a few rates (one burst and period, as a tenant's claim
//! gives them), deciding each request in Lua and in the core: every field and the state
//! written agree, the interval included.

use super::common::{future_base, Backend, Redis, Rng};
use super::{random_limit, random_scale, walk_clock, SlotPair};
use weir_protocol::algorithms::gcra::Gcra;
use weir_protocol::algorithms::{AlgorithmKind, Ask, GlobalLimit, Limit};
use weir_testkit::scenarios::T0;

/// Limits a walk's key switches among: `rates` of the same burst and period, each one
/// the script computes exactly (`check_script_exact`), so that what a key owes under one
/// stays exact under any other.
fn rates_of(rng: &mut Rng) -> Vec<Limit> {
    loop {
        let GlobalLimit::Slot(Limit::Gcra(first)) = random_limit(rng, AlgorithmKind::Gcra) else {
            continue;
        };
        let (burst, period_us) = (first.burst(), first.period_us());
        let limits: Vec<Limit> = (0..rng.range(2, 4))
            .filter_map(|_| {
                let rate = if rng.chance(4) {
                    rng.range(1, 1 << 20)
                } else {
                    rng.range(1, 40)
                };
                let limit = Limit::Gcra(Gcra::new(burst, rate, period_us).ok()?);
                let global = GlobalLimit::Slot(limit.clone());
                global.algorithm().check_script_exact().ok()?;
                Some(limit)
            })
            .collect();
        if limits.len() >= 2 {
            return limits;
        }
    }
}

/// Walks keys for `steps` requests; returns how many read a TAT counted in another
/// interval that the key still owed.
async fn rated_walk(redis: &Redis, seed: u64, steps: usize) -> u64 {
    let mut rng = Rng(seed);
    let mut rescaled = 0;
    let base = future_base(T0) + rng.range(0, 86_400_000_000);
    let mut done = 0;
    let mut key_no = 0;
    while done < steps {
        let limits = rates_of(&mut rng);
        let mut carried = 0;
        let first = GlobalLimit::Slot(limits[0].clone());
        let scale = random_scale(&mut rng, &first);
        let descriptor = format!("rated-{seed}-{key_no}");
        key_no += 1;
        let mut now = base + rng.range(0, scale * 3);
        let mut pair = SlotPair::new(redis, limits[0].clone(), descriptor);
        pair.keeps_interval = true;
        for _ in 0..rng.range(50, 200) {
            // The tenant's rate changes now and then: its requests carry the new one.
            if rng.chance(8) {
                carried = rng.range(0, limits.len() as u64 - 1) as usize;
                pair.carry(limits[carried].clone());
            }
            now = walk_clock(&mut rng, now, base, scale);
            let max_cost = GlobalLimit::Slot(limits[carried].clone()).max_cost();
            let cost = if rng.chance(5) {
                0
            } else {
                rng.range(1, max_cost.min(12))
            };
            let (reserve, horizon_us) = if rng.chance(3) {
                (
                    rng.range(1, 40),
                    (scale * rng.range(0, 256) / 64).min(10_000_000),
                )
            } else {
                (0, 0)
            };
            let ask = Ask {
                cost,
                want: cost + rng.range(0, 8),
                reserve,
                ttl_us: (scale * rng.range(0, 128) / 64).min(3_600_000_000),
                horizon_us,
            };
            if let (Some(state), Limit::Gcra(own)) = (pair.state, &limits[carried]) {
                let owes = state.a > now * 1_000;
                rescaled += u64::from(owes && state.b != own.emission_interval_ns());
            }
            let ctx = format!("seed {seed} step {done} carrying {:?}", limits[carried]);
            pair.step_ask(&ctx, now, ask).await;
            done += 1;
        }
    }
    rescaled
}

pub(super) async fn changing_rates_agree(backend: Backend) {
    let redis = Redis::start(backend).await;
    let mut rescaled = 0;
    for seed in 0..6 {
        rescaled += rated_walk(&redis, 0x7a7e_0000 + seed, 500).await;
    }
    println!("{rescaled} requests read a TAT counted at another rate");
    assert!(rescaled >= 100, "{rescaled}: the walks barely change rates");
}
