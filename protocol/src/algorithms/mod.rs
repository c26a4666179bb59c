//! Rate-limit algorithms as pure functions of `(params, state, now, cost)`.
//!
//! Vocabulary, as users see it in replies and headers:
//!
//! - **limit**: the most a key can ever be allowed at once (GCRA: `burst + 1`; token
//!   bucket: its capacity; windows: the window's limit).
//! - **remaining**: how much more would be allowed right now, after this decision.
//! - **retry_after**: when denied, how long until the same request would be allowed;
//!   `None` when it never can be (its cost is above the limit).
//! - **reset_after**: how long until the key's state carries no information any more
//!   (bucket full again, window over): from then on the key behaves as if never seen.
//! - **TAT** (GCRA): theoretical arrival time, the instant at which the key would be
//!   back to an empty schedule. **Emission interval** `T = period / rate`: the spacing
//!   of requests at exactly the sustained rate. **Tolerance** `τ = T × (burst + 1)`.
//!
//! Nothing here reads a clock, allocates or fails: time enters as `now_us`
//! (microseconds since the Unix epoch) and every decision returns the new state to
//! store, or `None` when nothing must be written (a denial or a peek).
//!
//! ## One home per algorithm
//!
//! Each algorithm lives in its own module, which holds everything weir knows about it:
//! its [`AlgorithmSpec`] (name, parameter table, Lua script name, builder, and what it
//! can do: hold a request, reserve its schedule, settle a cost, which parameter its
//! limit is made of), parameter validation, its state and the state's slot codec, the
//! decision, and its [`Algorithm`] implementation (policy, local share, lease lifetime
//! and cost, the Lua script's arguments, the limits of exact arithmetic in Lua, and its
//! bound, checked). The config, the wire format, the engine, the conformance checker and
//! the bridge ask the spec and the traits, never an algorithm's name; the only list of
//! algorithms is [`AlgorithmKind`] with [`AlgorithmKind::spec`], and the only dispatch is
//! [`Limit::algorithm`] / [`GlobalLimit::algorithm`], both in `kind.rs`.
//! docs/algorithms.md ("Adding an algorithm") lists the files a new one needs, and
//! `core/tests/adding_an_algorithm.rs` keeps that list true.
//!
//! ```
//! use weir_protocol::algorithms::{gcra::Gcra, Limit};
//!
//! // 1 request per second with a burst of 4: five at once, then one a second.
//! let limit = Limit::Gcra(Gcra::new(4, 1, 1_000_000).unwrap());
//! let t0 = 1_700_000_000_000_000;
//! let mut state = None;
//! for _ in 0..5 {
//!     let (decision, next) = limit.decide(state, t0, 1);
//!     assert!(decision.allowed);
//!     state = next;
//! }
//! let (denied, _) = limit.decide(state, t0, 1);
//! assert!(!denied.allowed);
//! assert_eq!(denied.retry_after_ns, Some(1_000_000_000));
//! ```

pub mod fixed_window;
pub mod gcra;
mod saturating;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;
mod window;

/// Nanoseconds in a microsecond (defined with the time types, [`crate::time`]).
pub use crate::time::NS_PER_US;

/// The largest count or duration (µs) a Lua script is given: 2^48 (about 8.9 years in
/// µs). With instants below 2^52 µs (year 2112) every sum the scripts form stays below
/// 2^53, where Lua's doubles are exact. [`Algorithm::check_script_exact`] refuses
/// parameters that would break it, for the config checker and the bridge alike.
pub const MAX_SCRIPT_EXACT: u64 = 1 << 48;

mod admissions;
mod kind;
mod limit;
mod outcome;
mod spec;
mod traits;

pub use admissions::{Admission, Breach};
pub use kind::{AlgorithmKind, GlobalLimit, Limit};
pub use outcome::{
    Ahead, Ask, Decision, Grant, Hold, LeaseCost, Policy, Reservation, SlotState, TakenAhead,
    RESERVOIR_SHARE,
};
use spec::values_of;
pub use spec::{AlgorithmSpec, LimitParameter, ParamError, Parameter, Unit};
use traits::slot_algorithm;
pub use traits::{Algorithm, SlotAlgorithm, SlotCodec};
