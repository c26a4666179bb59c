//! Time where it crosses from one module to another: [`Micros`], [`Span`] and [`Nanos`].
//!
//! Inside an algorithm, a time is an integer with its unit in its name (`tat_us`,
//! `retry_after_ns`): states are one small integer, stored as such in shared data and
//! in Redis. Where a time leaves a module — the host's clock into the filter, the
//! filter's clock into the engine, a commit's instant back out, a wait into a header —
//! it is one of these, so a µs cannot be passed where ns are meant, or a span where an
//! instant is: an instant ([`Micros`]) plus a span ([`Span`]) is an instant, an instant
//! less an earlier one is a span, and nothing adds two instants. The conversions between
//! them are here, once, and saturate (no input can overflow). (Arithmetic that must be
//! exact over the whole range — an algorithm's, a lease's schedule — works in u128 or
//! i128 on the integers, in its own module.)
//!
//! ```
//! use weir_protocol::time::{Micros, Nanos, Span};
//!
//! let arrived = Micros(1_700_000_000_000_000);
//! let released = arrived.saturating_add(Span::from_millis(250));
//! assert_eq!(released.saturating_sub(arrived).as_millis(), 250);
//! assert_eq!(Micros::from_clock_nanos(1_700_000_000_000_000_999), arrived);
//! assert_eq!(Span(3).as_nanos(), Nanos(3_000));
//! assert_eq!(Nanos(2_500).as_micros_floor(), Span(2));
//! assert_eq!(Nanos(2_500).as_micros_ceil(), Span(3));
//! ```

/// Nanoseconds in a microsecond.
pub const NS_PER_US: u64 = 1_000;

/// An instant: microseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Micros(pub u64);

/// A span of time, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span(pub u64);

/// A span of time, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nanos(pub u64);

impl Micros {
    pub const ZERO: Micros = Micros(0);

    /// The count, µs since the Unix epoch.
    pub const fn us(self) -> u64 {
        self.0
    }

    /// The host's clock, read in ns since the Unix epoch, as a whole µs (rounded down).
    pub const fn from_clock_nanos(ns: u64) -> Micros {
        Micros(ns / NS_PER_US)
    }

    /// The same instant in ns since the Unix epoch (saturating).
    pub const fn as_epoch_nanos(self) -> u64 {
        self.0.saturating_mul(NS_PER_US)
    }

    /// The instant `span` later.
    pub const fn saturating_add(self, span: Span) -> Micros {
        Micros(self.0.saturating_add(span.0))
    }

    /// The span from `earlier` to this instant (zero when `earlier` is later).
    pub const fn saturating_sub(self, earlier: Micros) -> Span {
        Span(self.0.saturating_sub(earlier.0))
    }
}

impl Span {
    pub const ZERO: Span = Span(0);

    /// The count, µs.
    pub const fn us(self) -> u64 {
        self.0
    }

    pub const fn from_millis(ms: u64) -> Span {
        Span(ms.saturating_mul(1_000))
    }

    /// Whole milliseconds (rounded down).
    pub const fn as_millis(self) -> u64 {
        self.0 / 1_000
    }

    pub const fn as_nanos(self) -> Nanos {
        Nanos(self.0.saturating_mul(NS_PER_US))
    }
}

impl Nanos {
    /// The count, ns.
    pub const fn ns(self) -> u64 {
        self.0
    }

    /// Whole microseconds (rounded down).
    pub const fn as_micros_floor(self) -> Span {
        Span(self.0 / NS_PER_US)
    }

    /// Microseconds rounded up: a wait that must not end early.
    pub const fn as_micros_ceil(self) -> Span {
        Span(self.0.div_ceil(NS_PER_US))
    }
}
