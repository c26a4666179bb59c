//! Issue 32: **no client-chosen body makes a request cheaper than its estimate**, judged
//! differentially against real parsers (CONFORMANCE.md, "judge differentially").
//!
//! Hostile bodies ([`support::hostile_json`]: BOMs, UTF-16 and UTF-32, `NaN`, lone
//! surrogates, duplicate keys and parents, escaped names, odd numbers, deep nesting,
//! huge strings, truncation, invalid UTF-8, empty and non-JSON bodies) are read by weir
//! (`BodyEstimate::estimate`, `BodyClamp::prompt` and `apply`, with the default fields)
//! and by Python 3's `json.loads(bytes)` twice: as it is (a duplicate key keeps its last
//! value, like serde) and with an `object_pairs_hook` that keeps the first (like
//! RapidJSON's `FindMember` and several Go and C++ parsers). One `python3` process reads
//! every body of the run.
//!
//! Judged per body:
//! - **the estimate never falls below a reading**: where either reader reads a bound
//!   that is a whole number, weir's output part is at least it; where either reads one
//!   that is not (a fraction, `NaN`, a string...), or one reads a bound where the other
//!   reads none, weir charges `max`; a body Python refuses costs `max` (an empty body:
//!   `default`);
//! - **and is exact otherwise**: without duplicate keys or nesting past weir's bound,
//!   weir reads exactly the largest bound the readers read (nothing → `default`);
//! - **a clamp bounds every reader**: the body sent upstream (rewritten or not), read by
//!   both readers, is accepted and has every bound at most the output the clamp was
//!   given (at least one of them set), and every other field reads as it did (`NaN` by
//!   its repr, key order included); a rewritten body is UTF-8 without a BOM and holds no
//!   bound twice in one object (but for `null`s: a field no reader finds set is left
//!   alone); a body Python refuses is never clamped.
//!
//! `WEIR_SEARCH_CASES` bodies (default 3,000) from `WEIR_SEARCH_SEED` (default 1).
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;
use support::hostile_json::{hostile_body, HostileBody, Trick};
use support::python_json::{hex, python, reads, Read};
use support::search::env_u64;
use support::{engine, Rng};
use weir_core::usage::clamp::BodyClamp;
use weir_core::usage::{BodyEstimate, RequestBody, UsageField, DEFAULT_MAX_TOKENS_FIELDS};

/// A body for a failure message: escaped, the first 300 bytes.
fn show(bytes: &[u8]) -> String {
    let shown: String = bytes
        .iter()
        .take(300)
        .flat_map(|b| std::ascii::escape_default(*b))
        .map(char::from)
        .collect();
    format!("{} bytes: {shown}", bytes.len())
}

fn clamp_inserting(field: &str) -> BodyClamp {
    let e = engine(&format!(
        r#"{{"rules":[{{"name":"llm","key":[{{"header":"x-user"}}],
            "limit":{{"algorithm":"token_bucket","capacity":1000000,"refill":1,"period":"1h"}},
            "cost":{{"body":{{}},"default":4000,"max":16000}},
            "commit":{{"body":{{}},"clamp":{{"field":"{field}"}}}}}}]}}"#
    ));
    e.config.rules[0].clamp().unwrap().body.clone()
}

/// A clamp's case: the body, the output it was given, what it sent.
struct Clamped {
    body: usize,
    /// Its line to the readers.
    line: usize,
    output: u64,
    rewritten: Option<Vec<u8>>,
}

#[test]
fn hostile_bodies_cost_at_least_what_any_reader_reads_and_clamps_bound_every_reader() {
    let cases = env_u64("WEIR_SEARCH_CASES", 3_000);
    let seed = env_u64("WEIR_SEARCH_SEED", 1);
    let paths = DEFAULT_MAX_TOKENS_FIELDS;
    let estimate = BodyEstimate {
        fields: paths
            .iter()
            .map(|f| UsageField::parse(f).unwrap())
            .collect(),
        bytes_per_prompt_token: 0,
        max_bytes: 16 << 20,
    };
    let clamps = [
        clamp_inserting("max_tokens"),
        clamp_inserting("generationConfig.maxOutputTokens"),
    ];
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let bodies: Vec<HostileBody> = (0..cases).map(|_| hostile_body(&mut rng, paths)).collect();

    let mut lines: Vec<String> = Vec::new();
    let mut estimates = Vec::new();
    let mut body_lines = Vec::new();
    let mut prompts = Vec::new();
    let mut clamped: Vec<Clamped> = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        body_lines.push(lines.len());
        lines.push(format!("E {}", hex(&body.bytes)));
        estimates.push(estimate.estimate(RequestBody::Complete(&body.bytes)));
        let clamp = &clamps[i % 2];
        let prompt = clamp.prompt(RequestBody::Complete(&body.bytes));
        prompts.push(prompt);
        if prompt.is_some() {
            let scale = 1 + rng.below(18);
            let output = 1 + rng.below(1 << scale);
            let rewritten = clamp.apply(&body.bytes, output);
            let sent = hex(rewritten.as_deref().unwrap_or(&body.bytes));
            lines.push(format!("C {} {sent}", hex(&body.bytes)));
            clamped.push(Clamped {
                body: i,
                line: lines.len() - 1,
                output,
                rewritten,
            });
        }
    }
    let answers = python(&lines, paths);

    let mut failures: Vec<String> = Vec::new();
    let fail = |failures: &mut Vec<String>, body: &HostileBody, what: String| {
        failures.push(format!(
            "{what}\n    tricks {:?}\n    body {}",
            body.tricks,
            show(&body.bytes)
        ));
    };
    let mut figures: BTreeMap<&str, u64> = BTreeMap::new();
    let mut per_trick: BTreeMap<Trick, (u64, u64)> = BTreeMap::new();
    let mut accepted = Vec::with_capacity(bodies.len());
    for (i, body) in bodies.iter().enumerate() {
        let a = &answers[body_lines[i]];
        let (last, first) = (reads(&a["last"]), reads(&a["first"]));
        let weir = estimates[i];
        let refused = last.is_none();
        accepted.push(!refused);
        for trick in &body.tricks {
            let seen = per_trick.entry(*trick).or_default();
            seen.0 += 1;
            seen.1 += u64::from(refused);
        }
        if body.tricks.is_empty() {
            *figures.entry("plain JSON bodies").or_default() += 1;
        }
        if prompts[i].is_some() && refused {
            fail(
                &mut failures,
                body,
                "a body Python refuses was found clampable".into(),
            );
        }
        let (Some(last), Some(first)) = (last, first) else {
            *figures.entry("refused by Python").or_default() += 1;
            let expected = if body.bytes.is_empty() {
                None
            } else {
                Some(u64::MAX)
            };
            if weir != expected {
                fail(
                    &mut failures,
                    body,
                    format!("refused by Python, weir estimates {weir:?}"),
                );
            }
            continue;
        };
        let all: Vec<Read> = last.iter().chain(&first).copied().collect();
        let other = all.contains(&Read::Other);
        let largest = all
            .iter()
            .filter_map(|r| match r {
                Read::Whole(n) => Some(*n),
                _ => None,
            })
            .max();
        if other && weir != Some(u64::MAX) {
            fail(&mut failures, body, format!("a reader reads a bound that is not a whole number ({last:?} / {first:?}); weir estimates {weir:?}"));
            continue;
        }
        if let Some(v) = largest {
            if weir.is_none_or(|w| w < v) {
                fail(
                    &mut failures,
                    body,
                    format!("a reader reads {v} ({last:?} / {first:?}); weir estimates {weir:?}"),
                );
                continue;
            }
        }
        // One reader finds a bound where the other finds none: the backend may run
        // unbounded, so weir charges `max` (as for a bound that is not a whole number).
        let unset = |r: &Read| matches!(r, Read::Absent | Read::Null);
        let disagree = last.iter().zip(&first).any(|(l, f)| unset(l) != unset(f));
        if disagree && weir != Some(u64::MAX) {
            fail(
                &mut failures,
                body,
                format!("the readers disagree on whether a bound is set ({last:?} / {first:?}); weir estimates {weir:?}"),
            );
            continue;
        }
        let exact = if other || disagree {
            Some(u64::MAX)
        } else {
            largest
        };
        if disagree {
            *figures
                .entry("estimated at max: the readers disagree on a bound")
                .or_default() += 1;
        } else if weir == exact {
            *figures.entry("estimated exactly as read").or_default() += 1;
        } else if body.has(Trick::DuplicateKey) || body.has(Trick::DuplicateParent) {
            *figures
                .entry("estimated above the readers: duplicate keys")
                .or_default() += 1;
        } else if body.has(Trick::Deep) && weir == Some(u64::MAX) {
            *figures
                .entry("estimated at max: nested past weir's bound")
                .or_default() += 1;
        } else {
            fail(
                &mut failures,
                body,
                format!("Python reads {exact:?} ({last:?} / {first:?}); weir estimates {weir:?}"),
            );
        }
        if prompts[i].is_none() {
            *figures
                .entry("accepted by Python, not clamped (decided at the estimate)")
                .or_default() += 1;
        }
    }
    for case in &clamped {
        let a = &answers[case.line];
        let body = &bodies[case.body];
        if !accepted[case.body] {
            continue;
        }
        *figures.entry("clamped").or_default() += 1;
        let sent = case.rewritten.as_deref().unwrap_or(&body.bytes);
        if let Some(rewritten) = &case.rewritten {
            *figures.entry("clamped with a rewritten body").or_default() += 1;
            if rewritten.starts_with(b"\xEF\xBB\xBF") || rewritten.iter().take(4).any(|&b| b == 0) {
                fail(
                    &mut failures,
                    body,
                    format!("rewritten as {}: not UTF-8 without a BOM", show(rewritten)),
                );
            }
            if a["duplicated"] != Value::Bool(false) {
                fail(
                    &mut failures,
                    body,
                    format!(
                        "rewritten with a bound named twice in one object: {}",
                        show(rewritten)
                    ),
                );
            }
        }
        for name in ["last", "first"] {
            let Some(read) = reads(&a[name]) else {
                fail(
                    &mut failures,
                    body,
                    format!(
                        "the clamped body (output {}) is refused by Python: {}",
                        case.output,
                        show(sent)
                    ),
                );
                break;
            };
            let bounded = read.iter().all(|r| match r {
                Read::Whole(n) => *n <= case.output,
                Read::Absent | Read::Null => true,
                Read::Other => false,
            });
            let set = read.iter().any(|r| matches!(r, Read::Whole(_)));
            if !bounded || !set {
                fail(
                    &mut failures,
                    body,
                    format!(
                        "clamped to {}, the {name}-duplicate reader reads {read:?} in {}",
                        case.output,
                        show(sent)
                    ),
                );
            }
            if a[format!("same_{name}")] != Value::Bool(true) {
                fail(&mut failures, body, format!("clamped to {}, the {name}-duplicate reader reads other fields differently in {}", case.output, show(sent)));
            }
        }
    }
    let mut report = format!("{cases} hostile bodies (seed {seed}):\n");
    for (what, n) in &figures {
        writeln!(report, "  {what}: {n}").unwrap();
    }
    writeln!(report, "  by trick (bodies, of which Python refused):").unwrap();
    for trick in Trick::ALL {
        let (n, refused) = per_trick.get(&trick).copied().unwrap_or_default();
        writeln!(report, "    {trick:?}: {n} ({refused})").unwrap();
    }
    eprint!("{report}");
    assert!(
        failures.is_empty(),
        "{} failures; the first:\n{}",
        failures.len(),
        failures[..failures.len().min(12)].join("\n")
    );
    for trick in Trick::ALL {
        assert!(
            per_trick.contains_key(&trick),
            "the generator never played {trick:?}"
        );
    }
}
