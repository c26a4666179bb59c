//! A key whose limit changes keeps its state (a reload with a new rate or capacity;
//! issue 36 adds limits that come with the request): over a stretch in which one limit
//! is in force its own bound holds, and across a change the bound of the larger one.
//! What each slot algorithm keeps: a bucket its tokens, capped by the new capacity; a
//! window its count (above a lowered limit, a debt the next windows carry); a GCRA the
//! units its TAT owes, each as long as the new emission interval
//! ([`Gcra::tat_in_own_interval`](weir_core::algorithms::gcra::Gcra::tat_in_own_interval)).
//!
//! The walks are generic over every slot algorithm, drawn through its spec: each count
//! parameter (a rate, a burst, a capacity, a refill, a limit) may change, the durations
//! stay (a window of another length is another key's windows).

use crate::support;

use support::{Rng, T0};

use weir_core::algorithms::{AlgorithmKind, AlgorithmSpec, GlobalLimit, Limit, SlotState, Unit};
use weir_core::conformance::{check, check_each_limit, Admission};

/// The limit of `spec` with `values` (in its parameter order), if they are valid.
fn build(spec: &AlgorithmSpec, values: &[u64]) -> Option<Limit> {
    match (spec.build)(values) {
        Ok(GlobalLimit::Slot(limit)) => Some(limit),
        _ => None,
    }
}

/// Two valid limits of `spec`: the same durations, each count parameter drawn apart
/// (or kept) in the second.
fn two_limits(rng: &mut Rng, spec: &AlgorithmSpec) -> Option<(Vec<u64>, Vec<u64>)> {
    let count = |rng: &mut Rng, optional: bool| {
        let floor = u64::from(!optional);
        floor + rng.below(40)
    };
    let first: Vec<u64> = spec
        .parameters
        .iter()
        .map(|p| match p.unit {
            Unit::Count => count(rng, p.default.is_some()),
            Unit::Duration => 1_000 + rng.below(2_000_000),
        })
        .collect();
    let second: Vec<u64> = spec
        .parameters
        .iter()
        .zip(&first)
        .map(|(p, &v)| match p.unit {
            Unit::Count if rng.below(3) > 0 => count(rng, p.default.is_some()),
            _ => v,
        })
        .collect();
    (build(spec, &first).is_some() && build(spec, &second).is_some()).then_some((first, second))
}

/// One walk of `spec`: requests of 1–3 units at random gaps, the limit switching
/// between two drawn ones now and then. Err: what broke which bound.
fn walk(rng: &mut Rng, spec: &AlgorithmSpec) -> Result<usize, String> {
    let Some((first, second)) = two_limits(rng, spec) else {
        return Ok(0);
    };
    let limits = [first, second];
    let built: Vec<GlobalLimit> = limits
        .iter()
        .filter_map(|v| build(spec, v))
        .map(GlobalLimit::Slot)
        .collect();
    let mut state: Option<SlotState> = None;
    let mut now = T0;
    let mut in_force = 0;
    // Each admission with the limit its request carried: the checker judges each stretch
    // by its own limit and all of them by the larger.
    let mut all = Vec::new();
    let gap = 1 + rng.below(200_000);
    for _ in 0..300 {
        now += rng.below(gap);
        if rng.below(15) == 0 {
            in_force = 1 - in_force;
        }
        let cost = 1 + rng.below(3);
        let limit = built[in_force].as_slot().ok_or("a slot limit")?;
        let (decision, next) = limit.decide(state, now, cost);
        if decision.allowed {
            all.push((built[in_force].clone(), Admission { at_us: now, cost }));
        }
        state = next.or(state);
    }
    check_each_limit(&all).map_err(|v| {
        format!(
            "limits {:?} and {:?}: {}",
            limits[0],
            limits[1],
            v.map_or("not one algorithm".to_string(), |v| v.to_string())
        )
    })?;
    Ok(all.len())
}

#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn a_limit_that_changes_keeps_the_larger_bound_across_and_its_own_within() {
    let mut admitted = 0;
    for kind in AlgorithmKind::ALL {
        let spec = kind.spec();
        if spec.global_only.is_some() {
            continue;
        }
        for seed in 1..=400u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ kind as u64);
            admitted +=
                walk(&mut rng, spec).unwrap_or_else(|e| panic!("{} seed {seed}: {e}", spec.name));
        }
    }
    assert!(admitted > 10_000, "{admitted} admissions in all");
}

/// The reload that found it: a GCRA key takes its whole burst at 100/s (burst 10), and
/// the rate is lowered to 10/s at that instant. The TAT, 110 ms ahead, read in the new
/// emission interval of 100 ms, looked like one unit owed of a burst of 11, and 9 more
/// were admitted at once: 20 units at one instant, where either limit allows 11. Now the
/// 11 units stay owed. Until the key's next admission its TAT is the fast schedule's
/// (a denial writes nothing), so at 100 ms one unit is still owed, and the slow limit
/// admits 10: 21 units in 100 ms, the fast limit's bound exactly; from then on the slow
/// schedule, one every 100 ms.
#[cfg_attr(not(target_arch = "wasm32"), test)]
#[cfg_attr(target_arch = "wasm32", wasm_bindgen_test::wasm_bindgen_test)]
fn a_gcra_rate_lowered_after_a_burst_admits_nothing_more_at_once() {
    let spec = AlgorithmKind::Gcra.spec();
    const MS: u64 = 1_000;
    // rate, period (µs), burst.
    let fast = build(spec, &[100, 1_000_000, 10]).unwrap();
    let slow = build(spec, &[10, 1_000_000, 10]).unwrap();
    let mut state = None;
    let mut admissions = Vec::new();
    let mut take = |limit: &Limit, at_us: u64, tries: usize| {
        let mut admitted = 0;
        for _ in 0..tries {
            let (decision, next) = limit.decide(state, at_us, 1);
            if decision.allowed {
                admissions.push(Admission { at_us, cost: 1 });
                admitted += 1;
            }
            state = next.or(state);
        }
        admitted
    };
    assert_eq!(take(&fast, T0, 20), 11, "the fast limit's burst");
    assert_eq!(take(&slow, T0, 20), 0, "nothing more at once");
    assert_eq!(take(&slow, T0 + 100 * MS, 20), 10);
    assert_eq!(take(&slow, T0 + 200 * MS - 1, 5), 0);
    assert_eq!(take(&slow, T0 + 200 * MS, 5), 1, "the slow schedule");
    check(&GlobalLimit::Slot(fast), &admissions).unwrap();
}

/// The same through the engine and its slot table in shared data: a reload (a new
/// engine over the same store, as a new plugin config over the same Wasm VM's shared
/// data) that lowers a GCRA rule's rate keeps what the key owes.
#[cfg(not(target_arch = "wasm32"))]
#[test]
fn a_reload_that_lowers_a_gcra_rate_keeps_what_each_key_owes() {
    use support::{engine, evaluate, user};
    use weir_core::store::memory::MemoryStore;
    let rule = |rate: u64| {
        engine(&format!(
            r#"{{"rules":[{{"name":"api","key":[{{"header":"x-user"}}],
            "limit":{{"algorithm":"gcra","rate":{rate},"period":"1s","burst":10}}}}]}}"#
        ))
    };
    let (before, after) = (rule(100), rule(10));
    let store = MemoryStore::new();
    before.prepare(&store).unwrap();
    let admitted = |e: &weir_core::engine::Engine, at_us: u64, tries: usize| {
        (0..tries)
            .filter(|_| !evaluate(e, &store, &user("acme"), at_us).denied())
            .count()
    };
    assert_eq!(admitted(&before, T0, 20), 11);
    after.prepare(&store).unwrap();
    assert_eq!(admitted(&after, T0, 20), 0, "nothing more at once");
    assert_eq!(admitted(&after, T0 + 100_000, 20), 10);
    assert_eq!(admitted(&after, T0 + 199_999, 5), 0);
    assert_eq!(admitted(&after, T0 + 200_000, 5), 1);
    // Another key starts on the new limit: its own burst of 11.
    let fresh = (0..20)
        .filter(|_| !evaluate(&after, &store, &user("other"), T0).denied())
        .count();
    assert_eq!(fresh, 11);
}
