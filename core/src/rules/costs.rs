//! What one request costs under a rule, and what a clamping rule may reserve for it.

use super::{Clamp, FactId, FactSource, Facts, Rule};

/// What one request costs under a rule: never 0 (a request of cost 0 would only peek at
/// its key and always pass), never more than the limit can admit at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cost {
    Fixed(u64),
    /// Read from the request as a decimal integer (spaces around it allowed): a header,
    /// or the estimate of its body ([`super::Fact::RequestBodyEstimate`]). Absent, empty,
    /// negative or not a whole number → `default`; below `min` → `min`; above `max` →
    /// `max`. `1 ≤ min ≤ default ≤ max`.
    FromRequest {
        fact: FactId,
        default: u64,
        min: u64,
        max: u64,
    },
}

impl Rule {
    /// The clamp of an enforcing rule (a shadow rule never changes a request).
    pub fn clamp(&self) -> Option<&Clamp> {
        self.commit
            .as_ref()
            .and_then(|c| c.clamp.as_ref())
            .filter(|_| !self.shadow)
    }

    /// What a clamping rule may reserve for this request whose estimate is `cost`: at
    /// least its prompt's share and `min_output` (no less than the cost's `min`), at most
    /// the estimate — or that least when it is more: the output is what a clamp lowers,
    /// never the prompt. With the prompt's share. `(cost, cost, None)` when the rule does
    /// not clamp or the body cannot be clamped.
    pub fn clamp_range<S: FactSource>(
        &self,
        facts: &mut Facts<'_, S>,
        cost: u64,
    ) -> (u64, u64, Option<u64>) {
        let Some(clamp) = self.clamp() else {
            return (cost, cost, None);
        };
        let Some(prompt) = facts.get(clamp.prompt).and_then(parse_decimal) else {
            return (cost, cost, None);
        };
        let min = match self.cost {
            Cost::Fixed(fixed) => fixed,
            Cost::FromRequest { min, .. } => min,
        };
        let least = prompt.saturating_add(clamp.min_output).max(min);
        (least, cost.max(least), Some(prompt))
    }

    /// The cost of this request under this rule.
    pub fn cost<S: FactSource>(&self, facts: &mut Facts<'_, S>) -> u64 {
        match self.cost {
            Cost::Fixed(cost) => cost,
            Cost::FromRequest {
                fact,
                default,
                min,
                max,
            } => facts
                .get(fact)
                .and_then(parse_decimal)
                .map_or(default, |cost| cost.clamp(min, max)),
        }
    }
}

/// A plain decimal integer (surrounding spaces allowed), or `None`.
pub fn parse_decimal(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn decimals() {
        assert_eq!(parse_decimal(b" 42 "), Some(42));
        assert_eq!(parse_decimal(b"-1"), None);
        assert_eq!(parse_decimal(b"1e3"), None);
        assert_eq!(parse_decimal(b"99999999999999999999999"), None);
        assert_eq!(parse_decimal(b"\xff"), None);
    }
}
