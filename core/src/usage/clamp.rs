//! `commit.clamp`: a request whose body asks for more output tokens than its key has
//! left is admitted with its max-token fields lowered to what is left, rather than
//! denied. The engine decides how many tokens a rule reserves (at least the prompt and
//! `min_output`, at most the estimate); this module reads the prompt's share of a body
//! and writes the body with the output the reservation leaves.
//!
//! Every max-token field the body sets above that output (or to something that is not a
//! whole number) is lowered to it; a body that sets none gets the rule's `insert` field,
//! so its output is bounded too (an API's own default maximum may be far above the
//! estimate's `default`).
//!
//! Bodies are read as the estimate reads them ([`super::json`]), and every parser must
//! read the bound written, whichever duplicate key it keeps: so when a body is rewritten,
//! each field it sets is left with one occurrence in each object that holds it (the
//! largest of its values, lowered to the output), written into every duplicate of its
//! parent objects (a `null` parent becomes an object). A body that sets a field through a
//! parent that is neither an object nor `null` (or, when it sets none, whose `insert`
//! field would go through one) cannot be clamped: it is decided at its estimate.
//!
//! The new values are spliced into the body's text, so everything else a backend reads
//! stays as it was: key order, whitespace, `NaN` in `temperature`, lone surrogates in a
//! prompt. The result is UTF-8 without a BOM (a UTF-16 or UTF-32 body is transcoded),
//! which `json.loads(bytes)` reads as it read the original.

use super::json::{self, Found, Kind, ObjectSpan};
use super::{BodyEstimate, Reading, RequestBody, TermValue};
use std::ops::Range;

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
    /// body without a max-token field. Each field must be one plain path: the error
    /// names the one that is not, and why.
    pub fn new(estimate: &BodyEstimate, insert: &str) -> Result<BodyClamp, (usize, String)> {
        let mut fields = Vec::with_capacity(estimate.fields.len());
        for (i, field) in estimate.fields.iter().enumerate() {
            match field.plain_path() {
                Ok(path) => fields.push(path.to_vec()),
                Err(why) => {
                    return Err((
                        i,
                        format!("{why}; a clamp writes one number into each field"),
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
    /// with room for what a clamp writes (see the module docs). `None`: the request is
    /// decided at its estimate, as without a clamp.
    pub fn prompt(&self, body: RequestBody<'_>) -> Option<u64> {
        let RequestBody::Complete(bytes) = body else {
            return None;
        };
        let text = json::decode(bytes).ok()?;
        self.plan(text.as_bytes())?;
        Some(match self.bytes_per_prompt_token {
            0 => 0,
            per => (bytes.len() as u64).div_ceil(per),
        })
    }

    /// `body` with its output bounded by `output` tokens: every field above it (or not a
    /// whole number, or hidden from some readers by a duplicate key) set to it, the
    /// `insert` field set when the body has none of the fields, and duplicates removed.
    /// `None` when nothing changes (every field the body sets fits, in every occurrence),
    /// or the body cannot be clamped (see [`BodyClamp::prompt`]).
    pub fn apply(&self, body: &[u8], output: u64) -> Option<Vec<u8>> {
        let text = json::decode(body).ok()?;
        let edits = self.plan(text.as_bytes())?.edits(output)?;
        Some(splice(text.as_bytes(), edits))
    }

    /// What `text` holds along the fields' paths and the insert path; `None` when it
    /// cannot be clamped.
    fn plan(&self, text: &[u8]) -> Option<Plan<'_>> {
        let mut paths: Vec<&[String]> = self.fields.iter().map(Vec::as_slice).collect();
        paths.push(&self.insert);
        let mut found: Vec<Vec<Found>> = vec![Vec::new(); paths.len()];
        let root = json::scan(text, &paths, |hit| {
            if let Some(list) = found.get_mut(hit.path) {
                list.push(hit.found);
            }
        })
        .ok()?;
        if root != Kind::Object {
            return None;
        }
        let insert = found.pop()?;
        let fields: Vec<FieldFound> = self
            .fields
            .iter()
            .zip(found)
            .map(|(path, found)| FieldFound::new(path, found))
            .collect();
        let present = fields.iter().any(|f| f.present());
        let insert = (!present).then(|| FieldFound::new(&self.insert, insert));
        let writes = fields.iter().filter(|f| f.present()).chain(insert.as_ref());
        for field in writes {
            if field.blocked() {
                return None;
            }
        }
        Some(Plan { fields, insert })
    }
}

/// What a body holds along one path.
struct FieldFound<'p> {
    path: &'p [String],
    found: Vec<Found>,
    reading: Reading,
}

impl<'p> FieldFound<'p> {
    fn new(path: &'p [String], found: Vec<Found>) -> FieldFound<'p> {
        let reading = found.iter().fold(Reading::default(), |mut r, f| {
            r.add(f);
            r
        });
        FieldFound {
            path,
            found,
            reading,
        }
    }

    /// The body sets the field: some reader finds a value other than `null`.
    fn present(&self) -> bool {
        self.reading.bound() != TermValue::Unset
    }

    /// A parent on the way is neither an object nor `null`: nothing can be written there.
    fn blocked(&self) -> bool {
        self.found
            .iter()
            .any(|f| matches!(f, Found::NotObject { kind, .. } if *kind != Kind::Null))
    }

    /// Values of the field beyond one.
    fn duplicated(&self) -> bool {
        self.found
            .iter()
            .filter(|f| matches!(f, Found::Value { .. }))
            .count()
            > 1
    }

    /// The edits that make every reader find `value` at the path, in one occurrence per
    /// object. `None` when a parent is in the way.
    fn set(&self, value: u64, edits: &mut Vec<Edit>) -> Option<()> {
        let mut objects: Vec<usize> = Vec::new();
        for found in &self.found {
            match found {
                Found::Value {
                    span,
                    member,
                    object,
                    ..
                } => {
                    if objects.contains(object) {
                        // A later duplicate in an object whose first occurrence is set.
                        edits.push(Edit::Replace {
                            range: member.clone(),
                            with: String::new(),
                        });
                    } else {
                        objects.push(*object);
                        edits.push(Edit::Replace {
                            range: span.clone(),
                            with: value.to_string(),
                        });
                    }
                }
                Found::Missing { depth, object } => {
                    let (key, rest) = self.path.get(*depth..)?.split_first()?;
                    edits.push(Edit::Add {
                        object: *object,
                        member: format!("{}:{}", quoted(key)?, nested(rest, value)?),
                    });
                }
                Found::NotObject {
                    depth,
                    kind: Kind::Null,
                    span,
                } => edits.push(Edit::Replace {
                    range: span.clone(),
                    with: nested(self.path.get(*depth..)?, value)?,
                }),
                Found::NotObject { .. } => return None,
            }
        }
        Some(())
    }
}

/// A body that can be clamped, read along the clamp's paths.
struct Plan<'p> {
    fields: Vec<FieldFound<'p>>,
    /// The insert path, when the body sets none of the fields.
    insert: Option<FieldFound<'p>>,
}

impl Plan<'_> {
    /// The edits that bound the body's output by `output`; `None` when it already is.
    fn edits(&self, output: u64) -> Option<Vec<Edit>> {
        let mut sets: Vec<(&FieldFound<'_>, u64)> = Vec::new();
        let mut changed = self.insert.is_some();
        for field in &self.fields {
            match field.reading.bound() {
                TermValue::Count(n) if n <= output => {
                    // Fits: left alone, unless duplicates must go (when anything changes).
                    if field.duplicated() {
                        sets.push((field, n));
                    }
                }
                TermValue::Unset | TermValue::Invalid => {}
                TermValue::Count(_) => {
                    changed = true;
                    sets.push((field, output));
                }
            }
        }
        if !changed {
            return None;
        }
        sets.extend(self.insert.as_ref().map(|insert| (insert, output)));
        let mut edits = Vec::new();
        for (field, value) in sets {
            field.set(value, &mut edits)?;
        }
        Some(edits)
    }
}

/// A change to a body's text.
#[derive(Debug)]
enum Edit {
    /// These bytes become `with` (nothing: they go).
    Replace { range: Range<usize>, with: String },
    /// A member (`"key":value`) added at the end of an object.
    Add { object: ObjectSpan, member: String },
}

impl Edit {
    fn start(&self) -> usize {
        match self {
            Edit::Replace { range, .. } => range.start,
            Edit::Add { object, .. } => object.close,
        }
    }
}

/// `text` with `edits` made. An edit inside bytes an earlier edit replaced is dropped:
/// the value it would change is gone (two configured paths, one inside the other).
fn splice(text: &[u8], mut edits: Vec<Edit>) -> Vec<u8> {
    edits.sort_by_key(|edit| (edit.start(), matches!(edit, Edit::Add { .. })));
    let mut out = Vec::with_capacity(text.len() + 64);
    let mut done = 0;
    let mut added_to: Option<usize> = None;
    for edit in edits {
        if edit.start() < done {
            continue;
        }
        out.extend_from_slice(text.get(done..edit.start()).unwrap_or_default());
        match edit {
            Edit::Replace { range, with } => {
                out.extend_from_slice(with.as_bytes());
                done = range.end;
            }
            Edit::Add { object, member } => {
                if !object.empty || added_to == Some(object.close) {
                    out.push(b',');
                }
                out.extend_from_slice(member.as_bytes());
                added_to = Some(object.close);
                done = object.close;
            }
        }
    }
    out.extend_from_slice(text.get(done..).unwrap_or_default());
    out
}

/// A key as a JSON string.
fn quoted(key: &str) -> Option<String> {
    serde_json::to_string(key).ok()
}

/// `value` inside objects keyed by `path`: `{"a":{"b":value}}`.
fn nested(path: &[String], value: u64) -> Option<String> {
    let mut text = value.to_string();
    for key in path.iter().rev() {
        text = format!("{{{}:{text}}}", quoted(key)?);
    }
    Some(text)
}
