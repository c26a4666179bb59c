//! Replay: a candidate config run over traffic an Envoy recorded, to see what it would
//! have limited before it is rolled out.
//!
//! **The record.** One JSON object per line, written by Envoy's file access logger with
//! the `json_format` that [`log_format`] builds from a config: the request's start
//! (`start_us`, µs since the epoch) and duration (`duration_us`, for concurrency
//! rules), its status, whether a delaying rule held it (`delay_ms`), weir's decisions
//! (the filter state `wasm.weir.decisions`, `rule:outcome:source:cost:decided_at_us`,
//! written when the plugin has `"response": {"filter_state": "all"}`), and every fact
//! the config's rules read: request headers under `headers` (pseudo-headers included),
//! Envoy attributes under `attributes` by dotted path. Values are the raw request
//! values, or their keyed hashes in a log rewritten by `weir-check log-hash`
//! ([`crate::log_hash`]): a candidate that reads a hashed fact in a way the hash does
//! not keep is refused.
//!
//! **The replay.** Every line in time order as a request on a scripted Envoy of one
//! worker (`weir_scripted`), which runs the filter's own request lifecycle: the
//! request's headers and the attributes its rules read, the filter's tick at the period
//! it asks for, its response (the logged status; 200 when weir answered it or none is
//! logged) and the end of its stream at [`Record::end_us`]; its decisions are read back
//! from the filter state the filter writes (`response.filter_state` set to `all`). So a
//! commit rule charges a logged upstream 5xx its `on_error`, and anything else its
//! estimate: the log holds no response body.
//! Several Envoys' logs are
//! replayed as one stream ([`Log::merge`]): ordered by time, equal times by log, then
//! line. A request's instant is the
//! one weir decided at when it logged a decision (the first), otherwise its start; so a
//! local rule replayed with the config that served the traffic decides as it did, to
//! the microsecond. An Envoy with several workers gave each its own reservoirs, and
//! its workers' requests of one key may commit in another order than their clocks say:
//! the replay is one worker's view (measured against two workers in
//! tests/tests/replay.rs, `two_workers_replayed_as_one`).
//!
//! ```
//! use weir_core::key::Seed;
//! use weir_check::replay::{parse_log, replay, RecordId, Replayed};
//!
//! // One request an hour per user; two requests of user `a`, one of `b`.
//! let candidate = br#"{"rules":[{"name":"per-user","key":[{"header":"x-user"}],
//!     "limit":{"algorithm":"fixed_window","limit":1,"window":"1h"}}]}"#;
//! let log = parse_log(concat!(
//!     r#"{"start_us":"1000000","headers":{"x-user":"a"}}"#, "\n",
//!     r#"{"start_us":"1000100","headers":{"x-user":"a"}}"#, "\n",
//!     r#"{"start_us":"1000200","headers":{"x-user":"b"}}"#, "\n",
//! ));
//! let report = replay(candidate, &log, &Seed([0; 16])).unwrap();
//! let rule = &report.rules[0];
//! assert_eq!((rule.matched, rule.allowed, rule.limited), (3, 2, 1));
//! assert_eq!(rule.top_keys, [("=a".to_string(), 1)]);
//! let second = RecordId::new(0, 2);
//! assert_eq!(report.decisions[&second], [("per-user".to_string(), Replayed::Limited)]);
//! ```
//!
//! **Global rules** are replayed as one central limiter, which is what a fleet's
//! leases converge to: the rule becomes local with the configured limit, without
//! reservoirs (every request decides in the one store), listed in
//! [`Report::central`]. That predicts what the quota allows across the traffic the log
//! holds: replay the logs of every Envoy together ([`Log::merge`]) for the fleet's.
//! With exact calls it predicted every served decision of two Envoys in
//! tests/tests/replay.rs; it cannot predict what leases, reservations and cached
//! denials decide ahead of Redis, a GCRA rule with leases (its burst runs reduced in
//! Redis), or what the bridge's failure mode decided while it was down
//! (docs/operations.md gives the figures measured). A `sliding_log` rule (Redis only)
//! is not replayed.
//!
//! **Concurrency rules** with a fixed `max_in_flight` hold a place from the instant a
//! request was decided until its stream ends, at [`Record::end_us`] (its start +
//! `duration_us`).
//!
//! **Delaying rules** (`on_limit.delay`) hold a request in the filter (in the worker's
//! queue of the rule, at most `queue`), released by its tick once due; the report counts
//! the requests delayed and their waits. A request the served Envoy held
//! (`delay_ms` logged) is replayed from its start, not its decision (logged at its
//! release): by some µs, close to a slot, it can come out the other way.
//!
//! **Not replayed (yet):** adaptive concurrency rules and `sliding_log` global rules. They are left out of the candidate (listed in
//! [`Report::not_replayed`]) and the other rules are replayed as if they had allowed
//! every request.
//!
//! A line that is not a record is counted and reported with its number, never fatal.

mod log;
mod report;
mod run;

pub use log::*;
pub use report::*;
pub use run::*;
