//! Fair shares: one fixed window's limit split among the keys under a parent key (the
//! users of an organisation), each active key entitled to its weighted share, and what
//! one leaves unused free for the others.
//!
//! ## The rule
//!
//! The parent counts every unit its keys are admitted in its window (epoch-aligned, as
//! [`crate::algorithms::fixed_window`]), at most `limit`. When a window starts, the keys
//! that asked for units in the window just ended are *active*, and each is *entitled* to
//! a part of the new window's limit by weighted max-min fairness (water-filling) over
//! what it asked for then: a key that asked for less than its weighted share is entitled
//! to what it asked, and what it leaves is split among the others by weight. So every
//! active key is entitled to at least `min(asked, ⌊limit × wᵢ / Σ w(active)⌋)`, and the
//! entitlements add up to at most `limit`.
//!
//! A request of key `i` costing `c` is admitted when, after it, the units counted plus
//! what every key still has of its entitlement (its *reserve*) fit the limit:
//!
//! ```text
//! used + c + Σⱼ max(0, entitledⱼ − usedⱼ)  ≤  limit     (usedᵢ counted with c)
//! ```
//!
//! At a window's start `used` is 0 and the reserves add up to the entitlements, so this
//! holds; an admission keeps it. So a request within its key's entitlement is always
//! admitted (its reserve pays for it), and a request beyond it borrows only what nobody
//! is entitled to. A key that was not active in the last window (new, or past
//! [`ShareLimit::max_keys`]) is entitled to nothing in this one: it gets what is free,
//! and from the next window on its share.
//!
//! ## The guarantees ([`check_floor`] judges the second)
//!
//! - The parent's bound: what every key is admitted in one window adds up to at most
//!   `limit` (the fixed window's own bound, judged by [`crate::conformance::check`]).
//! - The floor: a key active in window `W − 1` that asks for at least its share in `W`
//!   gets, in `W`, at least `min(asked in W, asked in W − 1, ⌊limit × wᵢ / Σ w⌋)`, less
//!   one request's cost (a request larger than what is left of the entitlement may be
//!   denied), the weights and active set those of `W − 1`'s end. A key's entitlement
//!   follows its demand a window late: one that starts asking more is entitled to more
//!   from the next window on.
//!
//! Pure functions of `(state, now, request)`; the filter keeps the state in shared data
//! (`weir_core::store::share_table`).

use crate::algorithms::{Decision, GlobalLimit, Grant};

/// The checker of the floor: what every key got against what it was owed.
mod floor;

pub use floor::{check_floor, check_floor_within, ShareRequest, ShortShare};

/// The most keys one parent shares its limit among at once.
pub const MAX_SHARE_KEYS: u32 = 1024;
/// The largest weight a key may have.
pub const MAX_WEIGHT: u64 = 1_000;
/// The largest limit a shared limit kept in Redis may have: with at most
/// [`MAX_SHARE_KEYS`] keys of weight at most [`MAX_WEIGHT`] and demands capped at the
/// limit, every product the script forms stays below 2^53, where Lua's doubles are exact.
pub const MAX_GLOBAL_SHARE_LIMIT: u64 = u32::MAX as u64;

/// A parent's limit and how many keys it tracks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareLimit {
    /// Units per window, for every key together (the fixed window's `limit`, ≤ 2^48).
    pub limit: u64,
    /// µs, ≥ 1.
    pub window_us: u64,
    /// Keys tracked in one window (1 to [`MAX_SHARE_KEYS`]); a key past them is entitled
    /// to nothing and gets only what is free.
    pub max_keys: u32,
}

/// One key's part of its parent's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShareEntry {
    /// The key's fingerprint under its parent (never 0 in a stored state).
    pub fingerprint: u64,
    /// Its weight, as its latest request gave it (1 to [`MAX_WEIGHT`]).
    pub weight: u64,
    /// What it is entitled to in this window.
    pub entitled: u64,
    /// Units it was admitted in this window.
    pub used: u64,
    /// Units it asked for in this window, admitted or not, up to the limit (a demand
    /// above it is entitled to no more): its demand for the next.
    pub asked: u64,
}

impl ShareEntry {
    /// What is left of its entitlement: held back from the other keys.
    pub fn reserve(&self) -> u64 {
        self.entitled.saturating_sub(self.used)
    }
}

/// A parent's state: its window and its keys (those active in the last window, and
/// those that asked in this one).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShareState {
    /// Start of the window counted, µs since the epoch.
    pub window_start_us: u64,
    /// Units admitted in the window, every key together.
    pub used: u64,
    pub entries: Vec<ShareEntry>,
}

impl ShareState {
    /// Every key's reserve, added up.
    pub fn reserved(&self) -> u64 {
        self.entries
            .iter()
            .fold(0u64, |sum, e| sum.saturating_add(e.reserve()))
    }

    /// From this instant on the state carries nothing a fresh one would not: no key
    /// asked in its window, so the next has no active key (or the window after it starts).
    pub fn idle_at_us(&self, window_us: u64) -> u64 {
        let next = self.window_start_us.saturating_add(window_us);
        if self.entries.iter().any(|e| e.asked > 0) {
            next.saturating_add(window_us)
        } else {
            next
        }
    }
}

/// One request under a shared limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareAsk {
    /// The key's fingerprint under its parent (not 0); `None` when the request names no
    /// key (a `share.by` part without a value): it gets only what is free.
    pub key: Option<u64>,
    /// 1 to [`MAX_WEIGHT`] (clamped).
    pub weight: u64,
    pub cost: u64,
    /// Units to take now (≥ `cost`; a global rule's lease): the request's cost, and
    /// beyond it only what is left of the key's own entitlement, so units leased and
    /// never spent are the key's loss alone.
    pub want: u64,
}

impl ShareAsk {
    /// A request taking its cost alone.
    pub fn exact(key: Option<u64>, weight: u64, cost: u64) -> ShareAsk {
        ShareAsk {
            key,
            weight,
            cost,
            want: cost,
        }
    }
}

/// A decision under a shared limit, and what the key's share is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareDecision {
    /// `limit` is the key's share, `remaining` the most it may be admitted now.
    pub decision: Decision,
    /// The key's weighted share of the limit among the keys tracked now (itself
    /// included): `⌊limit × w / Σ w⌋`.
    pub share: u64,
    /// What it is entitled to in this window.
    pub entitled: u64,
    /// Keys tracked in the window (active in the last one, or asking in this one).
    pub keys: u32,
    /// The key is past [`ShareLimit::max_keys`] (or named none): entitled to nothing.
    pub untracked: bool,
    /// Units taken: the cost when allowed, and up to `want` of the key's own
    /// entitlement beyond it (a lease); 0 when denied.
    pub granted: u64,
}

impl ShareLimit {
    /// The shares of `limit` among `max_keys` keys: its limit per window and its window,
    /// for an algorithm whose limit comes back whole each window; `None` for any other.
    pub fn of(limit: &GlobalLimit, max_keys: u32) -> Option<ShareLimit> {
        let policy = limit.policy();
        limit
            .kind()
            .spec()
            .resets_each_window
            .then_some(ShareLimit {
                limit: policy.quota,
                window_us: policy.window_ns / 1000,
                max_keys,
            })
    }

    /// Decides a request at `now_us` on the parent's `state` (`None`: none yet), and
    /// returns the state to store (asks are counted even when denied).
    pub fn decide(
        &self,
        state: Option<ShareState>,
        now_us: u64,
        ask: ShareAsk,
    ) -> (ShareDecision, ShareState) {
        let window_us = self.window_us.max(1);
        let start = now_us - now_us % window_us;
        if let Some(later) = state.as_ref().filter(|s| is_later(s, start, window_us)) {
            // This request read the clock before another counted in the next window (a
            // worker that lost a CAS race): as a fixed window, it admits nothing until
            // then, since a unit admitted now would count in a window it did not happen in.
            let wait_ns = later
                .window_start_us
                .saturating_sub(now_us)
                .saturating_mul(1000);
            let decision = Decision {
                allowed: false,
                limit: 0,
                remaining: 0,
                retry_after_ns: Some(wait_ns),
                reset_after_ns: wait_ns,
            };
            let keys = u32::try_from(later.entries.len()).unwrap_or(u32::MAX);
            let decided = ShareDecision {
                decision,
                share: 0,
                entitled: 0,
                keys,
                untracked: true,
                granted: 0,
            };
            return (decided, state.unwrap_or_default());
        }
        let mut state = self.rolled(state.unwrap_or_default(), now_us);
        let weight = ask.weight.clamp(1, MAX_WEIGHT);
        let index = ask.key.filter(|k| *k != 0).and_then(|key| {
            match state.entries.iter().position(|e| e.fingerprint == key) {
                Some(i) => Some(i),
                None if state.entries.len() < self.max_keys as usize => {
                    state.entries.push(ShareEntry {
                        fingerprint: key,
                        weight,
                        ..ShareEntry::default()
                    });
                    Some(state.entries.len() - 1)
                }
                None => None,
            }
        });
        let before = index.and_then(|i| state.entries.get(i)).copied();
        let reserve_before = before.map_or(0, |e| e.reserve());
        let reserve_after = before.map_or(0, |e| {
            e.entitled.saturating_sub(e.used.saturating_add(ask.cost))
        });
        let others = state.reserved().saturating_sub(reserve_before);
        let allowed = state
            .used
            .saturating_add(ask.cost)
            .saturating_add(others)
            .saturating_add(reserve_after)
            <= self.limit;
        // Beyond its cost, a lease takes only what is left of the key's entitlement.
        let extra = if allowed {
            ask.want.saturating_sub(ask.cost).min(reserve_after)
        } else {
            0
        };
        let granted = if allowed {
            ask.cost.saturating_add(extra)
        } else {
            0
        };
        if let Some(entry) = index.and_then(|i| state.entries.get_mut(i)) {
            entry.weight = weight;
            let asked = ask.cost.saturating_add(extra);
            entry.asked = entry.asked.saturating_add(asked).min(self.limit);
            entry.used = entry.used.saturating_add(granted);
        }
        state.used = state.used.saturating_add(granted);
        let reserve_now = index
            .and_then(|i| state.entries.get(i))
            .map_or(0, |e| e.reserve());
        let free = self
            .limit
            .saturating_sub(state.used)
            .saturating_sub(state.reserved().saturating_sub(reserve_now));
        let total_weight = state
            .entries
            .iter()
            .fold(0u64, |sum, e| sum.saturating_add(e.weight))
            .saturating_add(if index.is_some() { 0 } else { weight });
        let share = share_of(self.limit, weight, total_weight);
        let reset_after_ns = state
            .window_start_us
            .saturating_add(window_us)
            .saturating_sub(now_us)
            .saturating_mul(1000);
        let decision = Decision {
            allowed,
            limit: share,
            remaining: free,
            retry_after_ns: (!allowed && ask.cost <= self.limit).then_some(reset_after_ns),
            reset_after_ns,
        };
        let keys = u32::try_from(state.entries.len()).unwrap_or(u32::MAX);
        (
            ShareDecision {
                decision,
                share,
                entitled: before.map_or(0, |e| e.entitled),
                keys,
                untracked: index.is_none(),
                granted,
            },
            state,
        )
    }

    /// A decision as the bridge answers it: the units granted, due now, and those beyond
    /// the cost (a lease) spendable to the window's end — whatever the lease's ttl, since
    /// any instant of the window is the same to the parent's bound, and a unit leased
    /// from the key's entitlement and dropped before the end would be the key's loss.
    pub fn grant(&self, decided: &ShareDecision, cost: u64, now_us: u64) -> Grant {
        let window_us = self.window_us.max(1);
        let window_end = (now_us - now_us % window_us).saturating_add(window_us);
        let valid_ns = if decided.granted > cost {
            window_end.saturating_sub(now_us).saturating_mul(1000)
        } else {
            0
        };
        Grant {
            decision: decided.decision,
            granted: decided.granted,
            due_ns: 0,
            spacing_ns: 0,
            valid_ns,
        }
    }

    /// Settles what a request of `key` was counted, `reserved` units at `counted_at_us`,
    /// with its actual cost (a token budget's `commit`): in the window it was counted in,
    /// the difference comes off (or is added to) the parent's count and the key's use, so
    /// a refund is free again for the key first (its reserve grows back) and then for
    /// everyone. Once that window has ended there is nothing to settle against: the state
    /// is left as it is. Returns the state to store, `None` when nothing changes.
    pub fn settle(
        &self,
        state: Option<ShareState>,
        (counted_at_us, now_us): (u64, u64),
        key: Option<u64>,
        (reserved, actual): (u64, u64),
    ) -> Option<ShareState> {
        let window_us = self.window_us.max(1);
        let mut state = state?;
        let counted_in = counted_at_us - counted_at_us % window_us;
        let now_in = now_us - now_us % window_us;
        if state.window_start_us != counted_in || now_in != counted_in || reserved == actual {
            return None;
        }
        let entry = key
            .filter(|k| *k != 0)
            .and_then(|k| state.entries.iter_mut().find(|e| e.fingerprint == k));
        let apply = |count: u64| {
            if actual < reserved {
                count.saturating_sub(reserved - actual)
            } else {
                count.saturating_add(actual - reserved)
            }
        };
        if let Some(entry) = entry {
            entry.used = apply(entry.used);
        }
        state.used = apply(state.used);
        Some(state)
    }

    /// `state` in the window of `now_us`: the same window; the next one, its keys
    /// that asked entitled from what they asked; any later one (or a state from a
    /// misaligned window), empty.
    fn rolled(&self, state: ShareState, now_us: u64) -> ShareState {
        let window_us = self.window_us.max(1);
        let start = now_us - now_us % window_us;
        let aligned = state.window_start_us.is_multiple_of(window_us);
        if aligned && state.window_start_us == start {
            return state;
        }
        if !aligned || state.window_start_us.saturating_add(window_us) != start {
            return ShareState {
                window_start_us: start,
                ..ShareState::default()
            };
        }
        let mut entries: Vec<ShareEntry> = state
            .entries
            .into_iter()
            .filter(|e| e.asked > 0 && e.fingerprint != 0)
            .take(self.max_keys as usize)
            .map(|e| ShareEntry {
                weight: e.weight.clamp(1, MAX_WEIGHT),
                entitled: 0,
                used: 0,
                ..e
            })
            .collect();
        let demands: Vec<(u64, u64)> = entries.iter().map(|e| (e.asked, e.weight)).collect();
        for (entry, entitled) in entries.iter_mut().zip(water_fill(self.limit, &demands)) {
            entry.entitled = entitled;
            entry.asked = 0;
        }
        ShareState {
            window_start_us: start,
            used: 0,
            entries,
        }
    }
}

/// The state counts a window after the one starting at `start`.
fn is_later(state: &ShareState, start: u64, window_us: u64) -> bool {
    state.window_start_us.is_multiple_of(window_us) && state.window_start_us > start
}

/// `⌊limit × weight / total⌋` (0 for a total of 0).
pub fn share_of(limit: u64, weight: u64, total: u64) -> u64 {
    if total == 0 {
        return 0;
    }
    let share = u128::from(limit) * u128::from(weight) / u128::from(total);
    u64::try_from(share).unwrap_or(u64::MAX)
}

/// Weighted max-min fair entitlements of `limit` among `(demand, weight)`s: keys are
/// served in order of demand per weight; one whose demand fits its weighted part of what
/// is left gets its demand, and once one does not, it and every key after it get their
/// weighted part of what is left, rounded down. The result adds up to at most `limit`,
/// and each key gets at least `min(demand, ⌊limit × w / Σ w⌋)`.
pub fn water_fill(limit: u64, demands: &[(u64, u64)]) -> Vec<u64> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    let ratio = |i: usize| demands.get(i).copied().unwrap_or((0, 1));
    // By demand per weight: d_a / w_a < d_b / w_b, exactly.
    order.sort_by(|&a, &b| {
        let ((da, wa), (db, wb)) = (ratio(a), ratio(b));
        (u128::from(da) * u128::from(wb.max(1))).cmp(&(u128::from(db) * u128::from(wa.max(1))))
    });
    let mut out = vec![0u64; demands.len()];
    let mut left = u128::from(limit);
    let mut weight_left: u128 = demands.iter().map(|(_, w)| u128::from((*w).max(1))).sum();
    let mut filling = false;
    for i in order {
        let (demand, weight) = ratio(i);
        let weight = u128::from(weight.max(1));
        let part = if filling || u128::from(demand) * weight_left > left * weight {
            filling = true;
            // Every later key's part of what is left is taken from the same `left`.
            left * weight / weight_left.max(1)
        } else {
            let d = u128::from(demand);
            left -= d;
            weight_left -= weight;
            d
        };
        if let Some(slot) = out.get_mut(i) {
            *slot = u64::try_from(part).unwrap_or(u64::MAX);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const SECOND: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000 * SECOND;

    #[test]
    fn water_filling_gives_the_light_keys_their_demand_and_the_heavy_the_rest() {
        let mut demands = vec![(1000, 1)];
        demands.extend([(5, 1); 9]);
        let entitled = water_fill(100, &demands);
        assert_eq!(entitled[0], 55);
        assert!(entitled[1..].iter().all(|e| *e == 5));
        // Weighted: 2:1:1 of 100, every demand above its part.
        assert_eq!(
            water_fill(100, &[(100, 2), (100, 1), (100, 1)]),
            vec![50, 25, 25]
        );
        // Rounded down, never above the limit.
        let three = water_fill(10, &[(10, 1), (10, 1), (10, 1)]);
        assert_eq!(three, vec![3, 3, 3]);
        assert_eq!(water_fill(10, &[]), Vec::<u64>::new());
    }

    fn ask(key: u64, cost: u64) -> ShareAsk {
        ShareAsk::exact(Some(key), 1, cost)
    }

    #[test]
    fn a_heavy_key_gets_what_the_light_ones_leave_and_they_get_theirs() {
        let limit = ShareLimit {
            limit: 100,
            window_us: SECOND,
            max_keys: 64,
        };
        let mut state = None;
        let mut admitted = [0u64; 10];
        for window in 0..4u64 {
            admitted = [0; 10];
            let start = T0 + window * SECOND;
            // The heavy key floods first; the nine light keys ask 5 each after it.
            for step in 0..1000u64 {
                let (d, next) = limit.decide(state.take(), start + step, ask(1, 1));
                admitted[0] += u64::from(d.decision.allowed);
                state = Some(next);
            }
            for key in 2..=10u64 {
                for step in 0..5u64 {
                    let at = start + 500_000 + key * 10 + step;
                    let (d, next) = limit.decide(state.take(), at, ask(key, 1));
                    admitted[key as usize - 1] += u64::from(d.decision.allowed);
                    state = Some(next);
                }
            }
            assert!(admitted.iter().sum::<u64>() <= 100);
        }
        // From the third window on the entitlements follow the demands of the one before.
        assert_eq!(admitted[0], 55);
        assert!(admitted[1..].iter().all(|a| *a == 5), "{admitted:?}");
    }

    #[test]
    fn a_key_past_max_keys_gets_only_what_is_free() {
        let limit = ShareLimit {
            limit: 10,
            window_us: SECOND,
            max_keys: 1,
        };
        let (d, state) = limit.decide(None, T0, ask(1, 4));
        assert!(d.decision.allowed && !d.untracked);
        let (d, state) = limit.decide(Some(state), T0 + 1, ask(2, 6));
        assert!(d.decision.allowed && d.untracked);
        assert_eq!(state.entries.len(), 1);
        // Next window: key 1 is entitled to what it asked (4), key 2 to nothing.
        let (d, state) = limit.decide(Some(state), T0 + SECOND, ask(2, 7));
        assert!(!d.decision.allowed, "7 would eat into key 1's reserve of 4");
        assert_eq!(d.decision.remaining, 6);
        assert_eq!(d.decision.retry_after_ns, Some(SECOND * 1000));
        let (d, _) = limit.decide(Some(state), T0 + SECOND + 1, ask(1, 4));
        assert!(d.decision.allowed);
    }

    #[test]
    fn a_state_two_windows_old_or_misaligned_starts_afresh() {
        let limit = ShareLimit {
            limit: 10,
            window_us: SECOND,
            max_keys: 8,
        };
        let (_, state) = limit.decide(None, T0, ask(1, 10));
        let (d, _) = limit.decide(Some(state.clone()), T0 + 2 * SECOND, ask(2, 10));
        assert!(d.decision.allowed, "key 1 is no longer active");
        let misaligned = ShareState {
            window_start_us: T0 + 3,
            ..state
        };
        let (d, _) = limit.decide(Some(misaligned), T0 + SECOND, ask(2, 10));
        assert!(d.decision.allowed);
    }

    #[test]
    fn a_refund_frees_the_keys_units_in_the_window_it_was_counted_in() {
        let limit = ShareLimit {
            limit: 10,
            window_us: SECOND,
            max_keys: 8,
        };
        let (d, state) = limit.decide(None, T0, ask(1, 8));
        assert!(d.decision.allowed);
        let (d, state) = limit.decide(Some(state), T0 + 1, ask(2, 4));
        assert!(!d.decision.allowed, "8 of 10 counted");
        // Key 1 really used 3: 5 come back.
        let now = (T0, T0 + 3);
        let settled = limit
            .settle(Some(state.clone()), now, Some(1), (8, 3))
            .unwrap();
        assert_eq!((settled.used, settled.entries[0].used), (3, 3));
        let (d, _) = limit.decide(Some(settled), T0 + 2, ask(2, 4));
        assert!(d.decision.allowed);
        // A charge above the estimate is counted too; nothing once the window is gone.
        let charged = limit
            .settle(Some(state.clone()), now, Some(1), (8, 9))
            .unwrap();
        assert_eq!(charged.used, 9);
        let late = (T0, T0 + SECOND);
        assert_eq!(
            limit.settle(Some(state.clone()), late, Some(1), (8, 3)),
            None
        );
        let earlier = (T0 - SECOND, T0 + 3);
        assert_eq!(
            limit.settle(Some(state.clone()), earlier, Some(1), (8, 3)),
            None
        );
        assert_eq!(limit.settle(Some(state), now, Some(1), (8, 8)), None);
    }
}
