//! `commit.clamp`: a request whose estimate is more than its key has left is admitted
//! with what is left, its body's max-token fields lowered to fit, rather than denied;
//! one whose prompt (and `min_output`) does not fit is denied.
//!
//! The property: with prompts estimated as upper bounds, an upstream that generates no
//! more than the body it receives allows never costs more than its reservation (no debt,
//! whatever the body asked for, with or without a max-token field), and the admissions
//! at their actual costs keep the algorithm's own bound — on random token buckets and
//! fixed windows over the range the config accepts.
#![cfg(not(target_arch = "wasm32"))]

use crate::support;

use std::collections::BTreeMap;

use serde_json::Value;
use support::commits::{limit_of, log_uniform, settling_limit, SettlingLimit, WithBody};
use support::{engine, user, Rng, T0};
use weir_core::conformance::{self, Admission};
use weir_core::engine::{Engine, Evaluation, PendingCommit};
use weir_core::rules::Facts;
use weir_core::store::memory::MemoryStore;
use weir_core::time::Micros;
use weir_core::usage::clamp::BodyClamp;
use weir_core::usage::RequestBody;

fn clamping(limit: &str, cost: &str, clamp: &str) -> Engine {
    engine(&format!(
        r#"{{"rules":[{{"name":"llm","key":[{{"header":"x-user"}}],
            "limit":{limit},"cost":{cost},
            "commit":{{"body":{{}},"clamp":{clamp}}}}}]}}"#
    ))
}

fn decide(e: &Engine, store: &MemoryStore, body: &[u8], now: u64) -> Evaluation {
    let mut facts = Facts::new(
        &e.config.facts,
        WithBody(user("ada"), RequestBody::Complete(body)),
    );
    e.evaluate(
        store,
        &mut e.worker(),
        &support::SEED,
        &mut facts,
        Micros(now),
    )
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

/// The body clamp of a rule whose `cost` is given, on a bucket no test empties.
fn body_clamp(cost: &str) -> BodyClamp {
    let e = clamping(
        r#"{"algorithm":"token_bucket","capacity":100000,"refill":1,"period":"1h"}"#,
        cost,
        "{}",
    );
    e.config.rules[0].clamp().unwrap().body.clone()
}

#[test]
fn a_body_is_clamped_field_by_field() {
    let clamp = &body_clamp(r#"{"body":{}}"#);
    let apply = |body: &str, output| clamp.apply(body.as_bytes(), output).map(|b| json(&b));
    // Above: lowered; at or below: left alone (nothing changes: None).
    assert_eq!(
        apply(r#"{"max_tokens":900,"model":"m"}"#, 300),
        Some(json(br#"{"max_tokens":300,"model":"m"}"#))
    );
    assert_eq!(apply(r#"{"max_tokens":300}"#, 300), None);
    // Every field the estimate reads is lowered; one below stays.
    assert_eq!(
        apply(r#"{"max_tokens":100,"max_completion_tokens":5000}"#, 300),
        Some(json(br#"{"max_tokens":100,"max_completion_tokens":300}"#))
    );
    // A value that is not a whole number is replaced, as the estimate charged `max`.
    assert_eq!(
        apply(r#"{"max_tokens":"lots"}"#, 7),
        Some(json(br#"{"max_tokens":7}"#))
    );
    assert_eq!(
        apply(r#"{"max_tokens":12.5}"#, 7),
        Some(json(br#"{"max_tokens":7}"#))
    );
    // None of the fields (or only `null` ones): the first field is added.
    assert_eq!(
        apply(r#"{"messages":[]}"#, 42),
        Some(json(br#"{"messages":[],"max_tokens":42}"#))
    );
    assert_eq!(
        apply(r#"{"max_tokens":null}"#, 42),
        Some(json(br#"{"max_tokens":42}"#))
    );
    // Gemini's nested field.
    assert_eq!(
        apply(
            r#"{"generationConfig":{"maxOutputTokens":8192,"temperature":0.7}}"#,
            10
        ),
        Some(json(
            br#"{"generationConfig":{"maxOutputTokens":10,"temperature":0.7}}"#
        ))
    );
    // Not an object, not JSON: not clamped.
    assert_eq!(apply("[1,2]", 5), None);
    assert_eq!(apply("max_tokens=5", 5), None);
    assert_eq!(clamp.prompt(RequestBody::Complete(b"[1,2]")), None);
    assert_eq!(clamp.prompt(RequestBody::TooLarge), None);
    assert_eq!(clamp.prompt(RequestBody::Absent), None);
    // ⌈17 / 4⌉.
    assert_eq!(
        clamp.prompt(RequestBody::Complete(br#"{"max_tokens": 9}"#)),
        Some(5)
    );

    // The field to add, and a path whose parent is not an object.
    let clamp = &body_clamp(r#"{"body":{"fields":["generationConfig.maxOutputTokens"]}}"#);
    assert_eq!(
        clamp.apply(br#"{"contents":[]}"#, 64).map(|b| json(&b)),
        Some(json(
            br#"{"contents":[],"generationConfig":{"maxOutputTokens":64}}"#
        ))
    );
    assert_eq!(
        clamp.prompt(RequestBody::Complete(br#"{"generationConfig":"x"}"#)),
        None,
        "no room for the field: the request is decided at its estimate"
    );
}

#[test]
fn a_request_over_what_is_left_is_clamped_and_one_whose_prompt_does_not_fit_is_denied() {
    let e = clamping(
        r#"{"algorithm":"token_bucket","capacity":10000,"refill":10000,"period":"1h"}"#,
        r#"{"body":{},"default":2000,"max":8000}"#,
        r#"{"min_output":16}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    // 4,000 + ⌈36 / 4⌉ = 4,009 each: two fit whole.
    let body = br#"{"max_tokens":4000,"messages":["x"]}"#;
    assert_eq!(body.len(), 36);
    for _ in 0..2 {
        let eval = decide(&e, &store, body, T0);
        assert!(!eval.denied());
        assert_eq!(eval.commits[0].reserved, 4_009);
        let clamped = e.clamped_body(&eval, body);
        assert_eq!(clamped, None, "the body's own bound fits: unchanged");
        assert!(eval.clamped.iter().all(|c| !c.lowered));
    }
    // 1,982 left: the third gets them all, its output lowered to 1,982 − 9.
    let eval = decide(&e, &store, body, T0 + 1);
    assert!(!eval.denied());
    assert_eq!(eval.commits[0].reserved, 1_982);
    assert_eq!(eval.reports[0].cost, 1_982);
    assert!(eval.clamped[0].lowered);
    let clamped = e.clamped_body(&eval, body).unwrap();
    assert_eq!(json(&clamped)["max_tokens"], 1_973);
    assert_eq!(json(&clamped)["messages"], json(br#"["x"]"#));
    // Nothing left: denied, to retry when the prompt and `min_output` (25) have refilled.
    let eval = decide(&e, &store, body, T0 + 2);
    assert!(eval.denied());
    assert!(eval.commits.is_empty() && eval.clamped.is_empty());
    let retry = eval.verdicts[0].decision.retry_after_ns.unwrap();
    // 25 tokens of a refill of 10,000 an hour: the next refill, an hour on.
    assert!(retry > 3_500_000_000_000, "{retry}");

    // A body without a max-token field gets one: the default estimate (2,000) becomes
    // its bound, its prompt counted on top of it when the default is less.
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let eval = decide(&e, &store, br#"{"messages":[]}"#, T0);
    assert_eq!(eval.commits[0].reserved, 2_000);
    let clamped = e.clamped_body(&eval, br#"{"messages":[]}"#).unwrap();
    assert_eq!(json(&clamped)["max_tokens"], 2_000 - 4);
    // A prompt above `max`: the prompt and `min_output` are reserved, above `max`.
    let long = format!(r#"{{"max_tokens":10,"p":"{}"}}"#, "x".repeat(33_000));
    let eval = decide(&e, &store, long.as_bytes(), T0);
    assert!(
        eval.denied(),
        "a prompt of ~8,256 tokens does not fit what is left"
    );
    // A prompt beyond what the limit ever holds: denied with no retry.
    let longer = format!(r#"{{"p":"{}"}}"#, "x".repeat(40_000));
    let eval = decide(&e, &store, longer.as_bytes(), T0);
    assert!(eval.denied());
    assert_eq!(eval.verdicts[0].decision.retry_after_ns, None);
}

/// The clamp example of docs/configuration.md: `default` 4,000, `max` 16,000.
const DOCS_EXAMPLE: &str = r#"{ "rules": [ { "name": "tokens-per-key", "key": [ { "header": "x-user" } ],
  "limit": { "algorithm": "token_bucket", "capacity": 100000, "refill": 100000, "period": "1h" },
  "cost": { "body": { "fields": [ "max_completion_tokens", "max_tokens" ] }, "default": 4000, "max": 16000 },
  "commit": { "body": {}, "clamp": { "field": "max_completion_tokens", "min_output": 64 } } } ] }"#;

/// Issue 32, defects 2 and 3, through the engine: a body `serde_json` refuses and
/// `json.loads` accepts (a BOM, `NaN` elsewhere, a lone surrogate, UTF-16), or one with a
/// duplicate bound, is reserved the `max` and sent with its bound lowered, as a plain body
/// is; before, they were reserved the `default` (4,000) and reached the upstream asking
/// for 100,000.
#[test]
fn bodies_a_strict_parser_refuses_are_reserved_and_clamped_as_plain_ones() {
    let e = engine(DOCS_EXAMPLE);
    let plain =
        br#"{"model":"m","max_tokens":100000,"messages":[{"role":"user","content":"hello"}]}"#;
    assert_eq!(plain.len(), 80);
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend(plain);
    let nan = br#"{"model":"m","max_tokens":100000,"temperature":NaN,"messages":[]}"#.to_vec();
    let surrogate =
        br#"{"model":"m","max_tokens":100000,"messages":[{"content":"\ud800"}]}"#.to_vec();
    let utf16: Vec<u8> = std::str::from_utf8(plain)
        .unwrap()
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    let first_small = br#"{"max_tokens":1,"model":"m","max_tokens":100000}"#.to_vec();
    let last_small = br#"{"max_tokens":100000,"model":"m","max_tokens":1}"#.to_vec();
    for body in [
        plain.to_vec(),
        bom,
        nan,
        surrogate,
        utf16,
        first_small,
        last_small,
    ] {
        let store = MemoryStore::new();
        e.prepare(&store).unwrap();
        let eval = decide(&e, &store, &body, T0);
        assert_eq!(eval.commits[0].reserved, 16_000, "{body:?}");
        let sent = e.clamped_body(&eval, &body).expect("rewritten");
        let output = 16_000 - (body.len() as u64).div_ceil(4);
        if body.as_slice() == plain {
            assert_eq!(output, 15_980);
        }
        // One `max_tokens`, lowered; valid UTF-8 JSON for a strict reader too, unless the
        // body itself holds what only a lenient one reads.
        assert_eq!(
            sent.windows(12).filter(|w| w == b"\"max_tokens\"").count(),
            1,
            "{}",
            String::from_utf8_lossy(&sent)
        );
        let text = String::from_utf8_lossy(&sent);
        assert!(text.contains(&format!("\"max_tokens\":{output}")), "{text}");
        assert!(!sent.starts_with(b"\xEF\xBB\xBF"));
    }
}

#[test]
fn a_clamp_splices_the_bound_and_leaves_everything_else_as_it_was() {
    let clamp = &body_clamp(r#"{"body":{}}"#);
    let apply = |body: &[u8], output| {
        clamp
            .apply(body, output)
            .map(|b| String::from_utf8(b).unwrap())
    };
    // NaN, a lone surrogate, key order and whitespace survive.
    assert_eq!(
        apply(
            br#"{ "temperature": NaN, "max_tokens" : 900, "p": "\ud800", "a": 1e400 }"#,
            300
        )
        .as_deref(),
        Some(r#"{ "temperature": NaN, "max_tokens" : 300, "p": "\ud800", "a": 1e400 }"#)
    );
    // Duplicates: one occurrence left, at the first one's place, whichever was larger.
    assert_eq!(
        apply(br#"{"max_tokens":1,"model":"m","max_tokens":100000}"#, 300).as_deref(),
        Some(r#"{"max_tokens":300,"model":"m"}"#)
    );
    assert_eq!(
        apply(
            br#"{"max_tokens":100000,"model":"m", "max_tokens" :1 }"#,
            300
        )
        .as_deref(),
        Some(r#"{"max_tokens":300,"model":"m" }"#)
    );
    // Every occurrence fits: the body goes as it came, duplicates and all.
    assert_eq!(apply(br#"{"max_tokens":1,"max_tokens":200}"#, 300), None);
    // Something else is lowered: the fitting field's duplicates go too, at its largest.
    assert_eq!(
        apply(
            br#"{"max_tokens":1,"max_tokens":200,"max_completion_tokens":900}"#,
            300
        )
        .as_deref(),
        Some(r#"{"max_tokens":200,"max_completion_tokens":300}"#)
    );
    // A null duplicate is a reader without a bound: set.
    assert_eq!(
        apply(br#"{"max_tokens":5,"max_tokens":null}"#, 300).as_deref(),
        Some(r#"{"max_tokens":300}"#)
    );
    // Duplicate parents: each gets the field, once; a null one becomes an object.
    assert_eq!(
        apply(
            br#"{"generationConfig":{"maxOutputTokens":9,"maxOutputTokens":9000},"generationConfig":{"t":1},"generationConfig":null}"#,
            64
        )
        .as_deref(),
        Some(r#"{"generationConfig":{"maxOutputTokens":64},"generationConfig":{"t":1,"maxOutputTokens":64},"generationConfig":{"maxOutputTokens":64}}"#)
    );
    // A field written into an empty object, and a body without any field.
    assert_eq!(
        apply(
            br#"{"generationConfig":{},"generationConfig":{"maxOutputTokens":100}}"#,
            64
        )
        .as_deref(),
        Some(
            r#"{"generationConfig":{"maxOutputTokens":64},"generationConfig":{"maxOutputTokens":64}}"#
        )
    );
    assert_eq!(
        apply(br#"{"messages":[] }"#, 42).as_deref(),
        Some(r#"{"messages":[] ,"max_tokens":42}"#)
    );
    assert_eq!(apply(b"{}", 42).as_deref(), Some(r#"{"max_tokens":42}"#));
    assert_eq!(
        apply(br#"{"max_tokens":null,"max_tokens":null}"#, 42).as_deref(),
        Some(r#"{"max_tokens":42}"#)
    );
    // An escaped name is the field.
    assert_eq!(
        apply(br#"{"max\u005ftokens":900}"#, 7).as_deref(),
        Some(r#"{"max\u005ftokens":7}"#)
    );
    // UTF-16 in, UTF-8 out; a BOM dropped.
    let utf16: Vec<u8> = "\u{feff}{\"max_tokens\":900,\"p\":\"é\"}"
        .encode_utf16()
        .flat_map(u16::to_be_bytes)
        .collect();
    assert_eq!(
        apply(&utf16, 7).as_deref(),
        Some("{\"max_tokens\":7,\"p\":\"é\"}")
    );
    assert_eq!(
        apply(b"\xEF\xBB\xBF{\"max_tokens\":900}", 7).as_deref(),
        Some("{\"max_tokens\":7}")
    );
    // A parent in the way, or no object, or a body no reader accepts: not clamped.
    let clamp = &body_clamp(r#"{"body":{"fields":["generationConfig.maxOutputTokens"]}}"#);
    for stuck in [
        &br#"{"generationConfig":{"maxOutputTokens":9000},"generationConfig":"x"}"#[..],
        br#"{"generationConfig":[]}"#,
        br#"[{"max_tokens":9000}]"#,
        br#"{"generationConfig":{"maxOutputTokens":9000}"#,
        b"",
    ] {
        assert_eq!(
            clamp.prompt(RequestBody::Complete(stuck)),
            None,
            "{stuck:?}"
        );
        assert_eq!(clamp.apply(stuck, 5), None, "{stuck:?}");
    }
    assert!(clamp
        .prompt(RequestBody::Complete(
            br#"{"generationConfig":null,"x":NaN}"#
        ))
        .is_some());
}

#[test]
fn a_shadow_rule_never_clamps() {
    let e = engine(
        r#"{"rules":[{"name":"llm","shadow":true,"key":[{"header":"x-user"}],
            "limit":{"algorithm":"fixed_window","limit":1000,"window":"1m"},
            "cost":{"body":{}},"commit":{"body":{},"clamp":{}}}]}"#,
    );
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let body = br#"{"max_tokens":600}"#;
    for _ in 0..3 {
        let eval = decide(&e, &store, body, T0);
        assert!(!eval.denied());
        assert!(eval.clamped.is_empty());
        assert_eq!(e.clamped_body(&eval, body), None);
    }
}

/// What an upstream that honours the body lets itself generate: the largest max-token
/// field it finds (a string or fraction is refused as the estimate refused it: a
/// backend could read it as anything, here its own maximum), or its own maximum.
fn upstream_bound(body: &[u8], backend_max: u64) -> u64 {
    let value = json(body);
    let fields = [
        value.get("max_tokens"),
        value.get("max_completion_tokens"),
        value.get("max_output_tokens"),
        value
            .get("generationConfig")
            .and_then(|g| g.get("maxOutputTokens")),
    ];
    fields
        .into_iter()
        .flatten()
        .filter(|v| !v.is_null())
        .map(|v| v.as_u64().unwrap_or(backend_max))
        .max()
        .unwrap_or(backend_max)
}

/// A random body: a prompt of some length, and any of the max-token fields, absent,
/// `null`, small, huge, fractional or a string.
fn random_body(rng: &mut Rng, scale: u64) -> String {
    let mut fields = Vec::new();
    let value = |rng: &mut Rng| match rng.below(8) {
        0 => "null".to_string(),
        1 => "\"many\"".to_string(),
        2 => format!("{}.5", rng.below(scale + 1)),
        3 => format!("{}", u64::MAX),
        _ => format!("{}", log_uniform(rng, scale.max(1) * 4)),
    };
    for name in ["max_tokens", "max_completion_tokens", "max_output_tokens"] {
        if rng.below(3) == 0 {
            fields.push(format!(r#""{name}":{}"#, value(rng)));
        }
    }
    if rng.below(5) == 0 {
        fields.push(format!(
            r#""generationConfig":{{"maxOutputTokens":{}}}"#,
            value(rng)
        ));
    }
    let prompt = "p".repeat(rng.below(scale.min(4_000) + 1) as usize);
    fields.push(format!(r#""prompt":"{prompt}""#));
    format!("{{{}}}", fields.join(","))
}

#[derive(Debug)]
struct ClampCase {
    config: String,
    bytes_per_prompt_token: u64,
    backend_max: u64,
    requests: Vec<(u64, String, u64)>,
}

/// A random token bucket or fixed window (sizes up to a million, periods and windows
/// from 1 µs to 10 minutes, refills below and above the capacity), a cost from the body
/// with a random `default`, `max`, prompt rate and `min_output`, and 200–400 requests at
/// the limit's own scale, responses lasting up to 3 periods.
fn clamp_case(rng: &mut Rng) -> ClampCase {
    let SettlingLimit {
        json: limit,
        size,
        scale,
        ..
    } = settling_limit(rng);
    let max = log_uniform(rng, size);
    let default = log_uniform(rng, max);
    let bytes_per_prompt_token = 1 + rng.below(8);
    let min_output = log_uniform(rng, max);
    let config = format!(
        r#"{{"rules":[{{"name":"llm","key":[{{"header":"x-user"}}],"limit":{limit},
            "cost":{{"body":{{"bytes_per_prompt_token":{bytes_per_prompt_token}}},"default":{default},"max":{max}}},
            "commit":{{"body":{{}},"clamp":{{"min_output":{min_output}}}}}}}]}}"#
    );
    let n = 200 + rng.below(201);
    let mean_gap = scale / (1 + rng.below(8)) / n.max(1) * 8;
    let longest = match rng.below(3) {
        0 => 0,
        1 => scale,
        _ => 3 * scale,
    };
    let mut now = T0 + rng.below(scale);
    let mut requests = Vec::new();
    for _ in 0..n {
        now += match rng.below(20) {
            0 => scale * (1 + rng.below(3)),
            1..=3 => 0,
            _ => rng.below(2 * mean_gap + 1),
        };
        requests.push((now, random_body(rng, max), rng.below(longest + 1)));
    }
    ClampCase {
        config,
        bytes_per_prompt_token,
        backend_max: max.saturating_mul(4),
        requests,
    }
}

/// Runs a case: each admitted request's body as the upstream receives it (clamped or
/// not), an actual usage of a prompt up to its estimate and an output up to what that
/// body allows; settled when its response ends. Returns the admissions at their actual
/// costs, the commits whose usage was above their reservation, and the tokens admitted.
fn run_case(case: &ClampCase) -> (Vec<Admission>, Vec<String>, u64, usize) {
    let e = engine(&case.config);
    let store = MemoryStore::new();
    e.prepare(&store).unwrap();
    let mut rng = Rng(case.requests.len() as u64 ^ 0x5eed);
    let mut open: BTreeMap<(u64, usize), (PendingCommit, u64)> = BTreeMap::new();
    let (mut admissions, mut debts, mut clamped) = (Vec::new(), Vec::new(), 0);
    let mut tokens = 0;
    for (i, (at, body, duration)) in case.requests.iter().enumerate() {
        while let Some(entry) = open.first_entry() {
            if entry.key().0 > *at {
                break;
            }
            let ((end, _), (commit, actual)) = entry.remove_entry();
            e.commit(&store, &commit, actual, Micros(end)).unwrap();
        }
        let eval = decide(&e, &store, body.as_bytes(), *at);
        if eval.denied() {
            continue;
        }
        let sent = e.clamped_body(&eval, body.as_bytes());
        clamped += usize::from(sent.is_some());
        let sent = sent.unwrap_or_else(|| body.clone().into_bytes());
        let prompt_bound = (body.len() as u64).div_ceil(case.bytes_per_prompt_token);
        let output = rng.below(upstream_bound(&sent, case.backend_max) + 1);
        let actual = rng.below(prompt_bound + 1) + output;
        let [commit] = &eval.commits[..] else {
            panic!("one commit per admitted request: {:?}", eval.commits);
        };
        if actual > commit.reserved {
            debts.push(format!(
                "request {i} at {at}: reserved {}, used {actual} (body {body:.80}, sent {:.80})",
                commit.reserved,
                String::from_utf8_lossy(&sent)
            ));
        }
        admissions.push(Admission {
            at_us: *at,
            cost: actual,
        });
        tokens += actual;
        open.insert((at + duration, i), (commit.clone(), actual));
    }
    (admissions, debts, tokens, clamped)
}

#[test]
fn clamped_requests_never_owe_and_keep_the_bound() {
    let cases: u64 = std::env::var("WEIR_CLAMP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed: u64 = std::env::var("WEIR_CLAMP_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(23);
    let mut rng = Rng(seed);
    let (mut admitted, mut clamped) = (0, 0);
    for c in 0..cases {
        let case = clamp_case(&mut rng);
        let (admissions, debts, _, n_clamped) = run_case(&case);
        assert!(
            debts.is_empty(),
            "case {c} (seed {seed}): {}\n{}",
            case.config,
            debts.join("\n")
        );
        let limit = limit_of(&engine(&case.config));
        conformance::check(&limit, &admissions)
            .unwrap_or_else(|v| panic!("case {c} (seed {seed}): {}: {v}", case.config));
        admitted += admissions.len();
        clamped += n_clamped;
    }
    eprintln!("{cases} cases: {admitted} requests admitted, {clamped} of them with a clamped body");
    assert!(
        clamped * 10 > admitted,
        "too few clamps to judge: {clamped} of {admitted}"
    );
}
