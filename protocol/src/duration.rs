//! Durations as the config writes them: a whole number and a unit, `"250us"`, `"500ms"`,
//! `"1s"`, `"1m"`, `"1h"`, `"1d"`.
//!
//! Whole numbers only, so a period means exactly what it says: `"1.5s"` is written
//! `"1500ms"`. The result is in microseconds, the unit of every stored state. Zero is
//! refused (a zero period or window would divide by zero or never reset) and so is
//! anything past [`MAX_DURATION_US`], which keeps every product of a duration and a
//! count far from overflow.
//!
//! ```
//! use weir_protocol::duration::parse_duration;
//!
//! assert_eq!(parse_duration("250ms"), Ok(250_000));
//! assert_eq!(parse_duration("1m"), Ok(60_000_000));
//! assert!(parse_duration("1.5s").is_err());
//! ```

use crate::field_error::quoted;

/// 30 days, in microseconds.
pub const MAX_DURATION_US: u64 = 30 * DAY_US;

const SECOND_US: u64 = 1_000_000;
const DAY_US: u64 = 86_400 * SECOND_US;

/// Unit suffixes and their length in microseconds.
const UNITS: [(&str, u64); 6] = [
    ("us", 1),
    ("ms", 1_000),
    ("s", SECOND_US),
    ("m", 60 * SECOND_US),
    ("h", 3_600 * SECOND_US),
    ("d", DAY_US),
];

/// Parses `text` into microseconds. The error is a complete message quoting `text`.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let format_error = || {
        format!(
            "invalid duration {}: expected a whole number followed by us, ms, s, m, h or d \
             (e.g. \"500ms\")",
            quoted(text)
        )
    };
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(format_error());
    }
    let Some(&(_, unit_us)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(format_error());
    };
    let too_long = || {
        format!(
            "invalid duration {}: at most 30 days (\"30d\") is allowed",
            quoted(text)
        )
    };
    // Only digits are left, so a parse failure is an overflow: far more than 30 days.
    let count: u64 = digits.parse().map_err(|_| too_long())?;
    let us = count.checked_mul(unit_us).ok_or_else(too_long)?;
    if us == 0 {
        return Err(format!(
            "invalid duration {}: must be greater than zero",
            quoted(text)
        ));
    }
    if us > MAX_DURATION_US {
        return Err(too_long());
    }
    Ok(us)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn every_unit() {
        assert_eq!(parse_duration("250us"), Ok(250));
        assert_eq!(parse_duration("500ms"), Ok(500_000));
        assert_eq!(parse_duration("1s"), Ok(1_000_000));
        assert_eq!(parse_duration("2m"), Ok(120_000_000));
        assert_eq!(parse_duration("1h"), Ok(3_600_000_000));
        assert_eq!(parse_duration("30d"), Ok(MAX_DURATION_US));
        assert_eq!(parse_duration("007s"), Ok(7_000_000));
    }

    #[test]
    fn refusals() {
        for bad in [
            "", "10", "1.5s", "-1s", "1x", " 1s", "1s ", "1 s", "1S", "s", "1sec", "１s",
        ] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains("expected a whole number"), "{bad:?}: {err}");
        }
        assert_eq!(
            parse_duration("0s").unwrap_err(),
            "invalid duration \"0s\": must be greater than zero"
        );
        for long in [
            "31d",
            "2592000000001us",
            "99999999999999999999999s",
            "18446744073709551615d",
        ] {
            let err = parse_duration(long).unwrap_err();
            assert!(
                err.ends_with("at most 30 days (\"30d\") is allowed"),
                "{long:?}: {err}"
            );
        }
    }
}
