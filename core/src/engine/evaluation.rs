//! One request's evaluation as it goes: what each rule decided, what waits for the
//! bridge, a request held by a delaying rule, and what is settled when the response
//! ends — with the steps every scope shares (a rule that applies, a decision served from
//! held units).

use crate::algorithms::{Decision, GlobalLimit, Hold, Limit, Policy};
use crate::delay::Turn;
use crate::key::{KeyHash, KeyHasher, Seed};
use crate::lease::{LeaseSlot, Spend};
use crate::rules::{Delay, FactSource, Facts, RequestLimit, Rule, RuleId, ShareOf};
use crate::time::{Micros, Nanos, Span};
use crate::wire::v2::WireShare;
use crate::wire::ReplyError;

use super::report::{signed, RuleOutcome, RuleReport, Source, Verdict};

/// A global rule that needs the bridge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingItem {
    pub rule: RuleId,
    pub hash: KeyHash,
    pub descriptor: Vec<String>,
    pub cost: u64,
    /// Units to take now when they are free (a lease), and to reserve when not.
    pub want: u64,
    pub reserve: u64,
    /// What this Envoy last heard of the key: units remaining, and when (µs).
    pub last_known: Option<(u64, u64)>,
    /// The denial its call set in the key's slot while in flight, until then (µs; 0:
    /// none): see [`crate::lease::LeaseSlot::deny_while_asking`].
    pub asking_until_us: u64,
    /// A clamping rule's request: `cost` is the least it may be reserved, `want` its
    /// estimate, and this its prompt's share (see [`Clamped`]).
    pub clamp_prompt: Option<u64>,
    /// What the lease lookup found (placement, CAS retries, a store error): the rule's
    /// final report starts from it.
    pub lookup: RuleReport,
    /// The limit the request carries, when its rule reads it from the request: Redis
    /// decides by it. `hash` is then the key's and this limit's (see
    /// [`Applied::units_hash`]): units leased and denials cached under one limit serve
    /// only requests carrying it.
    pub limit: Option<GlobalLimit>,
    /// A shared limit's key within the parent, its weight and key count: Redis decides
    /// the item by the parent's shares.
    pub share: Option<WireShare>,
}

impl PendingItem {
    /// The rule as it applies to the item's request at `now_us`.
    pub(super) fn applied<'r>(&self, rule: &'r Rule, now_us: u64) -> Applied<'r> {
        Applied {
            rule,
            hash: self.hash,
            limit: None,
            cost: if self.clamp_prompt.is_some() {
                self.want
            } else {
                self.cost
            },
            least: self.cost,
            prompt: self.clamp_prompt,
            share: None,
            now_us,
        }
    }
}

/// The state of one request's evaluation. It owns everything, so the filter can keep
/// it while the request waits for the bridge.
#[derive(Debug, Default)]
pub struct Evaluation {
    /// One per enforcing rule that decided, in order; at most one is a denial.
    pub verdicts: Vec<Verdict>,
    /// The enforcing rule that denied the request.
    pub denied_by: Option<RuleId>,
    /// A rule whose bridge failed with `failure_mode: deny`.
    pub unavailable: Option<RuleId>,
    /// One per rule decided or skipped, in the order they were settled (rules after a
    /// denial are not looked at; a rule waiting for the bridge gets its report with the
    /// reply, from its [`PendingItem::lookup`]).
    pub reports: Vec<RuleReport>,
    /// The shadow rules that would have denied.
    pub shadow_limited: Vec<RuleId>,
    /// Global rules to ask the bridge about (empty once completed).
    pub pending: Vec<PendingItem>,
    /// Set when the bridge failed or was skipped (see [`BRIDGE_BACKOFF_US`](super::BRIDGE_BACKOFF_US)).
    pub bridge_error: Option<BridgeError>,
    /// A rule holds the request instead of denying it (`on_limit.delay`): the request
    /// waits until [`Hold::due_us`], then goes on with [`Engine::release`](super::Engine::release).
    pub held: Option<HeldRequest>,
    /// The request was held and released (or its release came too late).
    pub delayed: Option<Delayed>,
    /// Rules that reserved less than the request's estimate could (`commit.clamp`): the
    /// request goes on with its body's output lowered to the least of them.
    pub clamped: Vec<Clamped>,
    /// Rules whose cost is corrected when the response ends (`commit`), one per rule
    /// that admitted the request: settle each with [`Engine::commit`](super::Engine::commit) (a concurrency
    /// rule's place: give it back with [`Engine::end_in_flight`](super::Engine::end_in_flight) on the same worker).
    pub commits: Vec<PendingCommit>,
    /// Keys of exact global rules Redis answered for this evaluation, with the units it
    /// had left: what [`Engine::remember_answers`](super::Engine::remember_answers)
    /// gives the worker that asked.
    pub answered: Vec<(RuleId, KeyHash, u64)>,
    /// Changes to rules' units outstanding whose report was replaced or dropped (a
    /// second look at a lease slot, a held request released too late).
    pub(super) carried: Vec<(RuleId, i64)>,
    /// The policy of the limit the request carries under each rule that reads it from
    /// the request: what its RateLimit headers advertise.
    pub(super) own_policies: Vec<(RuleId, Policy)>,
}

/// What a rule with a commit counted for a request, to be settled with the response's
/// actual cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingCommit {
    pub rule: RuleId,
    pub(super) key: CommitKey,
    /// Units counted when the request was admitted (its estimated cost).
    pub reserved: u64,
    /// When they were counted: this Envoy's clock for a local rule, Redis's for a global
    /// one.
    pub counted_at: Micros,
    /// The limit the request carried, when its rule reads it from the request: the
    /// settlement runs by it.
    pub(super) limit: Option<GlobalLimit>,
}

/// What a clamping rule reserved for an admitted request: its body is sent with at most
/// `output` tokens of output (the reservation less the prompt's share).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clamped {
    pub rule: RuleId,
    pub output: u64,
    /// The reservation is below the request's estimate: the key had less left.
    pub lowered: bool,
}

/// Where the units of a pending commit were counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum CommitKey {
    /// In this Envoy's shared data.
    Local(KeyHash),
    /// In Redis: the key's descriptor, to settle through the bridge (`/v3/commit`), and
    /// for a shared limit the key within it (its descriptor parts).
    Global {
        descriptor: Vec<String>,
        share_key: Option<Vec<String>>,
    },
    /// In a shared rule's parent in this Envoy's shared data, for its key within it.
    Share { parent: KeyHash, key: Option<u64> },
}

impl PendingCommit {
    /// Whether it is settled in Redis (through the bridge), not in shared data.
    pub fn is_global(&self) -> bool {
        matches!(self.key, CommitKey::Global { .. })
    }
}

/// A request a rule holds: its place in the key's schedule is taken (a shared rule's
/// waits its turn instead); the rule's decision is recorded when the request is
/// released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldRequest {
    pub rule: RuleId,
    pub hold: Hold,
    /// A shared rule holds the request until its window ends, with no place taken: it
    /// waits its key's turn ([`crate::delay::Turn`]) and is decided again when released.
    pub turn: Option<Turn>,
    /// When the request arrived (µs): its delay's `max` counts from then.
    pub arrived_us: u64,
    /// The deadline the request stated (µs since the epoch), if any: released after
    /// it, the request is not forwarded ([`crate::deadline`]).
    pub deadline_us: Option<u64>,
    pub(super) decision: Decision,
    pub(super) report: RuleReport,
}

/// A held request's release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delayed {
    pub rule: RuleId,
    /// From the request's arrival to its release.
    pub waited: Span,
    /// The release came after [`Hold::release_by_us`]: the slot was lost and the rule
    /// decided the request again.
    pub late: bool,
    /// The release came after the request's own deadline: it was denied, not
    /// forwarded (its client no longer waits for it).
    pub past_deadline: bool,
}

/// A delaying rule's offer to hold the request it would deny.
#[derive(Debug, Clone, Copy)]
pub(super) struct HoldOffer {
    /// The longest this request may still be held: what is left of the delay's `max`,
    /// or less, until the deadline the request stated.
    pub(super) max_wait_us: u64,
    /// What is left of the delay's `max` alone.
    pub(super) max_left_us: u64,
    /// The worker has room for one more held request of the rule.
    pub(super) room: bool,
}

impl HoldOffer {
    /// What a rule with `delay` offers the request that arrived at `arrived_us` (and must
    /// be answered by `deadline_us`, if it said so) when it would deny it at `now_us`,
    /// its worker having `room` for it or not. None when the rule does not delay, or
    /// some rule counted the request before: it would be admitted later than they
    /// counted it.
    pub(super) fn of(
        delay: Option<Delay>,
        eval: &Evaluation,
        room: bool,
        now_us: u64,
        (arrived_us, deadline_us): (u64, Option<u64>),
    ) -> Option<HoldOffer> {
        let delay = delay.filter(|_| !eval.counted())?;
        let max_left_us = delay
            .max_us
            .saturating_sub(now_us.saturating_sub(arrived_us));
        let deadline_left_us = deadline_us.map(|at| at.saturating_sub(now_us));
        Some(HoldOffer {
            max_wait_us: deadline_left_us.map_or(max_left_us, |d| d.min(max_left_us)),
            max_left_us,
            room,
        })
    }

    /// Whether a denial with `retry_after_ns` would be held (given room).
    pub(super) fn covers(&self, retry_after_ns: Option<u64>) -> bool {
        retry_after_ns.is_some_and(|ns| Nanos(ns).as_micros_ceil().us() <= self.max_wait_us)
    }

    /// Whether the delay's `max` alone would hold it: when [`HoldOffer::covers`] says no,
    /// the request's own deadline came first.
    pub(super) fn max_covers(&self, retry_after_ns: Option<u64>) -> bool {
        retry_after_ns.is_some_and(|ns| Nanos(ns).as_micros_ceil().us() <= self.max_left_us)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BridgeError {
    /// Not called: it failed [`BRIDGE_FAILURES_TO_SKIP`](super::BRIDGE_FAILURES_TO_SKIP)
    /// calls in a row less than [`BRIDGE_BACKOFF_US`](super::BRIDGE_BACKOFF_US) ago.
    Skipped,
    Reply(ReplyError),
}

impl HeldRequest {
    /// The units the request holds: counted in the key's state at its place in the
    /// schedule, outstanding until it is released (or denied, or its client leaves).
    /// None for a request waiting a turn: it took no place.
    pub fn units(&self) -> u64 {
        match self.turn {
            Some(_) => 0,
            None => self.report.cost,
        }
    }
}

impl Evaluation {
    /// The changes this evaluation made to its rules' units outstanding and not drained
    /// yet (see [`RuleReport::outstanding_units`] and [`super::outstanding`]).
    pub fn outstanding_changes(&self) -> impl Iterator<Item = (RuleId, i64)> + '_ {
        let pending = self.pending.iter().map(|item| &item.lookup);
        let held = self.held.iter().map(|h| &h.report);
        self.reports
            .iter()
            .chain(pending)
            .chain(held)
            .map(|r| (r.rule, r.outstanding_units))
            .chain(self.carried.iter().copied())
            .filter(|&(_, units)| units != 0)
    }

    /// Hands `f` every change [`Evaluation::outstanding_changes`] yields and forgets
    /// them: a filter that drains after each step (evaluated, answered, held, released)
    /// keeps a gauge exact while the request waits.
    pub fn drain_outstanding(&mut self, mut f: impl FnMut(RuleId, i64)) {
        let pending = self.pending.iter_mut().map(|item| &mut item.lookup);
        let held = self.held.iter_mut().map(|h| &mut h.report);
        for report in self.reports.iter_mut().chain(pending).chain(held) {
            let units = std::mem::take(&mut report.outstanding_units);
            if units != 0 {
                f(report.rule, units);
            }
        }
        for (rule, units) in self.carried.drain(..) {
            if units != 0 {
                f(rule, units);
            }
        }
    }

    /// The request must not reach the upstream.
    pub fn denied(&self) -> bool {
        self.denied_by.is_some() || self.unavailable.is_some()
    }

    /// No further rule is looked at now: the request is denied or held.
    pub(super) fn stopped(&self) -> bool {
        self.denied() || self.held.is_some()
    }

    /// Some rule has counted the request already (or will, at the bridge): holding it
    /// then would admit it later than that rule counted it.
    pub(super) fn counted(&self) -> bool {
        !self.pending.is_empty()
            || self
                .reports
                .iter()
                .any(|r| r.outcome == RuleOutcome::Allowed && r.cost > 0)
    }

    /// Turns a hold into a denial at `now` (the request cannot wait: its worker is
    /// going away): the holding rule denies it, retry when it would have been released.
    /// Its place in the schedule is not given back.
    pub fn deny_held(&mut self, now: Micros) {
        let now_us = now.us();
        let Some(held) = self.held.take() else {
            return;
        };
        let mut report = held.report;
        report.outcome = RuleOutcome::Limited;
        report.decided_at_us = now_us;
        // Outstanding since it was held; denied now.
        report.outstanding_units -= signed(held.units());
        self.reports.push(report);
        let decision = Decision {
            allowed: false,
            remaining: 0,
            retry_after_ns: Some(
                Span(held.hold.due_us.saturating_sub(now_us).max(1))
                    .as_nanos()
                    .ns(),
            ),
            ..held.decision
        };
        self.verdicts.push(Verdict {
            rule: held.rule,
            decision,
        });
        self.denied_by = Some(held.rule);
    }

    /// Turns a hold into a denial at `now` because another key's request took its place
    /// in a full queue ([`crate::delay::Waiting::hold`]): denied as [`Evaluation::deny_held`]
    /// does, counted as the queue being full.
    pub fn push_out(&mut self, now: Micros) {
        self.deny_held(now);
        if let Some(report) = self.reports.last_mut() {
            report.delay_queue_full = true;
        }
    }

    /// Holds the request for `rule` (in its place, or waiting its `turn`); its decision
    /// is recorded on release.
    pub(super) fn hold(
        &mut self,
        mut report: RuleReport,
        rule: &Rule,
        decision: Decision,
        hold: Hold,
        turn: Option<Turn>,
    ) {
        // Its units are in the key's schedule, not admitted until its release (a turn
        // takes none).
        if turn.is_none() {
            report.outstanding_units += signed(report.cost);
        }
        self.held = Some(HeldRequest {
            rule: rule.id,
            hold,
            turn,
            arrived_us: report.decided_at_us,
            deadline_us: None,
            decision,
            report,
        });
    }

    /// Records a delaying rule's decision, or holds the request when the rule did (and
    /// notes why a denial offered a hold was not held).
    pub(super) fn record_or_hold(
        &mut self,
        mut report: RuleReport,
        rule: &Rule,
        decision: Decision,
        hold: Option<Hold>,
        offer: Option<HoldOffer>,
    ) {
        if let Some(hold) = hold {
            self.hold(report, rule, decision, hold, None);
            return;
        }
        let retry_after_ns = decision.retry_after_ns;
        report.delay_queue_full =
            !decision.allowed && offer.is_some_and(|o| !o.room && o.covers(retry_after_ns));
        report.delay_past_deadline = !decision.allowed
            && offer.is_some_and(|o| {
                o.room && !o.covers(retry_after_ns) && o.max_covers(retry_after_ns)
            });
        self.record(report, rule, decision);
    }

    /// Records a decided rule: its report, and for enforcing rules the verdict (a
    /// denial stops the evaluation); shadow denials are only noted.
    pub(super) fn record(&mut self, mut report: RuleReport, rule: &Rule, decision: Decision) {
        report.outcome = match (decision.allowed, rule.shadow) {
            (true, _) => RuleOutcome::Allowed,
            (false, true) => RuleOutcome::ShadowLimited,
            (false, false) => RuleOutcome::Limited,
        };
        self.reports.push(report);
        if rule.shadow {
            if !decision.allowed {
                self.shadow_limited.push(rule.id);
            }
            return;
        }
        self.verdicts.push(Verdict {
            rule: rule.id,
            decision,
        });
        if !decision.allowed {
            self.denied_by = Some(rule.id);
        }
    }
}

/// A rule that applies to the request decided at `now_us`: its key's hash and the
/// request's cost — for a clamping rule, the most it is reserved, down to `least`.
pub(super) struct Applied<'a> {
    pub(super) rule: &'a Rule,
    pub(super) hash: KeyHash,
    /// The limit this request carries, when its rule reads it from the request
    /// ([`Rule::request_limit`]); `None`: the rule's own.
    pub(super) limit: Option<RequestLimit>,
    pub(super) cost: u64,
    /// `cost` unless the rule clamps the request ([`Rule::clamp_range`]).
    pub(super) least: u64,
    /// A clamping rule's prompt share of the estimate.
    pub(super) prompt: Option<u64>,
    /// A shared limit's key within the parent, and its weight ([`Rule::share_of`]).
    pub(super) share: Option<ShareOf>,
    pub(super) now_us: u64,
}

impl Applied<'_> {
    /// Records what a clamping rule reserved (`granted`) for the admitted request, and
    /// returns it as the request's cost under the rule.
    pub(super) fn reserved(&self, eval: &mut Evaluation, granted: u64) -> u64 {
        if let Some(prompt) = self.prompt {
            let output = granted.saturating_sub(prompt);
            if output > 0 {
                eval.clamped.push(Clamped {
                    rule: self.rule.id,
                    output,
                    lowered: granted < self.cost,
                });
            }
        }
        granted
    }

    /// The rule's report, before its decision.
    pub(super) fn report(&self) -> RuleReport {
        RuleReport {
            cost: self.cost,
            limit_invalid: self.limit.as_ref().is_some_and(|l| l.invalid),
            ..RuleReport::new(self.rule.id, self.now_us)
        }
    }

    /// The limit this request is decided by in a slot: its own, or `configured`, the
    /// rule's.
    pub(super) fn limit_or<'l>(&'l self, configured: &'l Limit) -> &'l Limit {
        self.limit
            .as_ref()
            .and_then(|own| own.limit.as_slot())
            .unwrap_or(configured)
    }

    /// Where this request's units taken ahead are kept: the key's, and the limit's when
    /// the request carries its own, so that units taken (or a denial cached) under one
    /// limit never serve a request carrying another.
    /// Under a shared limit, the key's within the parent too: a denial Redis gave one
    /// user never denies another.
    pub(super) fn units_hash(&self) -> KeyHash {
        let limit = self.limit.as_ref().map_or(0, |own| own.fingerprint);
        let share = self
            .share
            .and_then(|s| s.key)
            .map_or(0, |key| key.rotate_left(17));
        KeyHash {
            set_hash: self.hash.set_hash,
            fingerprint: self.hash.fingerprint ^ limit ^ share,
        }
    }
}

/// Where an evaluation starts: the first rule to look at, and when the request arrived.
#[derive(Debug, Clone, Copy)]
pub(super) struct Resume {
    pub(super) first_rule: usize,
    pub(super) arrived_us: u64,
}

/// Whether `rule` applies to the request, and if so its key's hash and the cost. A rule
/// that does not match or whose key is missing is reported here.
pub(super) fn applies<'r, F: FactSource>(
    rule: &'r Rule,
    seed: &Seed,
    facts: &mut Facts<'_, F>,
    now_us: u64,
    eval: &mut Evaluation,
) -> Option<Applied<'r>> {
    let mut report = RuleReport::new(rule.id, now_us);
    if !rule.matches(facts) {
        eval.reports.push(report);
        return None;
    }
    let mut hasher = KeyHasher::new(seed);
    if !rule.visit_key(facts, |origin, bytes| hasher.part(origin, bytes)) {
        report.outcome = RuleOutcome::KeyMissing;
        eval.reports.push(report);
        return None;
    }
    let estimate = rule.cost(facts);
    let (least, cost, prompt) = rule.clamp_range(facts, estimate);
    let limit = rule.request_limit(facts);
    if let Some(own) = &limit {
        eval.own_policies.push((rule.id, own.limit.policy()));
    }
    let quota = limit
        .as_ref()
        .map_or_else(|| rule.policy(), |own| own.limit.policy())
        .quota;
    if least > quota {
        // A clamping rule's request whose prompt alone is more than the limit ever
        // holds: it can never be admitted.
        report.cost = least;
        report.limit_invalid = limit.as_ref().is_some_and(|l| l.invalid);
        let never = Decision {
            allowed: false,
            limit: quota,
            remaining: 0,
            retry_after_ns: None,
            reset_after_ns: 0,
        };
        eval.record(report, rule, never);
        return None;
    }
    Some(Applied {
        rule,
        hash: hasher.finish(),
        limit,
        cost,
        least,
        prompt,
        share: rule.share_of(facts, seed),
        now_us,
    })
}

/// A decision served from what a slot holds (units, a cached denial), without asking
/// shared data or the bridge.
pub(super) struct Served {
    source: Source,
    decision: Decision,
    /// When a spent unit's admission counts (see [`Spend::Spent`]).
    at_us: Option<u64>,
}

impl Served {
    /// What `spend` decided from `slot` (`None`: a miss), for a limit of `quota`, with
    /// `units` as the source of a spent or not-yet-due unit. RateLimit numbers are what
    /// the slot last heard from the shared bucket or Redis, plus what it holds.
    pub(super) fn from_spend(
        spend: Spend,
        slot: &LeaseSlot,
        quota: u64,
        now_us: u64,
        units: Source,
    ) -> Option<Served> {
        let (remaining, reset_after_ns) = slot.remote_view(now_us);
        let decision = |allowed: bool, retry_after_ns: Option<u64>| Decision {
            allowed,
            limit: quota,
            remaining: if allowed { remaining.min(quota) } else { 0 },
            retry_after_ns,
            reset_after_ns,
        };
        let (source, decision, at_us) = match spend {
            Spend::Spent { at_us, .. } => (units, decision(true, None), Some(at_us)),
            Spend::NotYetDue { retry_after_ns } => {
                (units, decision(false, Some(retry_after_ns)), None)
            }
            Spend::Denied { retry_after_ns } => (
                Source::DenialCache,
                decision(false, Some(retry_after_ns)),
                None,
            ),
            Spend::Miss { .. } => return None,
        };
        Some(Served {
            source,
            decision,
            at_us,
        })
    }

    pub(super) fn record(self, eval: &mut Evaluation, mut report: RuleReport, rule: &Rule) {
        if let Some(at_us) = self.at_us {
            report.decided_at_us = at_us;
        }
        report.source = Some(self.source);
        eval.record(report, rule, self.decision);
    }
}
