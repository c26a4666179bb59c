//! `commit.clamp`: a request whose body asks for more output tokens than its key has
//! left is admitted with its max-token fields lowered to what is left, rather than
//! denied. The engine decides how many tokens a rule reserves (at least the prompt and
//! `min_output`, at most the estimate); this module reads the prompt's share of a body
//! and writes the body with the output the reservation leaves.
//!
//! Every max-token field the body sets above that output is lowered to it; a body that
//! sets none gets the rule's `insert` field, so its output is bounded too (an API's own
//! default maximum may be far above the estimate's `default`). The body is written back
//! as JSON (the same values; keys may come out in another order, whitespace goes), so
//! the upstream reads exactly the numbers weir decided on.

use super::{BodyEstimate, RequestBody};
use serde_json::{Map, Value};

/// How a rule with `commit.clamp` rewrites a request body.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BodyClamp {
    /// The max-token fields the estimate reads (`cost.body.fields`), each one path.
    fields: Vec<Vec<String>>,
    /// The field set when the body has none of `fields`.
    insert: Vec<String>,
    bytes_per_prompt_token: u64,
}

impl BodyClamp {
    /// The clamp of a rule whose cost is `estimate`, adding `insert` (a dotted path) to a
    /// body without a max-token field. Each field must be a single path: the error names
    /// the one that is a sum.
    pub fn new(estimate: &BodyEstimate, insert: &str) -> Result<BodyClamp, (usize, String)> {
        let mut fields = Vec::with_capacity(estimate.fields.len());
        for (i, field) in estimate.fields.iter().enumerate() {
            match field.single_path() {
                Some(path) => fields.push(path.to_vec()),
                None => {
                    return Err((
                        i,
                        "is a sum of paths; a clamp writes one number into each field".into(),
                    ))
                }
            }
        }
        let insert: Vec<String> = insert.split('.').map(str::to_string).collect();
        Ok(BodyClamp {
            fields,
            insert,
            bytes_per_prompt_token: estimate.bytes_per_prompt_token,
        })
    }

    /// The prompt's estimated tokens (the body's size over `bytes_per_prompt_token`, as
    /// the estimate counts it) when `body` can be clamped: read whole, a JSON object, and
    /// with room for the `insert` field (its parents absent or objects). `None`: the
    /// request is decided at its estimate, as without a clamp.
    pub fn prompt(&self, body: RequestBody<'_>) -> Option<u64> {
        let RequestBody::Complete(bytes) = body else {
            return None;
        };
        let value = serde_json::from_slice::<Value>(bytes).ok()?;
        let object = value.as_object()?;
        let (_, parents) = self.insert.split_last()?;
        let mut at = object;
        for segment in parents {
            match at.get(segment.as_str()) {
                None | Some(Value::Null) => break,
                Some(Value::Object(inner)) => at = inner,
                Some(_) => return None,
            }
        }
        Some(match self.bytes_per_prompt_token {
            0 => 0,
            per => (bytes.len() as u64).div_ceil(per),
        })
    }

    /// `body` with its output bounded by `output` tokens: every field above it (or not a
    /// whole number) lowered to it, and the `insert` field set when the body has none of
    /// the fields. `None` when nothing changes, or the body cannot be clamped (see
    /// [`BodyClamp::prompt`]).
    pub fn apply(&self, body: &[u8], output: u64) -> Option<Vec<u8>> {
        let mut value = serde_json::from_slice::<Value>(body).ok()?;
        let object = value.as_object_mut()?;
        let mut changed = false;
        let mut present = false;
        for path in &self.fields {
            let Some(found) = find_mut(object, path) else {
                continue;
            };
            present = true;
            let fits = super::whole_number(found).is_some_and(|n| n <= output);
            if !fits {
                *found = Value::from(output);
                changed = true;
            }
        }
        if !present {
            let (last, parents) = self.insert.split_last()?;
            let mut at = &mut *object;
            for segment in parents {
                let slot = at
                    .entry(segment.as_str())
                    .or_insert_with(|| Value::Object(Map::new()));
                if slot.is_null() {
                    *slot = Value::Object(Map::new());
                }
                at = slot.as_object_mut()?;
            }
            at.insert(last.clone(), Value::from(output));
            changed = true;
        }
        if !changed {
            return None;
        }
        serde_json::to_vec(&value).ok()
    }
}

/// The value at `path` in `object`, unless it is missing or `null` (a backend reads
/// that as "not set", as the estimate does).
fn find_mut<'v>(object: &'v mut Map<String, Value>, path: &[String]) -> Option<&'v mut Value> {
    let (first, rest) = path.split_first()?;
    let found = rest
        .iter()
        .try_fold(object.get_mut(first.as_str())?, |v, segment| {
            v.get_mut(segment.as_str())
        })?;
    (!found.is_null()).then_some(found)
}
