#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use super::*;

fn defaults() -> Vec<UsageField> {
    DEFAULT_FIELDS
        .iter()
        .map(|f| UsageField::parse(f).unwrap())
        .collect()
}

fn scan(body: &[u8], stream: bool, chunk: usize) -> Option<u64> {
    scan_why(body, stream, chunk).ok()
}

fn scan_why(body: &[u8], stream: bool, chunk: usize) -> Result<u64, Unread> {
    let mut s = UsageScanner::new(&defaults(), stream, 4096);
    for piece in body.chunks(chunk) {
        s.feed(piece);
    }
    s.finish()
}

#[test]
fn a_scanner_that_gives_up_reads_no_usage_and_keeps_nothing() {
    let fields = [UsageField::parse("usage.total_tokens").unwrap()];
    for stream in [false, true] {
        let mut scanner = UsageScanner::new(&fields, stream, 1 << 20);
        scanner.feed(b"data: {\"usage\":{\"total_tokens\":5}}\n\n{\"usage\":");
        assert!(scanner.buffered() > 0);
        scanner.give_up();
        assert_eq!(scanner.buffered(), 0);
        scanner.feed(b"{\"total_tokens\":7}}");
        assert_eq!(scanner.buffered(), 0, "nothing kept after giving up");
        assert_eq!(scanner.finish(), Err(Unread::TooLarge));
    }
}

#[test]
fn the_usage_of_openai_anthropic_and_gemini_bodies() {
    let openai = br#"{"id":"x","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#;
    let anthropic = br#"{"type":"message","usage":{"input_tokens":10,"output_tokens":25}}"#;
    let gemini =
        br#"{"candidates":[],"usageMetadata":{"promptTokenCount":4,"totalTokenCount":40}}"#;
    for chunk in [1, 7, 4096] {
        assert_eq!(scan(openai, false, chunk), Some(21));
        assert_eq!(scan(anthropic, false, chunk), Some(35));
        assert_eq!(scan(gemini, false, chunk), Some(40));
    }
    assert_eq!(scan(br#"{"usage":{}}"#, false, 10), None);
    assert_eq!(scan(b"not json", false, 10), None);
}

#[test]
fn the_usage_of_event_streams_is_their_last_count() {
    let openai = b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
                       data: {\"choices\":[],\"usage\":{\"total_tokens\":57}}\n\ndata: [DONE]\n\n";
    let anthropic = b"event: message_start\r\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n\
                          event: message_delta\r\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\r\n\r\n";
    let gemini = b"data: {\"usageMetadata\":{\"totalTokenCount\":10}}\n\ndata: {\"usageMetadata\":{\"totalTokenCount\":33}}\n\n";
    for chunk in [1, 5, 4096] {
        assert_eq!(scan(openai, true, chunk), Some(57));
        assert_eq!(scan(anthropic, true, chunk), Some(40));
        assert_eq!(scan(gemini, true, chunk), Some(33));
    }
    assert_eq!(scan(b"data: {\"choices\":[]}\n\n", true, 3), None);
}

#[test]
fn event_streams_with_bare_cr_line_ends_are_read() {
    let cr =
        b"event: message\rdata: {\"choices\":[]}\r\rdata: {\"usage\":{\"total_tokens\":57}}\r\r";
    let mixed = b"data: {\"usage\":{\"total_tokens\":5}}\r\n\r\ndata: {\"usage\":{\"total_tokens\":6}}\r\rdata: {\"usage\":{\"total_tokens\":8}}\n\n";
    for chunk in [1, 2, 3, 5, 4096] {
        assert_eq!(scan(cr, true, chunk), Some(57), "chunks of {chunk}");
        assert_eq!(scan(mixed, true, chunk), Some(8), "chunks of {chunk}");
    }
}

#[test]
fn an_event_whose_json_spans_several_data_lines_is_read() {
    // SSE joins an event's data lines with "\n": here, valid JSON.
    let split = b"data: {\"choices\":[],\ndata: \"usage\":\n\
                      data:{\"total_tokens\":64}}\n\ndata: [DONE]\n\n";
    for chunk in [1, 4, 4096] {
        assert_eq!(scan(split, true, chunk), Some(64), "chunks of {chunk}");
    }
    // Lines of one event that are each an event of their own (no blank line between
    // them) are still read one by one.
    let unseparated =
        b"data: {\"usage\":{\"total_tokens\":3}}\ndata: {\"usage\":{\"total_tokens\":9}}\n\n";
    assert_eq!(scan(unseparated, true, 7), Some(9));
}

#[test]
fn the_responses_api_stream_usage_is_read_by_default() {
    let stream = b"event: response.created\n\
            data: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"usage\":null}}\n\n\
            event: response.output_text.delta\n\
            data: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\"}\n\n\
            event: response.completed\n\
            data: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":11,\"output_tokens\":31,\"total_tokens\":42}}}\n\n";
    for chunk in [1, 9, 4096] {
        assert_eq!(scan(stream, true, chunk), Some(42), "chunks of {chunk}");
    }
}

#[test]
fn the_scanner_says_why_it_found_no_usage() {
    assert_eq!(
        scan_why(b"{\"choices\":[]}", false, 3),
        Err(Unread::NoUsage)
    );
    assert_eq!(
        scan_why(b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n", true, 3),
        Err(Unread::NoUsage)
    );
    let mut big = b"{\"usage\":{\"total_tokens\":5},\"pad\":\"".to_vec();
    big.extend(std::iter::repeat_n(b'x', 5000));
    big.extend(b"\"}");
    assert_eq!(scan_why(&big, false, 100), Err(Unread::TooLarge));
    let mut event = b"data: {\"usage\":{\"total_tokens\":5},\n".to_vec();
    for _ in 0..100 {
        event.extend(b"data: \"pad\": \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\",\n");
    }
    event.extend(b"data: \"end\": 1}\n\n");
    assert_eq!(
        scan_why(&event, true, 64),
        Err(Unread::TooLarge),
        "an event over the cap"
    );
    let gzip = |encoding: &[u8]| {
        let mut s = UsageScanner::for_response(
            &defaults(),
            4096,
            Some(b"application/json"),
            Some(encoding),
        );
        s.feed(br#"{"usage":{"total_tokens":5}}"#);
        s.finish()
    };
    assert_eq!(gzip(b"gzip"), Err(Unread::Compressed));
    assert_eq!(gzip(b"identity, br"), Err(Unread::Compressed));
    assert_eq!(gzip(b"Identity"), Ok(5));
    assert_eq!(gzip(b""), Ok(5));
    assert!(UsageScanner::is_identity(None));
}

#[test]
fn bodies_and_lines_beyond_the_cap_are_dropped_not_kept() {
    let mut big = b"{\"usage\":{\"total_tokens\":5},\"pad\":\"".to_vec();
    big.extend(std::iter::repeat_n(b'x', 5000));
    big.extend(b"\"}");
    assert_eq!(scan(&big, false, 100), None, "over 4096 bytes: unknown");
    let mut stream = b"data: {\"pad\":\"".to_vec();
    stream.extend(std::iter::repeat_n(b'x', 5000));
    stream.extend(
        b"\",\"usage\":{\"total_tokens\":99}}\n\ndata: {\"usage\":{\"total_tokens\":7}}\n\n",
    );
    assert_eq!(
        scan(&stream, true, 100),
        Some(7),
        "the long line is skipped"
    );
}

#[test]
fn a_request_is_estimated_from_its_max_tokens_and_its_size() {
    let estimate = BodyEstimate {
        fields: DEFAULT_MAX_TOKENS_FIELDS
            .iter()
            .map(|f| UsageField::parse(f).unwrap())
            .collect(),
        bytes_per_prompt_token: 4,
        max_bytes: 1024,
    };
    let openai = br#"{"model":"m","max_completion_tokens":500,"messages":[]}"#;
    assert_eq!(openai.len(), 55);
    assert_eq!(
        estimate.estimate(RequestBody::Complete(openai)),
        Some(500 + 14)
    );
    let gemini = br#"{"generationConfig":{"maxOutputTokens":64}}"#;
    assert_eq!(
        estimate.estimate(RequestBody::Complete(gemini)),
        Some(64 + 11)
    );
    let without = br#"{"model":"m","messages":[]}"#;
    assert_eq!(estimate.estimate(RequestBody::Complete(without)), None);
    // Not JSON: a backend that reads it anyway may read any bound (issue 32).
    assert_eq!(
        estimate.estimate(RequestBody::Complete(b"max_tokens=5")),
        Some(u64::MAX)
    );
    assert_eq!(estimate.estimate(RequestBody::Absent), None);
    assert_eq!(
        estimate.estimate(RequestBody::Complete(b"")),
        None,
        "an empty body is no body"
    );
    assert_eq!(estimate.estimate(RequestBody::TooLarge), Some(u64::MAX));
    let huge = br#"{"max_tokens":18446744073709551615,"x":1}"#;
    assert_eq!(
        estimate.estimate(RequestBody::Complete(huge)),
        Some(u64::MAX),
        "saturates"
    );
    let output_only = BodyEstimate {
        bytes_per_prompt_token: 0,
        ..estimate
    };
    assert_eq!(
        output_only.estimate(RequestBody::Complete(openai)),
        Some(500)
    );
}

fn default_estimate() -> BodyEstimate {
    BodyEstimate {
        fields: DEFAULT_MAX_TOKENS_FIELDS
            .iter()
            .map(|f| UsageField::parse(f).unwrap())
            .collect(),
        bytes_per_prompt_token: 0,
        max_bytes: 1024,
    }
}

#[test]
fn the_estimate_is_the_largest_max_token_field_not_the_first() {
    let estimate = default_estimate();
    let body = |text: &str| estimate.estimate(RequestBody::Complete(text.as_bytes()));
    assert_eq!(
        body(r#"{"max_tokens":1,"max_completion_tokens":8000}"#),
        Some(8000)
    );
    assert_eq!(
        body(r#"{"max_completion_tokens":8000,"max_tokens":1}"#),
        Some(8000)
    );
    assert_eq!(
        body(r#"{"max_tokens":5,"max_output_tokens":7,"generationConfig":{"maxOutputTokens":6}}"#),
        Some(7)
    );
    // null is what a backend reads as "not set": the other fields, or the default.
    assert_eq!(
        body(r#"{"max_tokens":null,"max_completion_tokens":30}"#),
        Some(30)
    );
    assert_eq!(body(r#"{"max_tokens":null}"#), None);
}

#[test]
fn integral_json_numbers_are_read_and_other_values_estimate_the_max() {
    let estimate = default_estimate();
    let body = |text: &str| estimate.estimate(RequestBody::Complete(text.as_bytes()));
    assert_eq!(body(r#"{"max_tokens":8000.0}"#), Some(8000));
    assert_eq!(body(r#"{"max_tokens":8e3}"#), Some(8000));
    assert_eq!(body(r#"{"max_tokens":8.0E+3}"#), Some(8000));
    assert_eq!(body(r#"{"max_tokens":-0.0}"#), Some(0));
    // Not a whole number of tokens a backend could mean: the rule's max (u64::MAX,
    // clamped to `max` by the caller), never the default.
    for odd in [
        r#"{"max_tokens":8000.5}"#,
        r#"{"max_tokens":-1}"#,
        r#"{"max_tokens":-8e3}"#,
        r#"{"max_tokens":1e300}"#,
        r#"{"max_tokens":"8000"}"#,
        r#"{"max_tokens":true}"#,
        r#"{"max_tokens":{"n":5}}"#,
        r#"{"max_tokens":1,"max_completion_tokens":"lots"}"#,
    ] {
        assert_eq!(body(odd), Some(u64::MAX), "{odd}");
    }
}

#[test]
fn fields_parse_with_errors_that_say_what_is_wrong() {
    assert!(UsageField::parse("usage.total_tokens").is_ok());
    assert_eq!(
        UsageField::parse("usage..x").unwrap_err(),
        "\"usage..x\" is not a dotted path (empty segment)"
    );
    assert!(UsageField::parse("a+b+c+d+e+f+g+h+i")
        .unwrap_err()
        .contains("9 terms"));
}

fn estimate_of(text: &[u8]) -> Option<u64> {
    default_estimate().estimate(RequestBody::Complete(text))
}

/// Issue 32, defect 2: bodies `serde_json` refuses and `json.loads(bytes)` accepts are
/// read as the upstream reads them, and a body no reader accepts costs the rule's `max`.
#[test]
fn bodies_a_strict_parser_refuses_are_read_as_python_reads_them() {
    let plain = r#"{"model":"m","max_tokens":100000,"messages":[]}"#;
    assert_eq!(estimate_of(plain.as_bytes()), Some(100_000));
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend(plain.as_bytes());
    let utf16le: Vec<u8> = plain.encode_utf16().flat_map(u16::to_le_bytes).collect();
    let mut utf16be: Vec<u8> = vec![0xFE, 0xFF];
    utf16be.extend(plain.encode_utf16().flat_map(u16::to_be_bytes));
    let utf32le: Vec<u8> = plain
        .chars()
        .flat_map(|c| u32::from(c).to_le_bytes())
        .collect();
    for body in [bom, utf16le, utf16be, utf32le] {
        assert_eq!(estimate_of(&body), Some(100_000), "{body:?}");
    }
    for other in [
        r#"{"temperature":NaN,"max_tokens":100000}"#,
        r#"{"top_p":Infinity,"stop":[-Infinity],"max_tokens":100000}"#,
        r#"{"prompt":"\ud800","max_tokens":100000}"#,
        r#"{"max\u005ftokens":100000}"#,
        r#"{"max_tokens":-0,"max_completion_tokens":100000}"#,
    ] {
        assert_eq!(estimate_of(other.as_bytes()), Some(100_000), "{other}");
    }
    assert_eq!(estimate_of(br#"{"max_tokens":-0}"#), Some(0));
}

#[test]
fn a_bound_that_is_not_a_whole_number_or_a_body_no_one_reads_costs_the_max() {
    for no_bound in [
        &br#"{"max_tokens":NaN}"#[..],
        br#"{"max_tokens":Infinity}"#,
        br#"{"max_tokens":-Infinity}"#,
        br#"{"max_tokens":1e400}"#,
        br#"{"max_tokens":18446744073709551616}"#,
        br#"{"max_tokens":100000"#,
        b"{\"max_tokens\":5,\"p\":\"\xFF\"}",
        b"max_tokens=5",
        b"   ",
        br#"{"max_tokens":5,}"#,
        br#"{"max_tokens":5} {}"#,
    ] {
        assert_eq!(estimate_of(no_bound), Some(u64::MAX), "{no_bound:?}");
    }
    let deep = format!(
        r#"{{"max_tokens":5,"x":{}{}}}"#,
        "[".repeat(json::MAX_DEPTH),
        "]".repeat(json::MAX_DEPTH)
    );
    assert_eq!(estimate_of(deep.as_bytes()), Some(u64::MAX), "too deep");
    // An empty body is no body: the default.
    assert_eq!(estimate_of(b""), None);
    // The prompt still counts on top of a max... saturating.
    let with_prompt = BodyEstimate {
        bytes_per_prompt_token: 4,
        ..default_estimate()
    };
    assert_eq!(
        with_prompt.estimate(RequestBody::Complete(b"not json")),
        Some(u64::MAX)
    );
}

/// Issue 32, defect 3: a parser keeping the first duplicate reads another bound than one
/// keeping the last: the estimate is the largest, at every level.
#[test]
fn duplicate_bound_fields_cost_the_largest_of_them() {
    for body in [
        r#"{"max_tokens":1,"messages":[],"max_tokens":100000}"#,
        r#"{"max_tokens":100000,"messages":[],"max_tokens":1}"#,
        r#"{"max_tokens":1,"max\u005ftokens":100000}"#,
        r#"{"generationConfig":{"maxOutputTokens":1},"generationConfig":{"maxOutputTokens":100000}}"#,
        r#"{"generationConfig":{"maxOutputTokens":100000},"generationConfig":{"maxOutputTokens":1}}"#,
        r#"{"generationConfig":{"maxOutputTokens":1,"maxOutputTokens":100000}}"#,
    ] {
        assert_eq!(estimate_of(body.as_bytes()), Some(100_000), "{body}");
    }
    // One reader finds a number, another none (null, a duplicate parent without it or
    // not an object): not a bound every reader agrees on, the max.
    for body in [
        r#"{"max_tokens":5,"max_tokens":null}"#,
        r#"{"max_tokens":null,"max_tokens":5}"#,
        r#"{"generationConfig":{"maxOutputTokens":5},"generationConfig":{"temperature":1}}"#,
        r#"{"generationConfig":{"maxOutputTokens":5},"generationConfig":null}"#,
        r#"{"generationConfig":"x","generationConfig":{"maxOutputTokens":5}}"#,
        r#"{"max_tokens":5,"max_tokens":"5"}"#,
    ] {
        assert_eq!(estimate_of(body.as_bytes()), Some(u64::MAX), "{body}");
    }
    // Duplicates that agree, and nothing set in any of them.
    assert_eq!(estimate_of(br#"{"max_tokens":7,"max_tokens":7}"#), Some(7));
    assert_eq!(
        estimate_of(br#"{"max_tokens":null,"max_tokens":null}"#),
        None
    );
    assert_eq!(
        estimate_of(br#"{"generationConfig":{},"generationConfig":null}"#),
        None
    );
}

fn scan_with(fields: &[&str], body: &[u8], stream: bool) -> Result<u64, Unread> {
    let fields: Vec<UsageField> = fields
        .iter()
        .map(|f| UsageField::parse(f).unwrap())
        .collect();
    let mut s = UsageScanner::new(&fields, stream, 1 << 20);
    s.feed(body);
    s.finish()
}

/// Issue 32, defect 4: Anthropic counts prompt-cache tokens apart from `input_tokens`.
#[test]
fn anthropic_cache_tokens_are_counted_by_default_in_bodies_and_streams() {
    let json = br#"{"type":"message","usage":{"input_tokens":12,"cache_creation_input_tokens":100000,"cache_read_input_tokens":0,"output_tokens":500}}"#;
    let stream = b"event: message_start\n\
        data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"cache_creation_input_tokens\":100000,\"cache_read_input_tokens\":0,\"output_tokens\":1}}}\n\n\
        event: message_delta\n\
        data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":500}}\n\n";
    // The newer stream: `message_delta` repeats every count, cumulatively.
    let cumulative = b"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"cache_read_input_tokens\":7,\"output_tokens\":1}}}\n\n\
        data: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":30,\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":100000,\"output_tokens\":500}}\n\n";
    for chunk in [1, 7, 4096] {
        assert_eq!(scan(json, false, chunk), Some(100_512));
        assert_eq!(scan(stream, true, chunk), Some(100_512));
        assert_eq!(scan(cumulative, true, chunk), Some(100_530));
    }
    // Only some of them present: those present count.
    let only_read =
        br#"{"usage":{"input_tokens":12,"cache_read_input_tokens":88,"output_tokens":500}}"#;
    assert_eq!(scan(only_read, false, 9), Some(600));
    let neither =
        br#"{"usage":{"input_tokens":12,"cache_creation_input_tokens":null,"output_tokens":500}}"#;
    assert_eq!(scan(neither, false, 9), Some(512));
}

#[test]
fn weighted_and_optional_terms_are_exact_and_rounded_up() {
    let body = br#"{"usage":{"input_tokens":10,"cache_read_input_tokens":1005,"output_tokens":3}}"#;
    let tenth = "usage.input_tokens+0.1*usage.cache_read_input_tokens?+usage.output_tokens";
    // 10 + 100.5 + 3, rounded up.
    assert_eq!(scan_with(&[tenth], body, false), Ok(114));
    assert_eq!(
        scan_with(
            &["1.25*usage.input_tokens+0.001*usage.output_tokens"],
            body,
            false
        ),
        Ok(13)
    );
    assert_eq!(
        scan_with(&["1000*usage.output_tokens"], body, false),
        Ok(3_000)
    );
    // A required term missing: the next field.
    assert_eq!(
        scan_with(
            &["usage.missing+usage.output_tokens", "usage.output_tokens"],
            body,
            false
        ),
        Ok(3)
    );
    // An optional term present but not a count: the field is not read.
    let odd = br#"{"usage":{"input_tokens":10,"cache_read_input_tokens":-5,"output_tokens":3}}"#;
    assert_eq!(
        scan_with(&[tenth], odd, false),
        Err(Unread::NoUsage),
        "a bad value is not absent"
    );
    // Large counts stay exact: 8 terms of u64::MAX - 1 at 1000x saturate, never wrap.
    let huge = format!(r#"{{"a":{}}}"#, u64::MAX - 1);
    assert_eq!(
        scan_with(
            &["1000*a+1000*a+1000*a+1000*a+1000*a+1000*a+1000*a+1000*a"],
            huge.as_bytes(),
            false
        ),
        Ok(u64::MAX)
    );
}

#[test]
fn usage_is_read_leniently_and_duplicates_read_their_largest() {
    let fields = ["usage.total_tokens"];
    assert_eq!(
        scan_with(
            &fields,
            br#"{"usage":{"total_tokens":5,"total_tokens":50}}"#,
            false
        ),
        Ok(50)
    );
    assert_eq!(
        scan_with(
            &fields,
            br#"{"usage":{"total_tokens":50,"total_tokens":5}}"#,
            false
        ),
        Ok(50)
    );
    assert_eq!(
        scan_with(
            &fields,
            br#"{"usage":{"total_tokens":50},"usage":{"total_tokens":5}}"#,
            false
        ),
        Ok(50)
    );
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend(br#"{"logprob":NaN,"text":"\ud800","usage":{"total_tokens":42}}"#);
    assert_eq!(scan_with(&fields, &bom, false), Ok(42));
    // Not a usage: the estimate stands.
    for odd in [
        "-1",
        "1.5",
        "NaN",
        "Infinity",
        "18446744073709551616",
        "1e400",
        "\"7\"",
    ] {
        let body = format!(r#"{{"usage":{{"total_tokens":{odd}}}}}"#);
        assert_eq!(
            scan_with(&fields, body.as_bytes(), false),
            Err(Unread::NoUsage),
            "{odd}"
        );
        let dup = format!(r#"{{"usage":{{"total_tokens":9,"total_tokens":{odd}}}}}"#);
        assert_eq!(
            scan_with(&fields, dup.as_bytes(), false),
            Err(Unread::NoUsage),
            "{dup}"
        );
    }
    // In a stream, a later event's bad value is not replaced by an earlier, lower count.
    let stream =
        b"data: {\"usage\":{\"total_tokens\":5}}\n\ndata: {\"usage\":{\"total_tokens\":-1}}\n\n";
    assert_eq!(scan_with(&fields, stream, true), Err(Unread::NoUsage));
    // A later null is no count: the earlier one stands (OpenAI's `"usage": null` chunks).
    let stream = b"data: {\"usage\":{\"total_tokens\":5}}\n\ndata: {\"usage\":null}\n\n";
    assert_eq!(scan_with(&fields, stream, true), Ok(5));
}

#[test]
fn weights_and_optional_terms_parse_with_errors_that_say_what_is_wrong() {
    let field = UsageField::parse(" 0.10*usage.a ? + usage.b + 2*usage.c+1.000*usage.d").unwrap();
    assert_eq!(field.text(), "0.1*usage.a?+usage.b+2*usage.c+usage.d");
    assert_eq!(field.terms(), 4);
    assert_eq!(field.plain_path(), Err("is a sum of paths"));
    assert_eq!(
        UsageField::parse("2*max_tokens").unwrap().plain_path(),
        Err("is weighted")
    );
    assert_eq!(
        UsageField::parse("max_tokens").unwrap().plain_path(),
        Ok(&["max_tokens".to_string()][..])
    );
    for (text, error) in [
        ("x*usage.a", "\"x*usage.a\": the weight \"x\" is not a decimal number (e.g. 0.1 or 1.25)"),
        ("1.*usage.a", "\"1.*usage.a\": the weight \"1.\" is not a decimal number (e.g. 0.1 or 1.25)"),
        ("*usage.a", "\"*usage.a\": the weight \"\" is not a decimal number (e.g. 0.1 or 1.25)"),
        ("0*usage.a", "\"0*usage.a\": the weight 0 is out of range: expected 0.001 to 1000"),
        ("1000.001*usage.a", "\"1000.001*usage.a\": the weight 1000.001 is out of range: expected 0.001 to 1000"),
        ("99999999999999999999*usage.a", "\"99999999999999999999*usage.a\": the weight 99999999999999999999 is out of range: expected 0.001 to 1000"),
        ("0.0001*usage.a", "\"0.0001*usage.a\": the weight 0.0001 has more than 3 decimals"),
        ("usage.a?", "\"usage.a?\": every term is optional; a field needs one without \"?\" (else a body without any of its paths would read 0)"),
        ("2*usage.a*b", "\"2*usage.a*b\" has more than one weight (\"*\")"),
        ("usage.a?.b", "\"usage.a?.b\": \"?\" goes at the end of a term (an optional term)"),
        ("usage.a?+usage.b?", "\"usage.a?+usage.b?\": every term is optional; a field needs one without \"?\" (else a body without any of its paths would read 0)"),
        ("0.5*?", "\"0.5*?\" is not a dotted path (empty segment)"),
    ] {
        assert_eq!(UsageField::parse(text).unwrap_err(), error, "{text}");
    }
    assert!(UsageField::parse("1000*usage.a").is_ok());
    assert!(UsageField::parse("0.001*usage.a+usage.b?").is_ok());
}
