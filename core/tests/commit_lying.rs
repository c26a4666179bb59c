//! Estimates below the usage, as a random search: each request placed at its admission
//! with its cost up to its estimate and its excess placed where its commit lands keeps
//! the algorithm's bound grown by the excess in flight at once (docs/algorithms.md,
//! "Estimates below the usage"); a fixed window, which carries its debt, keeps that of a
//! token bucket refilled with its limit at every window too. Deliberate mutants of the
//! debt must break it. Estimates that are upper bounds: `commit.rs`.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::collections::BTreeMap;

use support::commits::{committed_rule, local, log_uniform, settling_limit, SettlingLimit};
use support::conformance::lying_bound;
use support::{evaluate, user, Rng, T0};
use weir_core::algorithms::{Limit, SlotState};
use weir_core::conformance::{self, Admission};
use weir_core::engine::{Engine, PendingCommit};
use weir_core::store::memory::MemoryStore;
use weir_core::time::Micros;

/// How a key is driven in [`lying_estimates`]: through the engine (the local path), or the
/// pure algorithm with a deliberate mutant in its settle.
trait Key {
    type Ticket;
    /// Admits `estimate` at `now`: what to settle it with, or `None` when denied.
    fn admit(&mut self, now: u64, estimate: u64) -> Option<Self::Ticket>;
    fn settle(&mut self, ticket: &Self::Ticket, actual: u64, now: u64);
}

struct EngineKey {
    engine: Engine,
    store: MemoryStore,
}

impl Key for EngineKey {
    type Ticket = PendingCommit;

    fn admit(&mut self, now: u64, estimate: u64) -> Option<PendingCommit> {
        let request = user("liar").header("x-estimate", estimate.to_string());
        let eval = evaluate(&self.engine, &self.store, &request, now);
        (!eval.denied()).then(|| eval.commits[0].clone())
    }

    fn settle(&mut self, ticket: &PendingCommit, actual: u64, now: u64) {
        self.engine
            .commit(&self.store, ticket, actual, Micros(now))
            .unwrap();
    }
}

/// Deliberate mutants of the debt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutant {
    None,
    /// A window's count is forgotten when the window ends (the fixed window before
    /// issue 19: an excess beyond the limit was dropped at the next window).
    DropCarry,
    /// An excess is charged only as far as the key has units left: no debt.
    ForgiveDebt,
}

struct PureKey {
    limit: Limit,
    state: Option<SlotState>,
    mutant: Mutant,
}

impl PureKey {
    /// The state as the mutant reads it at `now`.
    fn read(&self, now: u64) -> Option<SlotState> {
        match (self.mutant, &self.limit) {
            (Mutant::DropCarry, Limit::FixedWindow(w)) => {
                self.state.filter(|s| s.b + w.window_us() > now)
            }
            _ => self.state,
        }
    }
}

impl Key for PureKey {
    type Ticket = (u64, u64);

    fn admit(&mut self, now: u64, estimate: u64) -> Option<(u64, u64)> {
        let (decision, next) = self.limit.decide(self.read(now), now, estimate);
        if !decision.allowed {
            return None;
        }
        self.state = next.or(self.state);
        Some((now, estimate))
    }

    fn settle(&mut self, &(counted_at, reserved): &(u64, u64), actual: u64, now: u64) {
        let state = self.read(now);
        let actual = match self.mutant {
            Mutant::ForgiveDebt if actual > reserved => {
                let (peek, _) = self.limit.decide(state, now, 0);
                actual.min(reserved + peek.remaining)
            }
            _ => actual,
        };
        if let Some(next) = self.limit.settle(state, counted_at, reserved, actual, now) {
            self.state = Some(next);
        }
    }
}

/// One case of the property: a limit, and the traffic offered to it.
#[derive(Debug, Clone)]
struct LyingCase {
    limit_json: String,
    max_estimate: u64,
    /// Requests: (instant, estimate, actual, response duration).
    requests: Vec<(u64, u64, u64, u64)>,
}

/// A random token bucket or fixed window over the range the config accepts (sizes up to
/// a million, periods and windows from 1 µs to 10 minutes, refills below and above the
/// capacity), and 200–500 requests with gaps, bursts and idle spells at the limit's own
/// scale; estimates up to the limit; actual costs from 0 to 3 × the estimate (or, in half
/// the cases, never below it); responses lasting up to 0, 1/16, 1 or 3 periods or windows.
fn lying_case(rng: &mut Rng) -> LyingCase {
    loop {
        let SettlingLimit {
            json: limit_json,
            bucket,
            size,
            scale,
            refill,
        } = settling_limit(rng);
        let max_estimate = log_uniform(rng, size);
        let n = 200 + rng.below(301);
        // Offered: 1 to 8 times what the key sustains, in estimates.
        let paid_per_scale = if bucket { refill.min(size) } else { size };
        let per_scale = (paid_per_scale * (1 + rng.below(8))).div_ceil(max_estimate.div_ceil(2));
        let mean_gap = scale / per_scale.max(1);
        // Per case: how long responses last (up to 3 periods or windows, or far less),
        // and whether the estimates lie both ways or only low.
        let longest = match rng.below(4) {
            0 => 0,
            1 => scale / 16,
            2 => scale,
            _ => 3 * scale,
        };
        let always_low = rng.below(2) == 0;
        let mut now = T0 + rng.below(scale);
        let mut requests = Vec::new();
        for _ in 0..n {
            now += match rng.below(20) {
                0 => scale * (1 + rng.below(5)),
                1..=3 => 0,
                _ => rng.below(2 * mean_gap + 1),
            };
            let estimate = 1 + rng.below(max_estimate);
            let actual = if always_low {
                estimate + rng.below(2 * estimate + 1)
            } else {
                rng.below(3 * estimate + 1)
            };
            let actual = actual.min(1_000_000);
            let duration = rng.below(longest + 1);
            requests.push((now, estimate, actual, duration));
        }
        // Debts a settle would carry past 2^48 µs (where they are forgiven) are out of
        // this property's reach: keep the whole run's excess well within it.
        let excess: u64 = requests.iter().map(|r| r.2.saturating_sub(r.1)).sum();
        let horizon = u128::from(excess / paid_per_scale + 2) * u128::from(scale);
        if horizon < 1 << 46 {
            return LyingCase {
                limit_json,
                max_estimate,
                requests,
            };
        }
    }
}

/// What a run of a [`LyingCase`] admitted, for the checker.
struct Lied {
    /// Each admitted request's cost up to its estimate at its admission, and its excess
    /// over the estimate at the instant its commit landed: in the order they happened.
    placed: Vec<Admission>,
    /// The most excess in flight at an admission: the excesses of the requests admitted
    /// up to it (itself included) whose commits land after it.
    in_flight: u64,
    /// The actual costs admitted, and the excess part of them.
    actual: u64,
    excess: u64,
}

fn run_lying<K: Key>(key: &mut K, case: &LyingCase) -> Lied {
    let mut open: BTreeMap<(u64, usize), (K::Ticket, u64, u64)> = BTreeMap::new();
    let mut out = Lied {
        placed: Vec::new(),
        in_flight: 0,
        actual: 0,
        excess: 0,
    };
    let mut flying = 0;
    for (i, &(now, estimate, actual, duration)) in case.requests.iter().enumerate() {
        while let Some(entry) = open.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((end, _), (ticket, actual, excess)) = entry.remove_entry();
            key.settle(&ticket, actual, end);
            flying -= excess;
            if excess > 0 {
                out.placed.push(Admission {
                    at_us: end,
                    cost: excess,
                });
            }
        }
        let Some(ticket) = key.admit(now, estimate) else {
            continue;
        };
        let excess = actual.saturating_sub(estimate);
        out.placed.push(Admission {
            at_us: now,
            cost: actual.min(estimate),
        });
        out.actual += actual;
        out.excess += excess;
        flying += excess;
        out.in_flight = out.in_flight.max(flying);
        open.insert((now + duration, i), (ticket, actual, excess));
    }
    // The rest land after the last request.
    for ((end, _), (ticket, actual, excess)) in open {
        key.settle(&ticket, actual, end);
        if excess > 0 {
            out.placed.push(Admission {
                at_us: end,
                cost: excess,
            });
        }
    }
    out
}

fn judge(limit: &Limit, lied: &Lied) -> Result<(), conformance::Violation> {
    lying_bound(limit, lied.in_flight)
        .iter()
        .try_for_each(|bound| conformance::check(bound, &lied.placed))
}

/// Cases the property runs in CI (`WEIR_LYING_CASES` runs more).
const LYING_CASES: u64 = 300;

#[test]
fn lying_estimates_keep_the_bound_plus_the_excess_in_flight() {
    let cases = std::env::var("WEIR_LYING_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(LYING_CASES);
    let mut caught = BTreeMap::new();
    let (mut actual, mut excess, mut debts) = (0u64, 0u64, 0u64);
    for seed in 1..=cases {
        let mut rng = Rng(0x1a12_0000 + seed);
        let case = lying_case(&mut rng);
        let e = committed_rule(&case.limit_json, case.max_estimate);
        let limit = local(&e);
        let store = MemoryStore::new();
        e.prepare(&store).unwrap();
        let lied = run_lying(&mut EngineKey { engine: e, store }, &case);
        judge(&limit, &lied).unwrap_or_else(|v| {
            panic!(
                "seed {seed}, {} ({} requests, estimates up to {}): {v}",
                case.limit_json,
                case.requests.len(),
                case.max_estimate
            )
        });
        actual += lied.actual;
        excess += lied.excess;
        // The pure algorithm decides the same; the mutants must be caught.
        for mutant in [Mutant::None, Mutant::DropCarry, Mutant::ForgiveDebt] {
            if mutant == Mutant::DropCarry && !matches!(limit, Limit::FixedWindow(_)) {
                continue;
            }
            let mut key = PureKey {
                limit: limit.clone(),
                state: None,
                mutant,
            };
            let pure = run_lying(&mut key, &case);
            let verdict = judge(&limit, &pure);
            if mutant == Mutant::None {
                assert_eq!(pure.placed, lied.placed, "seed {seed}: engine and pure");
                continue;
            }
            if pure.placed != lied.placed {
                debts += 1;
            }
            let kind = format!("{:?} {mutant:?}", limit.kind());
            let entry = caught.entry(kind).or_insert((0, 0));
            entry.0 += 1;
            entry.1 += u64::from(verdict.is_err());
        }
    }
    eprintln!(
        "{cases} cases: {actual} actual units admitted, {excess} of them over the estimates; \
         mutants caught (cases, caught): {caught:?}; {debts} mutant runs admitted otherwise"
    );
    for (kind, (ran, failed)) in &caught {
        assert!(
            *failed * 5 >= *ran,
            "{kind}: the mutant broke the bound in only {failed} of {ran} cases"
        );
    }
}
