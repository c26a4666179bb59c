//! Adaptive concurrency: a limit in flight that follows the latency the filter observes.
//!
//! ## The controller
//!
//! Every `interval`, the latencies of the interval's responses (from every worker, merged
//! through shared data) give a **sample**: their `latency` quantile (p90 by default).
//! The **baseline** is the latency of the service when it is not queueing: the lowest
//! sample seen, or the sample of an interval run at the limit's floor `min` (the
//! lowest concurrency the rule allows is the best probe of the service's own latency:
//! a service that became slower for good drives the limit to its floor, where the new
//! baseline is learnt, and the limit grows back from there). Then, like
//! Netflix's Gradient2 and Envoy's `adaptive_concurrency`:
//!
//! ```text
//! gradient  = clamp(tolerance × baseline / sample, 0.5, 1)
//! headroom  = √limit    (only while latency is within tolerance and the limit in use)
//! target    = limit × gradient + headroom
//! limit     = clamp(limit × (1 − smoothing) + target × smoothing, min, max_in_flight)
//! ```
//!
//! From its start (and after falling to its floor) the limit doubles while latency
//! stays within tolerance (**slow start**), and it does not wait for the interval to
//! end: slow start steps once [`SLOW_START_SAMPLES`] latencies taken with the limit in
//! use are merged, and a worker whose requests reach the limit meanwhile merges every
//! [`LEARNING_TICK_MS`], since what the limit turns away while it learns is the price of
//! learning slowly. After slow start,
//! while latency stays within `tolerance` × baseline the limit grows by about √limit
//! per interval; beyond it, it shrinks in proportion to the excess, with no headroom
//! (Envoy and Gradient2 add it always, which holds the limit above the knee by √limit
//! and keeps a slowed-down service from ever reaching the floor). Against a service
//! that serves `c` requests at once and queues the rest, it moves between
//! `tolerance × c` and `tolerance × c + √(tolerance × c)`.
//!
//! **Why this controller and not another.** Envoy's gradient controller needs the
//! minimum latency, and measures it by pinning the limit to `min_concurrency` for a
//! while every `interval` (60 s by default): a period in which most requests are
//! rejected, for every route, by design. AIMD needs a latency target someone must guess,
//! which is the number this feature exists to avoid. A gradient against a baseline that
//! is kept, not measured, never stops the traffic to learn; and since the baseline only
//! goes down except at the floor, a long overload cannot make it creep up (Gradient2's
//! long-term average does). Its price: a service that became slower for good is
//! relearnt only after the limit has fallen to `min`. An interval whose peak in flight stayed below half
//! the limit says nothing about the service's capacity (the demand was the limit), so
//! it changes nothing, as in Gradient2.
//!
//! ## Where the numbers live
//!
//! Each worker records its latencies in a [`LatencySketch`] (log-spaced buckets, 9 %
//! wide; 160 × 4 bytes) and, on its tick, adds them into the rule's record in shared
//! data with CAS ([`SharedRecord`]); the worker whose merge finds the interval over
//! runs the controller and starts the next interval. Workers read the limit back on
//! their tick, so a new limit applies everywhere within one tick.
//!
//! With `per_key`, each key has such a record of its own, among `keys` records made when
//! the plugin starts: a key looks for its own in [`KEY_PROBES`] records from the one its
//! hash names and claims the first that is free — nobody's, or untouched (no worker
//! merged into it) for [`Adaptive::stale_after_us`]: [`STALE_INTERVALS`] intervals, and
//! never less than [`MIN_STALE_US`] of wall time ([`SharedRecord::free_for`]). Workers
//! merge every key they keep on each tick (every 100 ms or sooner), so a record in use
//! is touched many times within [`MIN_STALE_US`] whatever the interval: an interval
//! shorter than a tick cannot make a busy key's record look stale. A worker keeps the
//! latencies of at most `keys` keys ([`KeyedLatencies`]) and forgets those it has not
//! seen for [`Adaptive::forget_after_us`], so the records of keys gone idle go stale
//! and serve others.

use std::collections::BTreeMap;

use crate::rules::Adaptive;

/// Buckets of a sketch: bucket `i` holds latencies in `[BASE × 2^(i/8), BASE ×
/// 2^((i+1)/8))` µs, the last one everything above.
pub const SKETCH_BUCKETS: usize = 160;
/// The lower edge of bucket 1, µs (bucket 0 holds everything below it).
pub const SKETCH_BASE_US: u64 = 50;
const STEPS_PER_DOUBLING: f64 = 8.0;

/// Fewest latencies an interval needs before the controller acts on it.
pub const MIN_SAMPLES: u64 = 10;
/// Fewest latencies a slow-start step needs before its interval ends.
pub const SLOW_START_SAMPLES: u64 = 4;
/// How often a worker ticks, ms, while a controller it merged into is learning (in
/// slow start, its limit reached by the worker's requests since its last merge): each step of slow
/// start waits for the next merge, and what the limit turns away meanwhile is the
/// price. It ticks at its usual pace again once the limit is past the demand or slow
/// start is over.
pub const LEARNING_TICK_MS: u32 = 10;

/// A response as the filter sees it when its headers arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// `:status` (0 when unreadable).
    pub status: u16,
    /// Whether the upstream sent it (Envoy's `response.code_details` is
    /// `via_upstream`), or a local reply did — weir's own, another filter's, or Envoy's
    /// router (a 504 timeout, a 503 with no healthy host); `None` when unknown.
    pub from_upstream: Option<bool>,
}

/// Whether a response's latency measures the service, for the controller's samples:
/// only answers the upstream gave, with a status from 100 to 399. A local reply
/// measures nothing of the service; a 5xx is a failure, often a fast one (a refused
/// connection, an overloaded service shedding), and a 4xx is usually answered before
/// the work (a bad request, a missing token, a 404, the service's own 429): fast
/// answers that would drag the baseline down, after which normal latencies look like
/// congestion and the limit halves towards `min`. What is left is what the limit
/// protects: the service doing its work.
pub fn measures_service(response: Response) -> bool {
    response.from_upstream != Some(false) && (100..400).contains(&response.status)
}

/// A key's controller is looked for in this many consecutive records from the one its
/// hash names (so two keys rarely compete for one).
pub const KEY_PROBES: u32 = 4;
/// A key's record nobody merged into for this many intervals is free for another key.
pub const STALE_INTERVALS: u64 = 3;
/// ... and never before this much wall time untouched, µs: many ticks of every worker
/// (a worker ticks at least every 100 ms), whatever the interval.
pub const MIN_STALE_US: u64 = 3_000_000;
/// A worker forgets a key it has not seen for this many intervals, and never before
/// [`MIN_FORGET_US`] (before its record can go stale).
pub const FORGET_INTERVALS: u64 = 2;
pub const MIN_FORGET_US: u64 = 2_000_000;

impl Adaptive {
    /// How long a key's record must go untouched before another key may take it, µs.
    pub fn stale_after_us(&self) -> u64 {
        self.interval_us
            .saturating_mul(STALE_INTERVALS)
            .max(MIN_STALE_US)
    }

    /// How long a worker keeps a key it has not seen, µs (shorter than
    /// [`Adaptive::stale_after_us`], so a forgotten key's record goes stale).
    pub fn forget_after_us(&self) -> u64 {
        self.interval_us
            .saturating_mul(FORGET_INTERVALS)
            .max(MIN_FORGET_US)
    }

    /// The controller's state before any interval.
    pub fn start(&self, now_us: u64) -> ControllerState {
        ControllerState {
            limit_milli: self.initial_limit.saturating_mul(1_000),
            baseline_us: 0,
            interval_started_us: now_us,
            last_sample_us: 0,
            slow_start: true,
        }
    }

    /// The controller after an interval whose latencies are `sketch` and whose highest
    /// count in flight (of any key) was `peak_in_flight`; the next interval starts at
    /// `now_us`. `max_in_flight` is the ceiling.
    pub fn step(
        &self,
        state: ControllerState,
        sketch: &LatencySketch,
        peak_in_flight: u64,
        max_in_flight: u64,
        now_us: u64,
    ) -> ControllerState {
        let mut next = ControllerState {
            interval_started_us: now_us,
            ..state
        };
        let needed = if state.slow_start {
            SLOW_START_SAMPLES
        } else {
            MIN_SAMPLES
        };
        if sketch.count() < needed {
            return next;
        }
        let sample = sketch.quantile_us(self.quantile_ppm).max(1);
        next.last_sample_us = sample;
        // At its floor the limit is the best probe there is of the service's own
        // latency: the baseline is what it measures. Elsewhere it only goes down.
        next.baseline_us = if state.baseline_us == 0
            || sample <= state.baseline_us
            || state.limit() <= self.min_limit
        {
            sample
        } else {
            state.baseline_us
        };
        let limit = state.limit_milli as f64 / 1_000.0;
        // The demand was below half the limit: the interval says nothing about capacity.
        if (peak_in_flight as f64) * 2.0 < limit {
            return next;
        }
        let tolerance = f64::from(self.tolerance_ppm) / 1e6;
        let gradient = (tolerance * next.baseline_us as f64 / sample as f64).clamp(0.5, 1.0);
        let in_use = peak_in_flight as f64 + 1.0 >= limit;
        let smoothed = if gradient >= 1.0 && in_use && state.slow_start {
            // Slow start: double until the latency first rises.
            limit * 2.0
        } else {
            let headroom = if gradient >= 1.0 && in_use {
                limit.sqrt()
            } else {
                0.0
            };
            let target = limit * gradient + headroom;
            let smoothing = f64::from(self.smoothing_ppm) / 1e6;
            limit * (1.0 - smoothing) + target * smoothing
        };
        if gradient < 1.0 {
            next.slow_start = false;
        }
        let clamped = smoothed.clamp(self.min_limit as f64, max_in_flight as f64);
        next.limit_milli = (clamped * 1_000.0) as u64;
        // Back at the floor: the baseline is relearnt there, and the limit grows back
        // as from the start.
        if next.limit() <= self.min_limit && gradient < 1.0 {
            next.slow_start = true;
        }
        next
    }
}

/// The controller between intervals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ControllerState {
    /// The limit in thousandths (it moves by fractions between intervals).
    pub limit_milli: u64,
    /// 0 until the first sample.
    pub baseline_us: u64,
    pub interval_started_us: u64,
    /// The last interval's sample, for metrics.
    pub last_sample_us: u64,
    /// The limit doubles each interval while latency stays within tolerance, until it
    /// first rises (from the start, and again after falling to the floor).
    pub slow_start: bool,
}

impl ControllerState {
    /// The limit requests are decided against: whole units, at least 1.
    pub fn limit(&self) -> u64 {
        (self.limit_milli / 1_000).max(1)
    }
}

/// Latencies in log-spaced buckets: fixed size, mergeable by addition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LatencySketch {
    counts: [u32; SKETCH_BUCKETS],
}

impl Default for LatencySketch {
    fn default() -> Self {
        LatencySketch {
            counts: [0; SKETCH_BUCKETS],
        }
    }
}

impl LatencySketch {
    pub fn bucket_of(latency_us: u64) -> usize {
        if latency_us < SKETCH_BASE_US {
            return 0;
        }
        let steps = (latency_us as f64 / SKETCH_BASE_US as f64).log2() * STEPS_PER_DOUBLING;
        (steps as usize + 1).min(SKETCH_BUCKETS - 1)
    }

    /// The upper edge of bucket `i`, µs (what a quantile in it reports; bucket 0 holds
    /// `[0, BASE)`, bucket `i` `[BASE × 2^((i−1)/8), BASE × 2^(i/8))`).
    pub fn upper_edge_us(i: usize) -> u64 {
        (SKETCH_BASE_US as f64 * (i as f64 / STEPS_PER_DOUBLING).exp2()).round() as u64
    }

    pub fn record(&mut self, latency_us: u64) {
        if let Some(c) = self.counts.get_mut(Self::bucket_of(latency_us)) {
            *c = c.saturating_add(1);
        }
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|&c| u64::from(c)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.iter().all(|&c| c == 0)
    }

    pub fn merge(&mut self, other: &LatencySketch) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine = mine.saturating_add(*theirs);
        }
    }

    pub fn clear(&mut self) {
        self.counts = [0; SKETCH_BUCKETS];
    }

    /// The latency below which `quantile_ppm` per million of the recorded ones are, as
    /// the upper edge of its bucket (at most 9 % above the truth); 0 when empty.
    pub fn quantile_us(&self, quantile_ppm: u32) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = (u128::from(total) * u128::from(quantile_ppm)).div_ceil(1_000_000);
        let rank = u64::try_from(rank).unwrap_or(total).clamp(1, total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += u64::from(c);
            if seen >= rank {
                return Self::upper_edge_us(i);
            }
        }
        Self::upper_edge_us(SKETCH_BUCKETS - 1)
    }
}

/// A controller's record in shared data — a rule's, or with `per_key` one key's: the
/// controller, the interval's merged latencies and its peak in flight.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SharedRecord {
    pub controller: ControllerState,
    pub peak_in_flight: u64,
    pub sketch: LatencySketch,
    /// With `per_key`, the fingerprint of the key whose controller this is (0: none yet);
    /// 0 for a rule's record.
    pub owner: u64,
    /// When a worker last merged into the record (or claimed it), µs.
    pub touched_us: u64,
}

const HEADER_BYTES: usize = 8 * 8;
/// The size of an encoded record.
pub const RECORD_BYTES: usize = HEADER_BYTES + SKETCH_BUCKETS * 4;

impl SharedRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RECORD_BYTES);
        let c = &self.controller;
        for word in [
            c.limit_milli,
            c.baseline_us,
            c.interval_started_us,
            c.last_sample_us,
            u64::from(c.slow_start),
            self.peak_in_flight,
            self.owner,
            self.touched_us,
        ] {
            out.extend_from_slice(&word.to_le_bytes());
        }
        for count in &self.sketch.counts {
            out.extend_from_slice(&count.to_le_bytes());
        }
        out
    }

    /// `None` for bytes that are not a record (another size): start afresh.
    pub fn decode(bytes: &[u8]) -> Option<SharedRecord> {
        if bytes.len() != RECORD_BYTES {
            return None;
        }
        let (header, counts) = bytes.split_at(HEADER_BYTES);
        let mut words = header
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
        let mut next = || words.next().unwrap_or(0);
        let controller = ControllerState {
            limit_milli: next(),
            baseline_us: next(),
            interval_started_us: next(),
            last_sample_us: next(),
            slow_start: next() != 0,
        };
        let peak_in_flight = next();
        let owner = next();
        let touched_us = next();
        let mut sketch = LatencySketch::default();
        for (slot, bytes) in sketch.counts.iter_mut().zip(counts.chunks_exact(4)) {
            *slot = u32::from_le_bytes(bytes.try_into().unwrap_or([0; 4]));
        }
        Some(SharedRecord {
            controller,
            peak_in_flight,
            sketch,
            owner,
            touched_us,
        })
    }

    /// Whether slow start may step before the interval ends: it has seen enough
    /// latencies, and the limit was in use (the requests asked for all of it). Slow
    /// start is the controller learning a service it has no measure of yet, from its
    /// floor; its rejections are the price of each step, so it steps on evidence, not on
    /// the clock: about once per tick, not once per interval.
    pub fn slow_start_step_due(&self) -> bool {
        self.controller.slow_start
            && self.sketch.count() >= SLOW_START_SAMPLES
            && self.peak_in_flight.saturating_add(1) >= self.controller.limit()
    }

    /// A new controller for the key whose fingerprint is `owner`.
    pub fn claimed(owner: u64, adaptive: &Adaptive, now_us: u64) -> SharedRecord {
        SharedRecord {
            controller: adaptive.start(now_us),
            owner,
            touched_us: now_us,
            ..SharedRecord::default()
        }
    }

    /// Whether the key `owner` may take this record: it is nobody's, or no worker has
    /// merged into it for [`Adaptive::stale_after_us`] (its key went idle).
    pub fn free_for(&self, owner: u64, adaptive: &Adaptive, now_us: u64) -> bool {
        let stale_at = self.touched_us.saturating_add(adaptive.stale_after_us());
        self.owner == 0 || self.owner == owner || now_us >= stale_at
    }

    /// Adds a worker's interval into the record and, when the interval is over at
    /// `now_us`, runs the controller and starts the next one. A record that does not
    /// exist yet (`None`) starts from `adaptive.start`.
    pub fn merge(
        current: Option<SharedRecord>,
        worker: &WorkerLatency,
        adaptive: &Adaptive,
        max_in_flight: u64,
        now_us: u64,
    ) -> SharedRecord {
        let mut record = current.unwrap_or_else(|| SharedRecord {
            controller: adaptive.start(now_us),
            ..SharedRecord::default()
        });
        record.touched_us = record.touched_us.max(now_us);
        record.sketch.merge(&worker.sketch);
        record.peak_in_flight = record.peak_in_flight.max(worker.peak_in_flight);
        let ends_at = record
            .controller
            .interval_started_us
            .saturating_add(adaptive.interval_us);
        if now_us >= ends_at || record.slow_start_step_due() {
            record.controller = adaptive.step(
                record.controller,
                &record.sketch,
                record.peak_in_flight,
                max_in_flight,
                now_us,
            );
            record.sketch.clear();
            record.peak_in_flight = 0;
        }
        record
    }
}

/// What one worker saw of an adaptive rule since its last merge, and the limit it
/// decides with until the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLatency {
    pub limit: u64,
    pub sketch: LatencySketch,
    pub peak_in_flight: u64,
}

/// A worker's latencies of a `per_key` rule, a [`WorkerLatency`] per key it saw
/// lately, at most `capacity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedLatencies {
    pub entries: BTreeMap<(u64, u64), KeyedEntry>,
    pub capacity: usize,
}

/// One key's latencies in a worker, and where its controller is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedEntry {
    pub latency: WorkerLatency,
    /// Which of the rule's records holds the key's controller; `None` while it has none
    /// (every record it may use belongs to a key still active): decided against
    /// `max_in_flight`, and looked for again on the tick.
    pub record: Option<u32>,
    pub last_seen_us: u64,
}

impl KeyedLatencies {
    pub fn new(capacity: u32) -> KeyedLatencies {
        KeyedLatencies {
            entries: BTreeMap::new(),
            capacity: capacity as usize,
        }
    }

    /// Room for one more key: forgets the least recently seen key with nothing waiting
    /// to be merged when full. `false` when every key has samples waiting.
    pub fn make_room(&mut self) -> bool {
        if self.entries.len() < self.capacity {
            return true;
        }
        let idle = self
            .entries
            .iter()
            .filter(|(_, e)| e.latency.sketch.is_empty())
            .min_by_key(|(_, e)| e.last_seen_us)
            .map(|(k, _)| *k);
        match idle {
            Some(key) => {
                self.entries.remove(&key);
                true
            }
            None => false,
        }
    }

    /// Forgets the keys not seen since `before_us` that have nothing to merge: their
    /// records go stale and can serve other keys.
    pub fn forget_idle(&mut self, before_us: u64) {
        self.entries
            .retain(|_, e| e.last_seen_us >= before_us || !e.latency.sketch.is_empty());
    }
}

impl WorkerLatency {
    pub fn new(adaptive: &Adaptive) -> WorkerLatency {
        WorkerLatency {
            limit: adaptive.initial_limit,
            sketch: LatencySketch::default(),
            peak_in_flight: 0,
        }
    }

    /// Whether the requests in flight reached the limit since the last merge (a
    /// request it turned away saw it full).
    pub fn reached(&self) -> bool {
        self.peak_in_flight >= self.limit.max(1)
    }

    /// Merged: start the next batch.
    pub fn merged(&mut self, limit: u64) {
        self.limit = limit;
        self.sketch.clear();
        self.peak_in_flight = 0;
    }
}

#[cfg(test)]
mod tests;
