//! What a request settles when its response ends: the costs of rules with a `commit`
//! (read from the response's headers or body) and the places of concurrency rules, with
//! the latency adaptive rules sample.

use super::host::Host;
use super::plugin::Plugin;
use crate::adaptive::Response;
use crate::buffers::Buffered;
use crate::engine::PendingCommit;
use crate::rules::CommitSource;
use crate::usage::settlement::ResponseSeen;
use crate::usage::{Unread, UsageScanner};

/// A rule's cost to settle with the response, and the usage read so far from its body.
struct Settling {
    commit: PendingCommit,
    scanner: Option<UsageScanner>,
}

/// What an admitted request's rules settle when its response ends.
#[derive(Default)]
pub struct Settlements {
    /// The request's context, for the log.
    context_id: u32,
    open: Vec<Settling>,
    /// The response's status, once its headers came.
    status: Option<u16>,
    /// The upstream sent it (not a reply Envoy made), once its headers came.
    from_upstream: bool,
    /// What the response body read for a usage keeps of the VM's `max_buffered_bytes`.
    body_kept: Buffered,
}

impl Settlements {
    /// What `commits` settle when the response of the request `context_id` ends.
    pub fn new(context_id: u32, commits: &[PendingCommit]) -> Self {
        Settlements {
            context_id,
            open: commits
                .iter()
                .map(|commit| Settling {
                    commit: commit.clone(),
                    scanner: None,
                })
                .collect(),
            status: None,
            from_upstream: false,
            body_kept: Buffered::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    /// The response's headers: an upstream error and a header source settle now, a
    /// body source starts reading.
    pub fn on_response_headers<H: Host>(&mut self, host: &H, plugin: &Plugin, end_of_stream: bool) {
        if !self.open.is_empty() {
            self.read_usage_headers(host, plugin, end_of_stream);
        }
    }

    /// A piece of the response body: rules reading their cost from it read it.
    pub fn on_response_body<H: Host>(
        &mut self,
        host: &H,
        plugin: &Plugin,
        size: usize,
        end_of_stream: bool,
    ) {
        if self.open.iter().any(|s| s.scanner.is_some()) {
            let chunk = host.response_body(size).ok().flatten().unwrap_or_default();
            self.keep_within_budget(plugin, chunk.len());
            for s in &mut self.open {
                if let Some(scanner) = s.scanner.as_mut() {
                    scanner.feed(&chunk);
                }
            }
            self.keep_within_budget(plugin, 0);
            if end_of_stream {
                self.settle_all(host, plugin, true);
            }
        }
    }

    /// Trailers end a response: what its body said settles now.
    pub fn on_response_trailers<H: Host>(&mut self, host: &H, plugin: &Plugin) {
        self.settle_all(host, plugin, true);
    }

    fn read_usage_headers<H: Host>(&mut self, host: &H, plugin: &Plugin, end_of_stream: bool) {
        let status = host
            .response_header(":status")
            .ok()
            .flatten()
            .and_then(|s| std::str::from_utf8(&s).ok()?.parse::<u16>().ok())
            .unwrap_or(0);
        let status = (status != 0).then_some(status);
        self.status = status;
        // Only the upstream's own 5xx settles at `on_error`: a client can make Envoy
        // answer for it (a route timeout's 504) while the upstream goes on generating.
        let from_upstream = from_upstream(host);
        self.from_upstream = from_upstream == Some(true);
        let content_type = host.response_header("content-type").ok().flatten();
        let content_encoding = host.response_header("content-encoding").ok().flatten();
        let mut now_known = Vec::new();
        // Adaptive rules sample the latency of what measures the service: the core
        // decides which responses do (`crate::adaptive::measures_service`).
        let mut seen = None;
        for s in &self.open {
            if plugin.engine.is_adaptive(s.commit.rule) {
                let Some((now, response)) = seen.or_else(|| {
                    let response = Response {
                        status: status.unwrap_or(0),
                        from_upstream,
                    };
                    Some((host.now().ok()?, response))
                }) else {
                    continue;
                };
                seen = Some((now, response));
                let latency = now.saturating_sub(s.commit.counted_at);
                plugin.observe_response(&s.commit, response, latency);
            }
        }
        for s in &mut self.open {
            let Some(commit) = plugin
                .engine
                .config
                .rule(s.commit.rule)
                .and_then(|r| r.commit.as_ref())
            else {
                continue;
            };
            let usage = match &commit.source {
                // An error status settles now whatever its body says: at `on_error` when
                // the upstream sent it, else at the estimate.
                _ if status.is_some_and(|s| s >= 500) => Err(Unread::NoUsage),
                CommitSource::Header(name) => host
                    .response_header(name)
                    .ok()
                    .flatten()
                    .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse::<u64>().ok())
                    .ok_or(Unread::NoUsage),
                CommitSource::Body { fields, max_bytes } => {
                    s.scanner = Some(UsageScanner::for_response(
                        fields,
                        *max_bytes,
                        content_type.as_deref(),
                        content_encoding.as_deref(),
                    ));
                    continue;
                }
            };
            let seen = ResponseSeen {
                status,
                from_upstream: self.from_upstream,
                ended: true,
                usage,
            };
            now_known.push((s.commit.clone(), seen));
        }
        self.open
            .retain(|s| !now_known.iter().any(|(c, _)| c.rule == s.commit.rule));
        for (commit, seen) in now_known {
            plugin.settle(host, self.context_id, &commit, Some(&seen));
        }
        if end_of_stream {
            self.settle_all(host, plugin, true);
        }
    }

    /// Takes room in the VM's `max_buffered_bytes` for what the scanners keep and
    /// `incoming` more bytes each; without room, they stop reading (each request keeps
    /// its estimate, as for a body over `max_bytes`) and give their bytes back.
    fn keep_within_budget(&mut self, plugin: &Plugin, incoming: usize) {
        let scanners = || self.open.iter().filter_map(|s| s.scanner.as_ref());
        let wanted = scanners().fold(0usize, |sum, scanner| {
            sum.saturating_add(scanner.buffered().saturating_add(incoming))
        });
        if plugin.keep(&mut self.body_kept, wanted) {
            return;
        }
        plugin.metrics.buffer_full();
        for s in &mut self.open {
            if let Some(scanner) = s.scanner.as_mut() {
                scanner.give_up();
            }
        }
        plugin.give_back(&mut self.body_kept);
    }

    /// Settles every cost still open with what its body said: the response `ended`, or
    /// was cut (the client went away, a reset) before its end.
    pub fn settle_all<H: Host>(&mut self, host: &H, plugin: &Plugin, ended: bool) {
        plugin.give_back(&mut self.body_kept);
        for mut s in std::mem::take(&mut self.open) {
            let seen = ResponseSeen {
                status: self.status,
                from_upstream: self.from_upstream,
                ended,
                usage: s
                    .scanner
                    .take()
                    .map_or(Err(Unread::NoUsage), UsageScanner::finish),
            };
            plugin.settle(host, self.context_id, &s.commit, Some(&seen));
        }
    }
}

/// Whether the upstream sent the response (Envoy's `response.code_details` is
/// `via_upstream`) or a local reply did; `None` when the host does not say.
fn from_upstream<H: Host>(host: &H) -> Option<bool> {
    let path = ["response".to_string(), "code_details".to_string()];
    let details = host.property(&path).ok().flatten()?;
    Some(details == b"via_upstream")
}
