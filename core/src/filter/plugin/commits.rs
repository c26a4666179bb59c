//! A plugin's global commits: queued when a response settles a cost, sent to the bridge
//! from the tick in batches, and their answers counted.
use super::calls::{call_headers, call_status};
use super::Plugin;
use crate::bounds::{MAX_BODY_BYTES, MAX_ITEMS};
use crate::filter::host::{Host, LogLevel};
use crate::rules::RuleId;
use crate::wire::v3;

/// How often commits waiting for the bridge are sent.
pub const COMMIT_TICK_MS: u32 = 10;

/// Most commits a worker keeps waiting; past it a commit is dropped (its estimate
/// stands) and counted in `commit_errors`.
pub const MAX_WAITING_COMMITS: usize = 4_096;
/// Most `/v3/commit` calls a worker has in flight.
pub const MAX_COMMIT_CALLS: usize = 16;

/// A global commit: the item for the bridge, with what the metrics need.
pub struct QueuedCommit {
    pub rule: RuleId,
    pub item: v3::CommitItem,
}

/// Global commits of one worker: waiting, and in flight by call token.
#[derive(Default)]
pub struct CommitQueue {
    waiting: Vec<QueuedCommit>,
    in_flight: Vec<(u32, Vec<QueuedCommit>)>,
}

impl CommitQueue {
    /// Queues a commit; false when the queue is full.
    pub fn push(&mut self, commit: QueuedCommit) -> bool {
        if self.waiting.len() >= MAX_WAITING_COMMITS {
            return false;
        }
        self.waiting.push(commit);
        true
    }

    pub fn is_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The commits the call `token` carried, if it was a commit call.
    pub fn land(&mut self, token: u32) -> Option<Vec<QueuedCommit>> {
        let at = self.in_flight.iter().position(|(t, _)| *t == token)?;
        Some(self.in_flight.swap_remove(at).1)
    }
}

impl Plugin {
    /// Sends the commits waiting for the bridge (from the root context's tick), in calls
    /// of at most [`MAX_ITEMS`] items, at most [`MAX_COMMIT_CALLS`] in flight.
    pub fn send_commits<H: Host>(&self, host: &H) {
        let Some(bridge) = &self.engine.config.bridge else {
            return;
        };
        let mut queue = self.commits.borrow_mut();
        while queue.is_waiting() && queue.in_flight.len() < MAX_COMMIT_CALLS {
            let take = queue.waiting.len().min(MAX_ITEMS);
            let mut batch: Vec<QueuedCommit> = queue.waiting.drain(..take).collect();
            // Ids unique within the call: the reply is matched to the batch by them.
            for (id, commit) in (0u16..).zip(batch.iter_mut()) {
                commit.item.id = id;
            }
            let body = self
                .engine
                .commit_request(batch.iter().map(|c| c.item.clone()).collect());
            let headers = call_headers(bridge, v3::COMMIT_PATH);
            match host.dispatch_call(&bridge.cluster, &headers, &body, bridge.timeout_ms) {
                Ok(token) => {
                    if let Ok(now) = host.now() {
                        self.engine.note_call_made(host, now.us());
                    }
                    queue.in_flight.push((token, batch));
                }
                Err(e) => {
                    host.log(
                        LogLevel::Warn,
                        &format!(
                            "cannot send commits to the bridge cluster {:?}: {e}",
                            bridge.cluster
                        ),
                    );
                    for commit in &batch {
                        self.metrics.commit_failed(commit.rule);
                    }
                }
            }
        }
    }

    /// The answer to a commit call: each commit settled or not (its result found by its
    /// id), or the call failed (the estimates stand): a bad reply fails the whole call.
    pub(super) fn commits_answered<H: Host>(
        &self,
        host: &H,
        commits: Vec<QueuedCommit>,
        body_size: usize,
    ) {
        let status = call_status(host);
        let body = if body_size <= MAX_BODY_BYTES {
            host.call_response_body(body_size)
                .ok()
                .flatten()
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let answered = match v3::decode_reply(status, &body, &commits, |c| c.item.id) {
            Ok(answered) => answered,
            Err(error) => {
                host.log(
                    LogLevel::Warn,
                    &format!(
                        "the bridge did not settle {} commits ({error}): their estimates stand",
                        commits.len()
                    ),
                );
                for commit in &commits {
                    self.metrics.commit_failed(commit.rule);
                }
                return;
            }
        };
        for (commit, result) in answered {
            if result.settled {
                self.metrics
                    .commit_settled(commit.rule, commit.item.reserved, commit.item.actual);
            }
        }
    }
}
