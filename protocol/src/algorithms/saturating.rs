//! The few conversions every algorithm needs, in one place: saturating, so that no
//! parameter or state, however extreme, can overflow or panic.

use super::NS_PER_US;

/// ns from `now_us` until `at_us`, 0 if already past.
pub(crate) fn until_ns(at_us: u64, now_us: u64) -> u64 {
    at_us.saturating_sub(now_us).saturating_mul(NS_PER_US)
}

/// `x`, or `u64::MAX` if it does not fit.
pub(crate) fn sat_u64(x: u128) -> u64 {
    u64::try_from(x).unwrap_or(u64::MAX)
}

/// `at_us + d_us`, saturating.
pub(crate) fn add_us(at_us: u64, d_us: u128) -> u64 {
    sat_u64(u128::from(at_us) + d_us)
}

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use super::*;

    #[test]
    fn conversions_saturate() {
        assert_eq!(until_ns(10, 4), 6_000);
        assert_eq!(until_ns(4, 10), 0);
        assert_eq!(until_ns(u64::MAX, 0), u64::MAX);
        assert_eq!(sat_u64(u128::MAX), u64::MAX);
        assert_eq!(add_us(u64::MAX, 1), u64::MAX);
    }
}
