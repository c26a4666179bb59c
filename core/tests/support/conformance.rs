//! What the conformance tests share (`conformance.rs`, `conformance_properties.rs`):
//! limits by algorithm, the bounds read straight from their definitions (brute force, by
//! each algorithm's oracle in weir-testkit), the recomputation of a reported violation,
//! and a central limiter to replay schedules on.

use weir_core::algorithms::{
    fixed_window::FixedWindow, gcra::Gcra, sliding_log::SlidingLog, sliding_window::SlidingWindow,
    token_bucket::TokenBucket, AlgorithmKind, GlobalLimit, Limit, SlotState, Unit,
};
use weir_core::conformance::{check, Admission, Violation};
use weir_testkit::oracles::{self, oracle};

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
    oracles::sum(admissions)
}

/// Whether the admissions up to and including `j` (sorted) break the bound at `j`, read
/// from the definition by the algorithm's oracle (weir-testkit's `oracles`).
pub fn breaks_at(limit: &GlobalLimit, s: &[Admission], j: usize) -> bool {
    oracle(limit).breaks_at(s, j)
}

/// Recomputes a reported violation from the definitions: its admissions really exceed
/// the bound there, `admitted` and `allowed` say so, and `first` is the start the
/// module docs promise (the algorithm's part asked of its oracle).
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
    oracle(limit).check_violation(&s, v, admitted, allowed);
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
