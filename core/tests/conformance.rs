//! The conformance checker (`weir_core::conformance`): hand-computed tables and worked
//! examples of mutants (natively and under wasm32), then properties (natively, with
//! proptest): a single central limiter never violates its bound, deliberate mutants
//! always do, and the checker agrees with a brute-force reading of the bounds.
//!
//! Every violation the checker reports is recomputed here from its definition: the sum
//! over `first..=last` of the sorted admissions really exceeds the bound there.

// Test code: a failed expectation is meant to panic, helpers included.

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use crate::support::conformance as checked;

use checked::*;
use weir_core::conformance::check;
use weir_testkit::scenarios::{S_US, T0};

// ---------------------------------------------------------------------------------
// Tables: a schedule exactly at the bound passes; one unit more fails, where expected.
// ---------------------------------------------------------------------------------

#[test]
fn nothing_and_zero_costs_conform() {
    // Stretches start where the excess is largest, the latest such start, so past a
    // leading zero; windows report the whole window.
    for (limit, first) in [
        (gcra(0, 1, S_US), 1),
        (token_bucket(1, 1, S_US), 1),
        (fixed_window(1, S_US), 0),
        (sliding_window(1, S_US), 0),
        (sliding_log(1, S_US), 0),
    ] {
        assert_eq!(check(&limit, &[]), Ok(()));
        assert_eq!(check(&limit, &[at(T0, 0); 100]), Ok(()));
        assert_eq!(check(&limit, &[at(T0, 0), at(T0, 1), at(T0, 0)]), Ok(()));
        let v = expect_violation(
            &limit,
            &[at(T0, 0), at(T0, 1), at(T0, 1)],
            (first, 2),
            2,
            "1",
        );
        assert!(
            v.message.contains(&format!("admissions {first}..=2 (of 3")),
            "{v}"
        );
    }
}

#[test]
fn gcra_table() {
    // Burst 2 at 1 per second: T = 1 s, τ = 3 s. Three at once, then one a second.
    let limit = gcra(2, 1, S_US);
    let mut schedule = vec![at(T0, 3), at(T0 + S_US, 1), at(T0 + 2 * S_US, 1)];
    assert_eq!(check(&limit, &schedule), Ok(()));
    // One more at 2 s: 6 units in 2 s where ⌊(3 s + 2 s) / 1 s⌋ = 5 fit.
    schedule.push(at(T0 + 2 * S_US, 1));
    let v = expect_violation(&limit, &schedule, (0, 3), 6, "5");
    assert_eq!(
        v.message,
        "gcra (rate 1, period 1000000us, burst 2): admissions 0..=3 (of 4, sorted by time), \
         decided from 1700000000000000us to 1700000002000000us (2000000us), add up to 6 \
         units where the bound allows 5: 6 × T (1000000000ns) is more than τ \
         (3000000000ns) + 2000000000ns"
    );
    // The same admissions in any order: indices are into the sorted list.
    let mut shuffled = schedule.clone();
    shuffled.reverse();
    assert_eq!(check(&limit, &shuffled), Err(v));

    // Exactly at the rate, every stretch ties: the shortest is reported.
    let drip = gcra(0, 1, S_US);
    let mut schedule = vec![at(T0, 1), at(T0 + S_US, 1), at(T0 + 2 * S_US, 1)];
    assert_eq!(check(&drip, &schedule), Ok(()));
    schedule.push(at(T0 + 2 * S_US, 1));
    expect_violation(&drip, &schedule, (2, 3), 2, "1");

    // T is not a whole µs (3 per second: T = 333_333_333 ns, τ = 999_999_999 ns). The
    // bound is in ns, like the central TAT: a fourth unit 333_334 µs after a burst of 3
    // fits with 667 ns to spare; 1 µs earlier it does not.
    let limit = gcra(2, 3, S_US);
    assert_eq!(check(&limit, &[at(T0, 3), at(T0 + 333_334, 1)]), Ok(()));
    expect_violation(&limit, &[at(T0, 3), at(T0 + 333_333, 1)], (0, 1), 4, "3");
}

#[test]
fn gcra_spent_away_from_where_counted_breaks_the_bound() {
    // CONFORMANCE.md's displacement: burst 0, one per T; units counted at 0 and T but
    // spent at T/2 and T are two admissions in half a period.
    let limit = gcra(0, 1, S_US);
    let mut central = Central::new(&limit);
    assert_eq!(central.grant(T0, 1, 1), Some(1));
    assert_eq!(central.grant(T0 + S_US, 1, 1), Some(1));
    let spent = [at(T0 + S_US / 2, 1), at(T0 + S_US, 1)];
    expect_violation(&limit, &spent, (0, 1), 2, "1");
}

#[test]
fn token_bucket_table() {
    // Capacity 3, 2 more every ms. The phase of the refills is unknown, so any ms may
    // hold one: 3 at 999 µs and 2 at 1000 µs are C + R within 1 µs, and allowed.
    let limit = token_bucket(3, 2, 1_000);
    let mut schedule = vec![
        at(T0 + 999, 3),
        at(T0 + 1_000, 2),
        at(T0 + 2_000, 2),
        at(T0 + 2_999, 0),
        at(T0 + 3_000, 2),
    ];
    // 0..=4: 9 in 2001 µs, 3 refill instants; 1..=4: 6 in 2000 µs, 2; 2..=4: 4 in 1 ms, 1.
    assert_eq!(check(&limit, &schedule), Ok(()));
    schedule.push(at(T0 + 3_000, 1));
    let v = expect_violation(&limit, &schedule, (0, 5), 10, "9");
    assert!(
        v.message.ends_with(
            "capacity 3 + 2 × 3 refill instant(s), the most that any phase of refills every \
             1000us puts in (1700000000000999us, 1700000000003000us]"
        ),
        "{v}"
    );

    // A central bucket does exactly that: drained at T0 + 1 (the phase: refills at
    // T0 + 1 + k ms), full again at T0 + 2001, then C just before the next refill and R
    // just after it. The continuous bound would allow 3 + 2 × 1/1000 in that µs.
    let mut central = Central::new(&limit);
    assert!(central.request(T0 + 1, 3, 3));
    assert_eq!(central.burst(T0 + 3_000), 3);
    assert_eq!(central.burst(T0 + 3_001), 2);
    assert_eq!(check(&limit, &central.admitted), Ok(()));
    let mut over = central.admitted.clone();
    over.push(at(T0 + 3_001, 1));
    expect_violation(&limit, &over, (1, 6), 6, "5");
}

#[test]
fn fixed_window_table() {
    let limit = fixed_window(3, S_US);
    let mut schedule = vec![at(T0 - 1, 3), at(T0, 0), at(T0, 1), at(T0 + S_US - 1, 2)];
    assert_eq!(check(&limit, &schedule), Ok(()));
    schedule.push(at(T0 + 5, 1));
    // Sorted: T0 − 1, T0, T0, T0 + 5, T0 + 1 s − 1: the window's admissions 1..=4.
    let v = expect_violation(&limit, &schedule, (1, 4), 4, "3");
    assert!(
        v.message.ends_with(
            "they are all in the window [1700000000000000us, 1700000001000000us), which \
             holds at most 3"
        ),
        "{v}"
    );
}

#[test]
fn sliding_log_table() {
    // 3 per ms. An event at t counts while now − 1 ms < t: at T0 + 1 ms, T0's has left.
    let limit = sliding_log(3, 1_000);
    let mut schedule = vec![at(T0, 1), at(T0 + 500, 2), at(T0 + 1_000, 1)];
    assert_eq!(check(&limit, &schedule), Ok(()));
    schedule.push(at(T0 + 1_000, 1));
    let v = expect_violation(&limit, &schedule, (1, 3), 4, "3");
    assert!(
        v.message.ends_with(
            "they are all in the log's window (1700000000000000us, 1700000000001000us], \
             which holds at most 3"
        ),
        "{v}"
    );
    // 1 µs earlier, T0's event still counts.
    let early = [at(T0, 1), at(T0 + 500, 2), at(T0 + 999, 1)];
    expect_violation(&limit, &early, (0, 2), 4, "3");
}

#[test]
fn sliding_window_table() {
    // 10 per minute; docs' example: 10 in the last second of a minute, then 15 s into
    // the next one they weigh 10 × 45/60 = 7.5, so 2 more fit and a third does not.
    let limit = sliding_window(10, 60 * S_US);
    let minute = 1_700_000_040_000_000;
    let mut schedule = vec![at(minute - S_US, 10), at(minute + 15 * S_US, 2)];
    assert_eq!(check(&limit, &schedule), Ok(()));
    schedule.push(at(minute + 15 * S_US, 1));
    // 13 where 10 + ⌊10 × 15/60⌋ = 12 are allowed.
    let v = expect_violation(&limit, &schedule, (0, 2), 13, "12");
    assert!(
        v.message.ends_with(
            "at 1700000055000000us, 15000000us into its window, the previous window's 10 \
             units (admissions 0..=0) weigh (60000000 − 15000000)/60000000 and this \
             window's 3 units (admissions 1..=2) count in full: 10 × 45000000 + 3 × \
             60000000 is more than 10 × 60000000"
        ),
        "{v}"
    );
    // With nothing in the previous window, the current one's first admission starts it.
    let alone = [at(minute - 61 * S_US, 10), at(minute, 6), at(minute + 1, 5)];
    expect_violation(&limit, &alone, (1, 2), 11, "10");
}

#[test]
fn huge_costs_and_times_neither_overflow_nor_panic() {
    let max = u64::MAX;
    let huge = [at(max, max), at(max, max), at(0, max), at(max - 1, 1)];
    let limits = [
        gcra(0, 1, 1),
        gcra(0, 1, 1 << 40),
        token_bucket(max, max, 1),
        token_bucket(max, max, max),
        token_bucket(1, max, 1),
        fixed_window(max, max),
        fixed_window(1, 1),
        sliding_window(u64::from(u32::MAX), max),
        sliding_window(1, 1),
        sliding_log(100_000, max),
        sliding_log(1, 1),
    ];
    for limit in &limits {
        let v = check(limit, &huge).unwrap_err();
        assert_real(limit, &huge, &v);
        // The sum of two u64::MAX costs saturates `admitted`, not the message.
        let two = [at(max, max), at(max, max)];
        if let Err(v) = check(limit, &two) {
            assert_real(limit, &two, &v);
        }
    }
    // A capacity of u64::MAX and refills of u64::MAX every µs: 2 × u64::MAX over 1 µs fit.
    let bucket = token_bucket(max, max, 1);
    assert_eq!(check(&bucket, &[at(max - 1, max), at(max, max)]), Ok(()));
    let v = check(&bucket, &[at(max, max), at(max, max)]).unwrap_err();
    assert_eq!(
        (v.admitted, v.allowed.as_str()),
        (max, "18446744073709551615")
    );
    assert!(
        v.message.contains("add up to 36893488147419103230 units"),
        "{v}"
    );
}

// ---------------------------------------------------------------------------------
// Worked mutants (tables): each breaks the bound where its schedule puts it.
// ---------------------------------------------------------------------------------

#[test]
fn a_burst_one_too_large_breaks_every_bound() {
    let cases = [
        (gcra(4, 1, S_US), gcra(5, 1, S_US), 6),
        (token_bucket(5, 1, S_US), token_bucket(6, 1, S_US), 6),
        (fixed_window(5, S_US), fixed_window(6, S_US), 6),
        (sliding_window(5, S_US), sliding_window(6, S_US), 6),
        (sliding_log(5, S_US), sliding_log(6, S_US), 6),
    ];
    for (limit, mutant, n) in cases {
        let mut central = Central::new(&mutant);
        assert_eq!(central.burst(T0 + 7), n);
        expect_violation(
            &limit,
            &central.admitted,
            (0, n as usize - 1),
            n,
            &(n - 1).to_string(),
        );
    }
}

#[test]
fn a_refill_counted_twice_breaks_the_token_bucket() {
    let limit = token_bucket(5, 2, 1_000);
    let mut mutant = Central::new(&token_bucket(5, 4, 1_000));
    assert_eq!(mutant.burst(T0), 5);
    assert_eq!(mutant.burst(T0 + 1_000), 4);
    // The eighth unit: 8 in 1 ms where 5 + 2 × 1 fit.
    expect_violation(&limit, &mutant.admitted, (0, 7), 8, "7");
}

#[test]
fn a_window_boundary_off_by_one_breaks_the_windows() {
    let window = 1_000;
    let boundary = T0 + window;
    // Windows (kW, (k+1)W]: the mutant counts an admission at (k+1)W in window k.
    let limit = fixed_window(3, window);
    let mut mutant = Central::skewed(&limit, -1);
    assert_eq!(mutant.burst(boundary), 3);
    assert_eq!(mutant.burst(boundary + 1), 3);
    expect_violation(&limit, &mutant.admitted, (0, 3), 4, "3");

    // The log trims one µs early: T0's events leave at T0 + W − 1.
    let limit = sliding_log(3, window);
    let mut mutant = Central::skewed(&limit, 1);
    assert_eq!(mutant.burst(T0), 3);
    assert_eq!(mutant.burst(T0 + window - 1), 3);
    expect_violation(&limit, &mutant.admitted, (0, 3), 4, "3");

    // The counter's windows start 1 µs late: a burst at (k+1)W lands in the mutant's
    // window k, and its weight lets one more in at half a window.
    let limit = sliding_window(4, window);
    let mut mutant = Central::skewed(&limit, -1);
    assert_eq!(mutant.burst(boundary), 4);
    assert_eq!(mutant.burst(boundary + window / 2 + 1), 2);
    expect_violation(&limit, &mutant.admitted, (0, 4), 5, "4");
}

#[test]
fn units_spent_after_their_lease_should_have_expired_break_the_bound() {
    // GCRA, burst 4 at 1 per second: the whole burst leased at T0, the bucket full again
    // at T0 + 5 s, then the saved 5 spent with a fresh 5.
    let limit = gcra(4, 1, S_US);
    let mut central = Central::new(&limit);
    assert_eq!(central.grant(T0, 1, 5), Some(5));
    let full = central.idle_at();
    assert_eq!(full, T0 + 5 * S_US);
    assert_eq!(central.grant(full, 1, 5), Some(5));
    expect_violation(&limit, &[at(full, 5), at(full, 5)], (0, 1), 10, "5");

    // The log: 3 granted at T0 and spent at the end of the next window, T0 + 2W − 1,
    // beside 3 granted at T0 + W.
    let window = 1_000;
    let limit = sliding_log(3, window);
    let mut central = Central::new(&limit);
    assert_eq!(central.grant(T0, 1, 3), Some(3));
    assert_eq!(central.grant(T0 + window - 1, 1, 3), None);
    assert_eq!(central.grant(T0 + window, 1, 3), Some(3));
    let spent = [at(T0 + window, 3), at(T0 + 2 * window - 1, 3)];
    expect_violation(&limit, &spent, (0, 1), 6, "3");
}

#[test]
fn two_hundred_thousand_admissions_check_in_n_log_n() {
    // Not timed: a quadratic checker would take minutes here, this takes milliseconds
    // (in release). Every algorithm, from a central limiter, so the whole list is read.
    let n = 200_000;
    // About the demand (1000 units a second), so that most requests are admitted.
    let limits = [
        gcra(49, 500, S_US),
        token_bucket(100, 7, 9_997),
        fixed_window(1_000, S_US),
        sliding_window(1_000, S_US),
        sliding_log(1_000, S_US),
    ];
    for limit in &limits {
        let mut central = Central::new(limit);
        let mut now = T0;
        let mut i: u64 = 0;
        while central.admitted.len() < n {
            // Steps of 1 to 4_000 µs, so remainders and windows vary.
            i += 1;
            now += 1 + (i * 7_919) % 4_000;
            central.request(now, 1 + i % 3, 1 + i % 3);
        }
        assert_eq!(check(limit, &central.admitted), Ok(()), "{limit:?}");
        // One unit too many at the end is found after all of them.
        let last = central.admitted.last().copied().unwrap();
        let mut over = central.admitted.clone();
        over.push(at(last.at_us, limit.max_cost()));
        let v = check(limit, &over).unwrap_err();
        assert_eq!(v.last, n, "{v}");
    }
}
