//! The floor, checked: a key active in one window that asks for at least its share in
//! the next gets it there (see the parent module's guarantees).

use super::{share_of, ShareLimit, MAX_WEIGHT};

/// One request a parent's keys made, as the checker reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareRequest {
    /// When it was decided (µs).
    pub at_us: u64,
    /// The key (`None`: it named none).
    pub key: Option<u64>,
    pub weight: u64,
    pub cost: u64,
    pub admitted: bool,
}

/// Where a key got less than its floor in one window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShortShare {
    pub key: u64,
    pub window_start_us: u64,
    pub admitted: u64,
    pub floor: u64,
    pub message: String,
}

/// Checks the floor of every key in every window (see the module docs): a key active in
/// the window before gets at least `min(asked now, asked then, its share) − (its largest
/// cost in the window − 1)`. The active set is rebuilt from the requests as the rule
/// builds it: the keys active before, then new keys in the order they first asked, up to
/// `max_keys`. The requests come in the order they were decided (which the active set
/// depends on), their windows never going back: a request decided after its window was
/// left (it read the clock before another was counted in the next) was not an ask of
/// it, and the caller leaves it out.
pub fn check_floor(limit: &ShareLimit, requests: &[ShareRequest]) -> Result<(), ShortShare> {
    check_floor_within(limit, requests, 0)
}

/// [`check_floor`], each floor less `tolerance` units: what a global rule's leases may
/// hold of a key's entitlement in the other Envoys while its request asks this one
/// (`lease.max − 1` per other Envoy).
pub fn check_floor_within(
    limit: &ShareLimit,
    requests: &[ShareRequest],
    tolerance: u64,
) -> Result<(), ShortShare> {
    let window_us = limit.window_us.max(1);
    let sorted = requests;
    // Per tracked key of the window before: (asked, last weight).
    let mut before: Vec<(u64, u64, u64)> = Vec::new();
    let mut before_start: Option<u64> = None;
    let mut i = 0;
    while let Some(first) = sorted.get(i) {
        let start = first.at_us - first.at_us % window_us;
        let end = sorted
            .iter()
            .skip(i)
            .position(|r| r.at_us - r.at_us % window_us != start)
            .map_or(sorted.len(), |n| i + n);
        let window = sorted.get(i..end).unwrap_or_default();
        let consecutive = before_start.is_some_and(|b| b.saturating_add(window_us) == start);
        if !consecutive {
            before.clear();
        }
        let total_weight: u64 = before.iter().map(|(_, _, w)| *w).sum();
        // Tracked now: the active ones, then new keys in order of their first ask.
        let mut tracked: Vec<(u64, u64, u64)> = before
            .iter()
            .map(|(key, _, weight)| (*key, 0, *weight))
            .collect();
        for request in window {
            let Some(key) = request.key.filter(|k| *k != 0) else {
                continue;
            };
            let weight = request.weight.clamp(1, MAX_WEIGHT);
            let room = tracked.len() < limit.max_keys as usize;
            match tracked.iter_mut().find(|(k, _, _)| *k == key) {
                Some(entry) => {
                    entry.1 = entry.1.saturating_add(request.cost);
                    entry.2 = weight;
                }
                None if room => tracked.push((key, request.cost, weight)),
                None => {}
            }
        }
        for (key, asked_before, weight) in &before {
            let asked_now = tracked
                .iter()
                .find(|(k, _, _)| k == key)
                .map_or(0, |(_, asked, _)| *asked);
            let of_key = || window.iter().filter(|r| r.key == Some(*key));
            let admitted = of_key()
                .filter(|r| r.admitted)
                .fold(0u64, |sum, r| sum.saturating_add(r.cost));
            let largest = of_key().map(|r| r.cost).max().unwrap_or(0);
            let share = share_of(limit.limit, *weight, total_weight);
            let entitled = (*asked_before).min(share);
            let slack = largest.saturating_sub(1).saturating_add(tolerance);
            let floor = asked_now.min(entitled.saturating_sub(slack));
            if admitted < floor {
                return Err(ShortShare {
                    key: *key,
                    window_start_us: start,
                    admitted,
                    floor,
                    message: format!(
                        "key {key:#x} in the window from {start}us: admitted {admitted} where \
                         its floor is {floor} (asked {asked_now} now and {asked_before} in the \
                         window before; share {share} of {} at weight {weight} of {total_weight}; \
                         largest cost {largest})",
                        limit.limit
                    ),
                });
            }
        }
        before = tracked
            .into_iter()
            .filter(|(_, asked, _)| *asked > 0)
            .collect();
        before_start = Some(start);
        i = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const SECOND: u64 = 1_000_000;
    const T0: u64 = 1_700_000_000 * SECOND;

    #[test]
    fn the_floor_checker_catches_a_key_kept_from_its_share() {
        let limit = ShareLimit {
            limit: 10,
            window_us: SECOND,
            max_keys: 8,
        };
        let request = |at_us, key, admitted| ShareRequest {
            at_us,
            key: Some(key),
            weight: 1,
            cost: 1,
            admitted,
        };
        // Window 0: both ask 10. Window 1: key 2 asks 5 and gets 4 of its share 5.
        let mut requests = Vec::new();
        for n in 0..10 {
            requests.push(request(T0 + n, 1, n < 5));
            requests.push(request(T0 + n, 2, n < 5));
        }
        for n in 0..5 {
            requests.push(request(T0 + SECOND + n, 1, true));
            requests.push(request(T0 + SECOND + n, 2, n < 4));
        }
        let short = check_floor(&limit, &requests).unwrap_err();
        assert_eq!((short.key, short.admitted, short.floor), (2, 4, 5));
        requests.last_mut().unwrap().admitted = true;
        assert_eq!(check_floor(&limit, &requests), Ok(()));
    }
}
