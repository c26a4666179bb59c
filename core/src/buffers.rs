//! A VM's budget of bytes buffered for requests in flight.
//!
//! A rule that estimates a cost from the request body keeps the body while the request
//! waits (for the bridge, or held by a delay), and a rule that reads the usage from a
//! JSON response keeps the body until it ends: each up to its `max_bytes` (1 MiB by
//! default, 16 MiB at most). Alone that is bounded per request, not per VM: 10,000
//! requests held with 512 KiB bodies would be 5 GiB in a wasm32 VM that can address 4.
//! So every byte a worker's VM keeps for a request is taken from one [`BufferBudget`]
//! (`max_buffered_bytes`, 64 MiB by default), and what does not fit is not kept:
//!
//! - a request body that does not fit is not read: the rule estimates it as a body over
//!   its `max_bytes`, at the cost's `max` (an upper bound: the client can only lose);
//! - a response body that stops fitting is not read further: the request keeps the
//!   estimate it reserved, as for a body over `max_bytes`.
//!
//! Each request holds its share through a [`Buffered`], which gives back exactly what it
//! took, however the request ends.
//!
//! ```
//! use weir_core::buffers::{BufferBudget, Buffered};
//!
//! let mut budget = BufferBudget::new(1_000);
//! let (mut a, mut b) = (Buffered::default(), Buffered::default());
//! assert!(a.grow_to(&mut budget, 600));
//! assert!(!b.grow_to(&mut budget, 500), "600 + 500 do not fit in 1,000");
//! assert_eq!(b.bytes(), 0, "nothing taken when refused");
//! a.release(&mut budget);
//! assert!(b.grow_to(&mut budget, 500));
//! assert_eq!(budget.used(), 500);
//! ```

/// The budget of one VM when the config does not set `max_buffered_bytes`: 64 MiB.
pub const DEFAULT_MAX_BUFFERED_BYTES: u64 = 64 << 20;
/// The smallest budget the config accepts: 1 MiB, one default body.
pub const MIN_MAX_BUFFERED_BYTES: u64 = 1 << 20;
/// The largest: 1 GiB, a quarter of what a wasm32 VM can address.
pub const MAX_MAX_BUFFERED_BYTES: u64 = 1 << 30;

/// Bytes a VM keeps for its requests in flight, against its budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferBudget {
    max: usize,
    used: usize,
    /// Requests whose bytes did not fit, since the VM started.
    refused: u64,
}

impl BufferBudget {
    pub fn new(max_bytes: u64) -> BufferBudget {
        BufferBudget {
            max: usize::try_from(max_bytes).unwrap_or(usize::MAX),
            used: 0,
            refused: 0,
        }
    }

    /// Bytes kept now.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Times bytes did not fit.
    pub fn refused(&self) -> u64 {
        self.refused
    }

    /// Takes `bytes` more; false (nothing taken) when they do not fit.
    fn take(&mut self, bytes: usize) -> bool {
        match self.used.checked_add(bytes) {
            Some(used) if used <= self.max => {
                self.used = used;
                true
            }
            _ => {
                self.refused += 1;
                false
            }
        }
    }

    fn give_back(&mut self, bytes: usize) {
        self.used = self.used.saturating_sub(bytes);
    }
}

/// What one request keeps of its VM's budget.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Buffered {
    bytes: usize,
}

impl Buffered {
    /// Bytes this request keeps.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Grows what this request keeps to `total` bytes; false (unchanged) when the growth
    /// does not fit in `budget`. A smaller `total` gives the difference back.
    pub fn grow_to(&mut self, budget: &mut BufferBudget, total: usize) -> bool {
        if total <= self.bytes {
            budget.give_back(self.bytes - total);
            self.bytes = total;
            return true;
        }
        if !budget.take(total - self.bytes) {
            return false;
        }
        self.bytes = total;
        true
    }

    /// Gives everything back (the request no longer keeps anything).
    pub fn release(&mut self, budget: &mut BufferBudget) {
        budget.give_back(self.bytes);
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn many_requests_never_keep_more_than_the_budget_and_give_back_what_they_took() {
        let mut budget = BufferBudget::new(10 << 20);
        let mut requests: Vec<Buffered> = (0..10_000).map(|_| Buffered::default()).collect();
        let mut kept = 0;
        for r in &mut requests {
            // 512 KiB each, in chunks of 64 KiB: 20 requests fit whole.
            for chunk in 1..=8 {
                if !r.grow_to(&mut budget, chunk * (64 << 10)) {
                    break;
                }
            }
            kept += usize::from(r.bytes() == 512 << 10);
            assert!(budget.used() <= 10 << 20);
        }
        assert_eq!(kept, 20);
        assert!(budget.refused() >= 9_980);
        let held: usize = requests.iter().map(Buffered::bytes).sum();
        assert_eq!(held, budget.used());
        for r in &mut requests {
            r.release(&mut budget);
            r.release(&mut budget);
        }
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn shrinking_gives_back_the_difference() {
        let mut budget = BufferBudget::new(100);
        let mut r = Buffered::default();
        assert!(r.grow_to(&mut budget, 80));
        assert!(r.grow_to(&mut budget, 30));
        assert_eq!((r.bytes(), budget.used()), (30, 30));
        assert!(!r.grow_to(&mut budget, 101));
        assert_eq!((r.bytes(), budget.used()), (30, 30));
    }
}
