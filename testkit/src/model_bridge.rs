//! weir-bridge's semantics on an in-process model of Redis ([`ModelBridge`]): each item
//! decided by the core's own reference of its script ([`Limit::grant`],
//! [`SlidingLog::grant`], [`ShareLimit::decide`]), each commit settled by the core's
//! `settle`. What [`crate::simulation`] and the core's searches ask in place of the bridge.
//!
//! [`Limit::grant`]: weir_core::algorithms::Limit::grant
//! [`SlidingLog::grant`]: weir_core::algorithms::sliding_log::SlidingLog::grant

use std::collections::BTreeMap;

use weir_core::algorithms::{GlobalLimit, Grant, SlotState};
use weir_core::key::redis_share_key_id;
use weir_core::share::{ShareAsk, ShareLimit, ShareState, MAX_SHARE_KEYS};
use weir_core::wire::{v2, v3, CheckedItem};

/// weir-bridge's `POST /v2/acquire` on a model of Redis: each item decided in order by
/// the core's reference of its script, stopping after an enforcing item's denial.
#[derive(Default)]
pub struct ModelBridge {
    slots: BTreeMap<String, SlotState>,
    /// Shared limits' parents (`lua/share.lua`'s hash, as [`ShareLimit::decide`] keeps it).
    shares: BTreeMap<String, ShareState>,
    logs: BTreeMap<String, Vec<u64>>,
    /// Calls answered.
    pub calls: u64,
    /// Items decided (one Redis script each on the real bridge).
    pub items: u64,
    /// Commit calls answered (`/v3/commit`).
    pub commits: u64,
    /// Spans of Redis time `[from, to)` in µs when the bridge answers 503 (Redis down).
    pub outages: Vec<(u64, u64)>,
}

impl ModelBridge {
    /// The reply to a request body, decided at `now_us` (Redis's clock), or the status
    /// and body the bridge would answer instead (400: a request it refuses; 503: Redis
    /// down, during one of `outages`).
    pub fn acquire(&mut self, body: &[u8], now_us: u64) -> Result<v2::Reply, (u16, String)> {
        if self
            .outages
            .iter()
            .any(|&(from, to)| (from..to).contains(&now_us))
        {
            return Err((503, r#"{"error":"redis unavailable"}"#.to_string()));
        }
        let request = v2::Request::parse(body).map_err(|e| (400, e.to_string()))?;
        self.calls += 1;
        let mut items = Vec::with_capacity(request.items.len());
        for CheckedItem { item, limit } in &request.items {
            self.items += 1;
            let key = model_key(&request.domain, &item.rule, &item.descriptor, limit);
            let grant = match (limit, &item.share) {
                (_, Some(share)) => self
                    .share(format!("{key}:share"), limit, share, item.ask(), now_us)
                    .ok_or_else(|| (400, format!("{} cannot be shared", limit.kind())))?,
                (GlobalLimit::Slot(limit), None) => {
                    let state = self.slots.get(&key).copied();
                    let (grant, next) = limit.grant(state, now_us, item.ask());
                    if let Some(next) = next {
                        self.slots.insert(key, next);
                    }
                    grant
                }
                (GlobalLimit::SlidingLog(log), None) => {
                    let events = self.logs.entry(key).or_default();
                    let window_us = log.window_us();
                    events.retain(|&t| t.saturating_add(window_us) > now_us);
                    let ask = item.ask();
                    let grant = log.grant(events, now_us, ask);
                    let at = now_us.saturating_add(ask.ttl_us);
                    let from = events.partition_point(|&t| t <= at);
                    let logged = usize::try_from(grant.granted).unwrap_or(usize::MAX);
                    events.splice(from..from, std::iter::repeat_n(at, logged));
                    grant
                }
            };
            items.push(v2::Granted::new(item.id, &grant, now_us));
            if !grant.decision.allowed && !item.shadow {
                break;
            }
        }
        Ok(v2::Reply { items })
    }

    /// A shared limit's item on the model: `lua/share.lua` as the core's reference
    /// decides it, the key within the parent named by the id the bridge gives it; `None`
    /// for a limit that cannot be shared (the request's check refuses it first).
    fn share(
        &mut self,
        key: String,
        limit: &GlobalLimit,
        share: &v2::WireShare,
        ask: weir_core::algorithms::Ask,
        now_us: u64,
    ) -> Option<Grant> {
        let shared = ShareLimit::of(limit, share.max_keys)?;
        let asking = ShareAsk {
            key: (!share.key.is_empty()).then(|| redis_share_key_id(&share.key)),
            weight: share.weight,
            cost: ask.cost,
            want: ask.want,
        };
        let (decided, next) = shared.decide(self.shares.remove(&key), now_us, asking);
        self.shares.insert(key, next);
        Some(shared.grant(&decided, ask.cost, now_us))
    }

    /// A shared limit's commit on the model: `lua/share_settle.lua` as the core's
    /// reference settles it; whether the parent's state changed.
    fn settle_share(
        &mut self,
        key: String,
        limit: &GlobalLimit,
        share_key: &[String],
        item: &v3::CommitItem,
        now_us: u64,
    ) -> bool {
        let Some(shared) = ShareLimit::of(limit, MAX_SHARE_KEYS) else {
            return false;
        };
        let id = (!share_key.is_empty()).then(|| redis_share_key_id(share_key));
        let state = self.shares.get(&key).cloned();
        let at = (item.counted_at_us, now_us);
        match shared.settle(state, at, id, (item.reserved, item.actual)) {
            Some(next) => {
                self.shares.insert(key, next);
                true
            }
            None => false,
        }
    }

    /// weir-bridge's `POST /v3/commit` on the model: each item's cost settled in the
    /// key's state as the settle scripts do ([`weir_core::algorithms::Limit::settle`]), at
    /// `now_us`; or the status and body the bridge would answer instead.
    pub fn commit(&mut self, body: &[u8], now_us: u64) -> Result<v3::CommitReply, (u16, String)> {
        if self
            .outages
            .iter()
            .any(|&(from, to)| (from..to).contains(&now_us))
        {
            return Err((503, r#"{"error":"redis unavailable"}"#.to_string()));
        }
        let request = v3::CommitRequest::parse(body).map_err(|e| (400, e.to_string()))?;
        self.commits += 1;
        let mut items = Vec::with_capacity(request.items.len());
        for CheckedItem { item, limit } in &request.items {
            let GlobalLimit::Slot(slot_limit) = limit else {
                return Err((400, format!("{} cannot settle", limit.kind())));
            };
            let key = model_key(&request.domain, &item.rule, &item.descriptor, limit);
            if let Some(share_key) = &item.share_key {
                let settled =
                    self.settle_share(format!("{key}:share"), limit, share_key, item, now_us);
                items.push(v3::Committed {
                    id: item.id,
                    settled,
                });
                continue;
            }
            let state = self.slots.get(&key).copied();
            let next = slot_limit.settle(
                state,
                item.counted_at_us,
                item.reserved,
                item.actual,
                now_us,
            );
            if let Some(next) = next {
                self.slots.insert(key, next);
            }
            items.push(v3::Committed {
                id: item.id,
                settled: next.is_some(),
            });
        }
        Ok(v3::CommitReply { items })
    }
}

/// The model's key of one descriptor of one rule, with the limit Redis runs (its
/// parameters included, as the bridge's key tag has them).
/// The key's state in the model, named as weir-bridge names it in Redis
/// (`redis_key_tag`): domain, rule, algorithm and descriptor, not the limit's parameters.
/// Requests carrying other limits (a tenant's own, a reload) meet the one state.
fn model_key(domain: &str, rule: &str, descriptor: &[String], limit: &GlobalLimit) -> String {
    format!(
        "{domain}\u{0}{rule}\u{0}{}\u{0}{:?}",
        descriptor.join("\u{1}"),
        limit.kind(),
    )
}
