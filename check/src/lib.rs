//! weir's offline tool, the `weir-check` binary's library: what an operator runs before a
//! config reaches an Envoy, over weir-core's config compiler and engine.
//!
//! - [`log_hash`]: replay logs with their values replaced by a keyed hash
//!   (`weir-check log-hash`).
//! - [`replay`]: a candidate config over traffic an Envoy recorded (`weir-check replay`).
//!
//! `weir-check check-config` and `log-format` need no module here: they are the core's
//! config compiler ([`weir_core::config`]) and [`replay::log_format`].

pub mod log_hash;
pub mod replay;
