//! What the conformance tests share (`conformance.rs`, `conformance_properties.rs`):
//! limits by algorithm, the bounds read straight from their definitions (brute force),
//! the recomputation of a reported violation, and a central limiter to replay schedules
//! on.

use weir_core::algorithms::{
    fixed_window::FixedWindow, gcra::Gcra, sliding_log::SlidingLog, sliding_window::SlidingWindow,
    token_bucket::TokenBucket, AlgorithmKind, GlobalLimit, Limit, SlotState, Unit,
};
use weir_core::conformance::{check, Admission, Violation};

/// A limit of `kind` built through its spec from drawn values, whatever the algorithm:
/// its count parameters from `counts`, its durations (µs) from `durations`, in the order
/// its spec lists them; with its natural time scale (µs), how long an emptied key takes
/// to be fresh again (its policy's window). `None` when the algorithm refuses the values.
/// The property tests draw limits of every kind through it, so a new algorithm is drawn
/// without a generator of its own.
pub fn drawn_limit(
    kind: AlgorithmKind,
    counts: &[u64],
    durations: &[u64],
) -> Option<(GlobalLimit, u64)> {
    let (mut counts, mut durations) = (counts.iter(), durations.iter());
    let values: Option<Vec<u64>> = kind
        .spec()
        .parameters
        .iter()
        .map(|p| match p.unit {
            Unit::Count => counts.next().copied(),
            Unit::Duration => durations.next().copied(),
        })
        .collect();
    let limit = GlobalLimit::build(kind, &values?).ok()?;
    let scale = limit.policy().window_ns.div_ceil(1_000).max(1);
    Some((limit, scale))
}

pub fn gcra(burst: u64, rate: u64, period_us: u64) -> GlobalLimit {
    GlobalLimit::Slot(Limit::Gcra(Gcra::new(burst, rate, period_us).unwrap()))
}

pub fn token_bucket(capacity: u64, refill: u64, period_us: u64) -> GlobalLimit {
    GlobalLimit::Slot(Limit::TokenBucket(
        TokenBucket::new(capacity, refill, period_us).unwrap(),
    ))
}

pub fn fixed_window(limit: u64, window_us: u64) -> GlobalLimit {
    GlobalLimit::Slot(Limit::FixedWindow(
        FixedWindow::new(limit, window_us).unwrap(),
    ))
}

pub fn sliding_window(limit: u64, window_us: u64) -> GlobalLimit {
    GlobalLimit::Slot(Limit::SlidingWindow(
        SlidingWindow::new(limit, window_us).unwrap(),
    ))
}

pub fn sliding_log(limit: u64, window_us: u64) -> GlobalLimit {
    GlobalLimit::SlidingLog(SlidingLog::new(limit, window_us).unwrap())
}

pub fn at(at_us: u64, cost: u64) -> Admission {
    Admission { at_us, cost }
}

/// The admissions as the checker indexes them: sorted stably by time.
pub fn sorted(admissions: &[Admission]) -> Vec<Admission> {
    let mut sorted = admissions.to_vec();
    sorted.sort_by_key(|a| a.at_us);
    sorted
}

pub fn sum(admissions: &[Admission]) -> u128 {
    admissions.iter().map(|a| u128::from(a.cost)).sum()
}

/// `(S_j − S_(i−1))` and the bound's own measure of how far it goes beyond the allowance
/// for the stretch `i..=j` (GCRA in ns, the token bucket in units), for the algorithms
/// whose violations are stretches.
pub fn stretch_excess(limit: &GlobalLimit, s: &[Admission], i: usize, j: usize) -> i128 {
    let admitted = sum(&s[i..=j]) as i128;
    let (from, to) = (s[i].at_us, s[j].at_us);
    match limit {
        GlobalLimit::Slot(Limit::Gcra(g)) => {
            let t = i128::from(g.emission_interval_ns());
            admitted * t - i128::from(g.tolerance_ns()) - i128::from(to - from) * 1_000
        }
        GlobalLimit::Slot(Limit::TokenBucket(b)) => {
            let instants = (to - from).div_ceil(b.period_us());
            admitted - i128::from(b.capacity()) - i128::from(b.refill()) * i128::from(instants)
        }
        _ => unreachable!("windows are not stretches"),
    }
}

/// Whether the admissions up to and including `j` (sorted) break the bound at `j`,
/// straight from CONFORMANCE.md's table, in O(n) per `j`.
pub fn breaks_at(limit: &GlobalLimit, s: &[Admission], j: usize) -> bool {
    let t = s[j].at_us;
    match limit {
        GlobalLimit::Slot(Limit::Gcra(_) | Limit::TokenBucket(_)) => {
            (0..=j).any(|i| stretch_excess(limit, s, i, j) > 0)
        }
        GlobalLimit::Slot(Limit::FixedWindow(w)) => {
            let k = t / w.window_us();
            let inside: Vec<Admission> = s[..=j]
                .iter()
                .filter(|a| a.at_us / w.window_us() == k)
                .copied()
                .collect();
            sum(&inside) > u128::from(w.limit())
        }
        GlobalLimit::SlidingLog(l) => {
            let inside: Vec<Admission> = s[..=j]
                .iter()
                .filter(|a| u128::from(a.at_us) + u128::from(l.window_us()) > u128::from(t))
                .copied()
                .collect();
            sum(&inside) > u128::from(l.limit())
        }
        GlobalLimit::Slot(Limit::SlidingWindow(w)) => {
            let width = w.window_us();
            let k = t / width;
            let in_window = |a: &&Admission, n: u64| a.at_us / width == n;
            let prev: Vec<Admission> = s
                .iter()
                .filter(|a| k > 0 && in_window(a, k - 1))
                .copied()
                .collect();
            let cur: Vec<Admission> = s[..=j]
                .iter()
                .filter(|a| in_window(a, k))
                .copied()
                .collect();
            let e = u128::from(t % width);
            sum(&prev) * (u128::from(width) - e) + sum(&cur) * u128::from(width)
                > u128::from(w.limit()) * u128::from(width)
        }
    }
}

/// Recomputes a reported violation from the definitions: its admissions really exceed
/// the bound there, `admitted` and `allowed` say so, and `first` is the start the
/// module docs promise.
pub fn assert_real(limit: &GlobalLimit, admissions: &[Admission], v: &Violation) {
    let s = sorted(admissions);
    let (first, last) = (v.first, v.last);
    assert!(first <= last && last < s.len(), "{v:?}");
    let admitted = sum(&s[first..=last]);
    assert_eq!(
        u128::from(v.admitted),
        admitted.min(u128::from(u64::MAX)),
        "{v}"
    );
    let allowed: u128 = v.allowed.parse().unwrap();
    assert!(admitted > allowed, "{v}");
    assert_eq!(v.to_string(), v.message);
    assert!(
        v.message.starts_with(limit.kind().name()),
        "the message names the algorithm: {v}"
    );
    let (from, to) = (s[first].at_us, s[last].at_us);
    match limit {
        GlobalLimit::Slot(Limit::Gcra(g)) => {
            let t = u128::from(g.emission_interval_ns());
            let span_ns = u128::from(to - from) * 1_000;
            assert_eq!(allowed, (u128::from(g.tolerance_ns()) + span_ns) / t, "{v}");
            assert!(admitted * t > u128::from(g.tolerance_ns()) + span_ns, "{v}");
        }
        GlobalLimit::Slot(Limit::TokenBucket(b)) => {
            let instants = u128::from((to - from).div_ceil(b.period_us()));
            let bound = u128::from(b.capacity()) + u128::from(b.refill()) * instants;
            assert_eq!(allowed, bound, "{v}");
        }
        GlobalLimit::Slot(Limit::FixedWindow(w)) => {
            let k = to / w.window_us();
            assert_eq!(from / w.window_us(), k, "one window: {v}");
            assert!(first == 0 || s[first - 1].at_us / w.window_us() < k, "{v}");
            assert_eq!(allowed, u128::from(w.limit()), "{v}");
        }
        GlobalLimit::SlidingLog(l) => {
            let leaves = |a: &Admission| u128::from(a.at_us) + u128::from(l.window_us());
            assert!(leaves(&s[first]) > u128::from(to), "one log window: {v}");
            assert!(first == 0 || leaves(&s[first - 1]) <= u128::from(to), "{v}");
            assert_eq!(allowed, u128::from(l.limit()), "{v}");
        }
        GlobalLimit::Slot(Limit::SlidingWindow(w)) => {
            let width = w.window_us();
            // Window numbers in u128: with 1 µs windows, u64::MAX + 1 is a window too.
            let window = |a: &Admission| u128::from(a.at_us / width);
            let k = window(&s[last]);
            // All of window k − 1 (if it has admissions), then window k up to `last`.
            assert!(s[first..=last].iter().all(|a| window(a) + 1 >= k), "{v}");
            assert!(
                first == 0 || window(&s[first - 1]) < window(&s[first]),
                "{v}"
            );
            assert!(window(&s[first]) + 1 == k || first == 0 || window(&s[first - 1]) + 2 <= k);
            let prev = sum(&s[first..=last]
                .iter()
                .filter(|a| window(a) + 1 == k)
                .copied()
                .collect::<Vec<_>>());
            let cur = admitted - prev;
            let (w128, e) = (u128::from(width), u128::from(to % width));
            assert!(
                prev * (w128 - e) + cur * w128 > u128::from(w.limit()) * w128,
                "{v}"
            );
            assert_eq!(allowed, u128::from(w.limit()) + prev * e / w128, "{v}");
        }
    }
}

/// Checks, expecting a violation over `first..=last` with `admitted` and `allowed`.
pub fn expect_violation(
    limit: &GlobalLimit,
    admissions: &[Admission],
    (first, last): (usize, usize),
    admitted: u64,
    allowed: &str,
) -> Violation {
    let v = check(limit, admissions).unwrap_err();
    assert_eq!(
        (v.first, v.last, v.admitted, v.allowed.as_str()),
        (first, last, admitted, allowed),
        "{v}"
    );
    assert_real(limit, admissions, &v);
    v
}

/// A single central limiter: the core's algorithm with one state for the key (an event
/// list for the sliding log). A `skew` makes it a mutant that decides with a clock
/// `skew` µs off the one the admissions (and the log's events) are recorded with.
pub struct Central {
    limit: GlobalLimit,
    state: Option<SlotState>,
    events: Vec<u64>,
    skew: i64,
    pub admitted: Vec<Admission>,
}

impl Central {
    pub fn new(limit: &GlobalLimit) -> Self {
        Self::skewed(limit, 0)
    }

    pub fn skewed(limit: &GlobalLimit, skew: i64) -> Self {
        Central {
            limit: limit.clone(),
            state: None,
            events: Vec::new(),
            skew,
            admitted: Vec::new(),
        }
    }

    /// Grants `cost` to `want` units at `now`, as many as fit; `None` when denied.
    /// Granted units are not recorded: [`Central::request`] spends them at once, a test
    /// that leases spends them when it says.
    pub fn grant(&mut self, now: u64, cost: u64, want: u64) -> Option<u64> {
        let decided_at = now.checked_add_signed(self.skew).unwrap();
        match &self.limit {
            GlobalLimit::Slot(limit) => {
                let (decision, granted, next) = if want == cost {
                    let (d, next) = limit.decide(self.state, decided_at, cost);
                    (d, cost, next)
                } else {
                    limit.acquire(self.state, decided_at, cost, want)
                };
                if next.is_some() {
                    self.state = next;
                }
                decision.allowed.then_some(granted)
            }
            GlobalLimit::SlidingLog(log) => {
                let (decision, granted) = log.acquire(&self.events, decided_at, cost, want);
                self.events
                    .extend(std::iter::repeat_n(now, usize::try_from(granted).unwrap()));
                decision.allowed.then_some(granted)
            }
        }
    }

    /// A request decided and spent at `now`, taking up to `want` units.
    pub fn request(&mut self, now: u64, cost: u64, want: u64) -> bool {
        match self.grant(now, cost, want) {
            Some(granted) => {
                self.admitted.push(at(now, granted));
                true
            }
            None => false,
        }
    }

    /// Requests of cost 1 at `now` until one is denied: what a burst gets.
    pub fn burst(&mut self, now: u64) -> u64 {
        let mut n = 0;
        while self.request(now, 1, 1) {
            n += 1;
            assert!(n <= 1_000, "a burst that never ends");
        }
        n
    }

    /// The instant from which the key's state says nothing any more.
    pub fn idle_at(&self) -> u64 {
        match (&self.limit, self.state) {
            (GlobalLimit::Slot(limit), Some(state)) => limit.idle_at_us(state),
            (GlobalLimit::SlidingLog(log), _) => {
                self.events.last().map_or(0, |&t| t + log.window_us())
            }
            (_, None) => 0,
        }
    }
}

/// The bound docs/algorithms.md states for estimates below the usage ("Estimates below
/// the usage"), for `limit`: each request placed at its admission with its cost up to its
/// estimate and its excess where its commit lands, the placements keep the algorithm's
/// own bound with the limit grown by the excess in flight — and a fixed window, whose
/// debt is carried, also the bound of the token bucket it is with debt (its limit
/// refilled at every window), grown the same way. `commit_lying.rs` and the budget arm of
/// `search_hostile.rs` judge by it.
pub fn lying_bound(limit: &Limit, in_flight: u64) -> Vec<GlobalLimit> {
    match limit {
        Limit::TokenBucket(b) => vec![GlobalLimit::Slot(Limit::TokenBucket(
            TokenBucket::new(b.capacity() + in_flight, b.refill(), b.period_us()).unwrap(),
        ))],
        Limit::FixedWindow(w) => vec![
            GlobalLimit::Slot(Limit::FixedWindow(
                FixedWindow::new(w.limit() + in_flight, w.window_us()).unwrap(),
            )),
            GlobalLimit::Slot(Limit::TokenBucket(
                TokenBucket::new(w.limit() + in_flight, w.limit(), w.window_us()).unwrap(),
            )),
        ],
        other => panic!("no commit for {other:?}"),
    }
}
