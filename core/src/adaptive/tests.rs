#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use super::*;

fn adaptive() -> Adaptive {
    Adaptive {
        quantile_ppm: 900_000,
        min_limit: 2,
        initial_limit: 4,
        interval_us: 1_000_000,
        smoothing_ppm: 1_000_000,
        tolerance_ppm: 1_250_000,
        key_controllers: None,
    }
}

#[test]
fn only_upstream_answers_below_400_are_sampled() {
    let upstream = |status| Response {
        status,
        from_upstream: Some(true),
    };
    for status in [100, 200, 204, 301, 304, 399] {
        assert!(measures_service(upstream(status)), "{status}");
    }
    for status in [0, 400, 401, 404, 429, 500, 503, 504] {
        assert!(!measures_service(upstream(status)), "{status}");
    }
    // A local reply, whatever its status (a direct response of 200, weir's 429).
    for status in [200, 429, 503] {
        let local = Response {
            status,
            from_upstream: Some(false),
        };
        assert!(!measures_service(local), "{status}");
    }
    // Where Envoy does not say, the status decides.
    let unknown = |status| Response {
        status,
        from_upstream: None,
    };
    assert!(measures_service(unknown(200)));
    assert!(!measures_service(unknown(503)));
}

#[test]
fn quantiles_are_within_a_bucket_of_the_truth() {
    let mut sketch = LatencySketch::default();
    for ms in 1..=100u64 {
        sketch.record(ms * 1_000);
    }
    for (ppm, truth) in [
        (500_000, 50_000.0),
        (900_000, 90_000.0),
        (990_000, 99_000.0),
    ] {
        let q = sketch.quantile_us(ppm) as f64;
        assert!(q >= truth && q <= truth * 1.1, "p{ppm}: {q} for {truth}");
    }
    assert_eq!(LatencySketch::default().quantile_us(900_000), 0);
    // Extremes land in the end buckets.
    sketch.record(0);
    sketch.record(u64::MAX);
    assert_eq!(sketch.count(), 102);
}

#[test]
fn records_round_trip_and_merge_by_addition() {
    let mut worker = WorkerLatency::new(&adaptive());
    worker.sketch.record(20_000);
    worker.peak_in_flight = 3;
    let merged = SharedRecord::merge(None, &worker, &adaptive(), 100, 10);
    let twice = SharedRecord::merge(Some(merged.clone()), &worker, &adaptive(), 100, 20);
    assert_eq!(twice.sketch.count(), 2);
    assert_eq!(twice.peak_in_flight, 3);
    assert_eq!(SharedRecord::decode(&twice.encode()), Some(twice));
    assert_eq!(SharedRecord::decode(b"short"), None);
}

#[test]
fn a_keys_record_is_free_once_nobody_merged_for_three_intervals_or_3s() {
    let a = adaptive();
    let record = SharedRecord::claimed(7, &a, 1_000_000);
    assert_eq!(SharedRecord::decode(&record.encode()), Some(record.clone()));
    assert_eq!(record.controller.limit(), a.initial_limit);
    assert!(record.free_for(7, &a, 1_000_000), "its own key");
    assert!(
        !record.free_for(8, &a, 3_999_999),
        "another key, while it is active"
    );
    assert!(
        record.free_for(8, &a, 4_000_000),
        "another key, three intervals later"
    );
    assert!(SharedRecord::default().free_for(8, &a, 0), "nobody's");
    // A merge touches it, whatever the interval: with 20 ms intervals it stays its
    // key's for 3 s after the last merge, not 60 ms.
    let short = Adaptive {
        interval_us: 20_000,
        ..a
    };
    let worker = WorkerLatency::new(&short);
    let merged = SharedRecord::merge(Some(record), &worker, &short, 100, 2_000_000);
    assert!(!merged.free_for(8, &short, 4_999_999));
    assert!(merged.free_for(8, &short, 5_000_000));
    assert_eq!(short.forget_after_us(), 2_000_000);
    assert_eq!(a.stale_after_us(), 3_000_000);
}

#[test]
fn a_workers_keys_are_bounded_and_idle_ones_give_way() {
    let entry = |seen: u64, samples: bool| {
        let mut latency = WorkerLatency::new(&adaptive());
        if samples {
            latency.sketch.record(1_000);
        }
        KeyedEntry {
            latency,
            record: Some(0),
            last_seen_us: seen,
        }
    };
    let mut keys = KeyedLatencies::new(2);
    keys.entries.insert((1, 1), entry(10, true));
    keys.entries.insert((2, 2), entry(20, true));
    assert!(!keys.make_room(), "both have samples waiting");
    keys.entries.insert((2, 2), entry(20, false));
    assert!(keys.make_room());
    assert!(!keys.entries.contains_key(&(2, 2)), "the idle one went");
    keys.entries.insert((3, 3), entry(30, false));
    keys.forget_idle(25);
    assert_eq!(
        keys.entries.len(),
        2,
        "(1, 1) has samples, (3, 3) is recent"
    );
    keys.forget_idle(31);
    assert_eq!(keys.entries.keys().collect::<Vec<_>>(), [&(1, 1)]);
}

/// A service that serves `c` at once in `s_us` and queues the rest: the latency at
/// `n` in flight.
fn knee(n: u64, c: u64, s_us: u64) -> u64 {
    s_us * n.max(c) / c
}

fn run(controller: &Adaptive, c: u64, intervals: usize, max: u64) -> Vec<u64> {
    let mut state = controller.start(0);
    let mut limits = Vec::new();
    for i in 0..intervals {
        let n = state.limit();
        let mut sketch = LatencySketch::default();
        for _ in 0..100 {
            sketch.record(knee(n, c, 20_000));
        }
        state = controller.step(state, &sketch, n, max, (i as u64 + 1) * 1_000_000);
        limits.push(state.limit());
    }
    limits
}

#[test]
fn a_saturated_service_settles_the_limit_near_its_knee() {
    // 8 at once, 20 ms each; load always above the limit.
    let limits = run(&adaptive(), 8, 60, 200);
    let settled = &limits[30..];
    assert!(
        settled.iter().all(|&l| (8..=16).contains(&l)),
        "limits {limits:?}"
    );
}

#[test]
fn the_limit_stays_within_min_and_max() {
    let limits = run(&adaptive(), 1_000, 40, 12);
    assert_eq!(limits.last(), Some(&12));
    let mut slow = adaptive();
    slow.min_limit = 6;
    slow.initial_limit = 6;
    assert!(run(&slow, 1, 40, 100).iter().all(|&l| l >= 6));
}

#[test]
fn an_idle_interval_changes_nothing() {
    let a = adaptive();
    let state = a.start(0);
    let empty = LatencySketch::default();
    let next = a.step(state, &empty, 0, 100, 1_000_000);
    assert_eq!(next.limit_milli, state.limit_milli);
    // Samples, but the demand far below the limit: no growth, no shrink.
    let mut sketch = LatencySketch::default();
    for _ in 0..20 {
        sketch.record(500_000);
    }
    let mut state = a.start(0);
    state.limit_milli = 50_000;
    state.baseline_us = 10_000;
    let next = a.step(state, &sketch, 3, 100, 1_000_000);
    assert_eq!(next.limit_milli, 50_000);
}

#[test]
fn a_lasting_slowdown_is_learnt_at_the_floor() {
    // The service served 8 at once in 20 ms; now it takes 60 ms.
    let a = adaptive();
    let mut state = a.start(0);
    let sketch_of = |latency_us: u64| {
        let mut sketch = LatencySketch::default();
        for _ in 0..20 {
            sketch.record(latency_us);
        }
        sketch
    };
    for i in 0..20 {
        let n = state.limit();
        state = a.step(state, &sketch_of(knee(n, 8, 20_000)), n, 100, i);
    }
    let before = state.baseline_us;
    assert!(before < 22_000, "{state:?}");
    let mut limits = Vec::new();
    for i in 20..80 {
        let n = state.limit();
        state = a.step(state, &sketch_of(knee(n, 8, 60_000)), n, 100, i);
        limits.push(state.limit());
    }
    // Down to the floor, where the new latency becomes the baseline, then back up
    // to the same knee.
    assert!(limits.contains(&a.min_limit), "{limits:?}");
    assert!(state.baseline_us > 55_000, "{state:?}");
    assert!((8..=16).contains(&state.limit()), "{limits:?}");
}

#[test]
fn parameters_are_checked() {
    let mut a = adaptive();
    assert!(a.check(100).is_ok());
    a.initial_limit = 101;
    assert_eq!(a.check(100).unwrap_err().field, "adaptive.initial");
    a = adaptive();
    a.tolerance_ppm = 900_000;
    assert_eq!(a.check(100).unwrap_err().field, "adaptive.tolerance");
}
