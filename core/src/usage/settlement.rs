//! What a request with a `commit` costs once its response is over: the one decision
//! between the estimate reserved at admission and what the response says.
//!
//! The rule: **a request costs less than its estimate only when its response reported a
//! usage, or when the upstream itself answered an error status** (then the rule's
//! `on_error`). Everything else that ends a response — a success without a readable
//! usage, a body over `max_bytes`, a compressed body, a client that hangs up before the
//! usage came, a reply Envoy made itself — is something a client can choose, so it keeps
//! the reservation: the estimate stands.
//!
//! Envoy's own replies are not the upstream's: a client causes a 504 with a generation
//! longer than the route's timeout, or with `x-envoy-upstream-rq-timeout-ms` where
//! Envoy honours it, while the upstream goes on generating. Envoy's
//! `response.code_details` says which a response is (`via_upstream` for the upstream's).
//!
//! | the response | cost | [`SettleReason`] |
//! |---|---|---|
//! | the upstream's own status 500–599 | `on_error` | `UpstreamError` |
//! | a usage was read (any other status, cut or not) | the usage | `Usage` |
//! | `content-encoding` other than `identity` | the estimate | `Compressed` |
//! | cut before it ended (client gone, reset), no usage | the estimate | `Aborted` |
//! | a reply Envoy made (its 504, 503, any status), no usage | the estimate | `LocalReply` |
//! | a body or event over `max_bytes`, no usage | the estimate | `TooLarge` |
//! | no usage in it (1xx–4xx, or no status) | the estimate | `NoUsage` |
//! | never sent upstream (another rule denied it) | 0 | `NotForwarded` |
//!
//! A 4xx is the client's own doing (a malformed request, a bad key, a context too long),
//! so it is not an upstream error: it costs its usage if it reports one, else its
//! estimate.
//!
//! ```
//! use weir_core::usage::settlement::{ResponseSeen, SettleReason, Settlement};
//! use weir_core::usage::Unread;
//!
//! // An OpenAI stream without `stream_options.include_usage`: no usage, the estimate.
//! let seen = ResponseSeen {
//!     status: Some(200),
//!     from_upstream: true,
//!     ended: true,
//!     usage: Err(Unread::NoUsage),
//! };
//! let settled = Settlement::of(8_000, 0, &seen);
//! assert_eq!((settled.cost, settled.reason), (8_000, SettleReason::NoUsage));
//!
//! // The same with its usage event: what it says.
//! let seen = ResponseSeen { usage: Ok(1_200), ..seen };
//! assert_eq!(Settlement::of(8_000, 0, &seen).cost, 1_200);
//! ```

use super::Unread;

/// Why a cost settled as it did; each counted in a stat of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SettleReason {
    /// The response reported a usage: the cost is that usage.
    Usage,
    /// The upstream itself answered 5xx: the rule's `on_error`.
    UpstreamError,
    /// A response without a usage that could be read: the estimate stands.
    NoUsage,
    /// The body, or the events read, went over `max_bytes`: the estimate stands.
    TooLarge,
    /// The body was compressed: the estimate stands.
    Compressed,
    /// The response was cut (the client left, a reset) before a usage came: the
    /// estimate stands.
    Aborted,
    /// Envoy answered the request itself (a route timeout's 504, a 503 for a reset
    /// upstream, another filter's reply), with no usage: the estimate stands.
    LocalReply,
    /// The request never reached the upstream (a later rule denied it): nothing.
    NotForwarded,
}

impl SettleReason {
    /// Every reason, in the order of the table above.
    pub const ALL: [SettleReason; 8] = [
        SettleReason::UpstreamError,
        SettleReason::Usage,
        SettleReason::Compressed,
        SettleReason::Aborted,
        SettleReason::LocalReply,
        SettleReason::TooLarge,
        SettleReason::NoUsage,
        SettleReason::NotForwarded,
    ];

    /// The rule's stat counting settlements of this reason (`commit_<name>`).
    pub fn stat_name(self) -> &'static str {
        match self {
            SettleReason::Usage => "commit_usage_read",
            SettleReason::UpstreamError => "commit_on_error",
            SettleReason::NoUsage => "commit_no_usage",
            SettleReason::TooLarge => "commit_over_max_bytes",
            SettleReason::Compressed => "commit_compressed",
            SettleReason::Aborted => "commit_aborted",
            SettleReason::LocalReply => "commit_local_reply",
            SettleReason::NotForwarded => "commit_not_forwarded",
        }
    }
}

/// What the filter saw of a response, for one rule's commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseSeen {
    /// The response's status; `None` when its headers never came.
    pub status: Option<u16>,
    /// The upstream sent the response (Envoy's `response.code_details` is
    /// `via_upstream`); false for a reply Envoy made itself, or when the host did not
    /// say.
    pub from_upstream: bool,
    /// The response ended (its last byte, or its trailers); false when it was cut: the
    /// client went away, or the stream was reset.
    pub ended: bool,
    /// The usage read (from the body, or a response header), or why there is none.
    pub usage: Result<u64, Unread>,
}

/// The cost a request settles at, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    pub cost: u64,
    pub reason: SettleReason,
}

impl Settlement {
    /// The settlement of a request admitted with `reserved` units, by a rule whose
    /// `on_error` is `on_error`, whose response went as `seen` says.
    pub fn of(reserved: u64, on_error: u64, seen: &ResponseSeen) -> Settlement {
        let reason = match (seen.status, seen.usage) {
            (Some(500..=599), _) if seen.from_upstream => {
                return Settlement {
                    cost: on_error,
                    reason: SettleReason::UpstreamError,
                }
            }
            (_, Ok(usage)) => {
                return Settlement {
                    cost: usage,
                    reason: SettleReason::Usage,
                }
            }
            (_, Err(Unread::Compressed)) => SettleReason::Compressed,
            _ if !seen.ended => SettleReason::Aborted,
            (Some(_), _) if !seen.from_upstream => SettleReason::LocalReply,
            (_, Err(Unread::TooLarge)) => SettleReason::TooLarge,
            (_, Err(Unread::NoUsage)) => SettleReason::NoUsage,
        };
        Settlement {
            cost: reserved,
            reason,
        }
    }

    /// A request that never reached the upstream: it cost nothing.
    pub fn not_forwarded() -> Settlement {
        Settlement {
            cost: 0,
            reason: SettleReason::NotForwarded,
        }
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    fn seen(status: Option<u16>, ended: bool, usage: Result<u64, Unread>) -> ResponseSeen {
        ResponseSeen {
            status,
            from_upstream: true,
            ended,
            usage,
        }
    }

    fn settle(status: Option<u16>, ended: bool, usage: Result<u64, Unread>) -> (u64, SettleReason) {
        let s = Settlement::of(500, 7, &seen(status, ended, usage));
        (s.cost, s.reason)
    }

    #[test]
    fn a_success_without_a_usage_keeps_its_estimate() {
        use SettleReason::*;
        for status in [Some(200), Some(204), Some(302), Some(101), None] {
            assert_eq!(settle(status, true, Err(Unread::NoUsage)), (500, NoUsage));
            assert_eq!(settle(status, true, Err(Unread::TooLarge)), (500, TooLarge));
            assert_eq!(
                settle(status, true, Err(Unread::Compressed)),
                (500, Compressed)
            );
            assert_eq!(settle(status, false, Err(Unread::NoUsage)), (500, Aborted));
            assert_eq!(settle(status, false, Err(Unread::TooLarge)), (500, Aborted));
            assert_eq!(
                settle(status, false, Err(Unread::Compressed)),
                (500, Compressed)
            );
        }
    }

    #[test]
    fn a_reported_usage_is_the_cost_above_or_below_the_estimate() {
        for status in [Some(200), Some(400), Some(429), None] {
            for ended in [true, false] {
                assert_eq!(settle(status, ended, Ok(120)), (120, SettleReason::Usage));
                assert_eq!(settle(status, ended, Ok(900)), (900, SettleReason::Usage));
            }
        }
    }

    #[test]
    fn only_a_5xx_settles_at_on_error() {
        for status in [500, 502, 503, 504, 599] {
            for usage in [Ok(120), Err(Unread::NoUsage), Err(Unread::Compressed)] {
                for ended in [true, false] {
                    assert_eq!(
                        settle(Some(status), ended, usage),
                        (7, SettleReason::UpstreamError)
                    );
                }
            }
        }
        for status in [400, 401, 404, 413, 429, 499, 600] {
            assert_eq!(
                settle(Some(status), true, Err(Unread::NoUsage)),
                (500, SettleReason::NoUsage),
                "{status}"
            );
        }
    }

    #[test]
    fn a_reply_envoy_made_keeps_the_estimate_whatever_its_status() {
        // A route timeout's 504 while the upstream still generates, a 503 for a reset
        // upstream, another filter's 429: not the upstream's answer.
        for status in [504, 503, 500, 429, 413, 404, 200] {
            for usage in [Err(Unread::NoUsage), Err(Unread::TooLarge)] {
                let seen = ResponseSeen {
                    from_upstream: false,
                    ..seen(Some(status), true, usage)
                };
                let settled = Settlement::of(500, 7, &seen);
                assert_eq!(
                    (settled.cost, settled.reason),
                    (500, SettleReason::LocalReply),
                    "{status}"
                );
            }
        }
        // Cut before it ended: an abort, as for the upstream's.
        let seen = ResponseSeen {
            from_upstream: false,
            ..seen(Some(504), false, Err(Unread::NoUsage))
        };
        assert_eq!(Settlement::of(500, 7, &seen).reason, SettleReason::Aborted);
    }

    #[test]
    fn every_reason_has_its_own_stat() {
        let names: std::collections::HashSet<_> =
            SettleReason::ALL.iter().map(|r| r.stat_name()).collect();
        assert_eq!(names.len(), SettleReason::ALL.len());
        assert_eq!(Settlement::not_forwarded().cost, 0);
    }
}
