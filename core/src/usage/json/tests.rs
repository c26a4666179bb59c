#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use super::*;

fn path(dotted: &str) -> Vec<String> {
    dotted.split('.').map(str::to_string).collect()
}

/// Reads `body` along `paths` (dotted): every hit, or why it was refused.
fn read(body: &[u8], paths: &[&str]) -> Result<Vec<Hit>, Refused> {
    let owned: Vec<Vec<String>> = paths.iter().map(|p| path(p)).collect();
    let slices: Vec<&[String]> = owned.iter().map(Vec::as_slice).collect();
    let text = decode(body)?;
    let mut hits = Vec::new();
    scan(text.as_bytes(), &slices, |hit| hits.push(hit))?;
    Ok(hits)
}

/// The kinds of the values found at `p` in `body`.
fn values(body: &[u8], p: &str) -> Result<Vec<Kind>, Refused> {
    Ok(read(body, &[p])?
        .into_iter()
        .filter_map(|hit| match hit.found {
            Found::Value { kind, .. } => Some(kind),
            _ => None,
        })
        .collect())
}

fn accepted(body: &[u8]) -> bool {
    read(body, &[]).is_ok()
}

fn utf16(text: &str, big: bool, bom: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut units: Vec<u16> = text.encode_utf16().collect();
    if bom {
        units.insert(0, 0xFEFF);
    }
    for unit in units {
        out.extend(if big {
            unit.to_be_bytes()
        } else {
            unit.to_le_bytes()
        });
    }
    out
}

fn utf32(text: &str, big: bool, bom: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut codes: Vec<u32> = text.chars().map(u32::from).collect();
    if bom {
        codes.insert(0, 0xFEFF);
    }
    for code in codes {
        out.extend(if big {
            code.to_be_bytes()
        } else {
            code.to_le_bytes()
        });
    }
    out
}

#[test]
fn plain_json_is_read_with_every_value_at_a_path() {
    let body = br#"{"model":"m","max_tokens":500,"messages":[{"max_tokens":9}]}"#;
    assert_eq!(values(body, "max_tokens"), Ok(vec![Kind::Whole(500)]));
    let body = br#"{"generationConfig":{"temperature":0.5,"maxOutputTokens":64}}"#;
    assert_eq!(
        values(body, "generationConfig.maxOutputTokens"),
        Ok(vec![Kind::Whole(64)])
    );
    assert_eq!(values(b"[1,2]", "max_tokens"), Ok(vec![]));
    assert_eq!(values(b"5", "max_tokens"), Ok(vec![]));
}

#[test]
fn a_bom_and_utf16_and_utf32_are_decoded_as_json_loads_decodes_them() {
    let text = r#"{"prompt":"é😀","max_tokens":100000}"#;
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend(text.as_bytes());
    let mut bodies = vec![bom];
    for big in [false, true] {
        for with_bom in [false, true] {
            bodies.push(utf16(text, big, with_bom));
            bodies.push(utf32(text, big, with_bom));
        }
    }
    for body in &bodies {
        assert_eq!(
            values(body, "max_tokens"),
            Ok(vec![Kind::Whole(100_000)]),
            "{body:?}"
        );
        let decoded = decode(body).unwrap();
        assert_eq!(decoded.as_bytes(), text.as_bytes(), "transcoded to UTF-8");
    }
    assert!(decode(text.as_bytes()).unwrap().is_borrowed());
    // Two BOMs: the second is a character where a value must be.
    let mut twice = b"\xEF\xBB\xBF\xEF\xBB\xBF".to_vec();
    twice.extend(text.as_bytes());
    assert!(!accepted(&twice));
    // Odd UTF-16, a UTF-32 code beyond U+10FFFF, a BOM alone.
    let mut odd = utf16(text, false, false);
    odd.push(0);
    assert_eq!(decode(&odd), Err(Refused::Encoding));
    assert_eq!(
        decode(b"{\x00\x00\x00\x00\x00\x11\x00}\x00\x00\x00"),
        Err(Refused::Encoding)
    );
    assert!(!accepted(b"\xEF\xBB\xBF"));
    assert!(!accepted(b"\xFF\xFE\x00\x00"));
    // Two bytes with a zero: UTF-16 ("1" little-endian).
    assert_eq!(values(b"1\x00", "x"), Ok(vec![]));
    assert!(accepted(b"1\x00"));
}

#[test]
fn invalid_utf8_is_refused_and_encoded_surrogates_pass() {
    for bad in [
        &b"{\"a\":\"\xFF\"}"[..],
        b"{\"a\":\"\xC0\x80\"}",
        b"{\"a\":\"\xF4\x90\x80\x80\"}",
        b"{\"a\":\"\xED\xA0\"}",
        b"\xC3",
    ] {
        assert_eq!(decode(bad), Err(Refused::Encoding), "{bad:?}");
    }
    // `surrogatepass`: a surrogate's three bytes, alone or two in a row (not joined).
    assert!(accepted(b"{\"a\":\"\xED\xA0\x80\"}"));
    assert!(accepted(b"{\"a\":\"\xED\xA0\xBD\xED\xB8\x80\"}"));
    assert!(accepted(b"{\"a\":\"\xED\xBF\xBF\"}"));
}

#[test]
fn lone_surrogates_are_characters() {
    assert!(accepted(br#"{"prompt":"\ud800","max_tokens":5}"#));
    assert!(accepted(br#"{"prompt":"\udc00\ud800x"}"#));
    let mut units: Vec<u16> = r#"{"p":"x","max_tokens":7}"#.encode_utf16().collect();
    units[6] = 0xD800;
    let body: Vec<u8> = units.iter().flat_map(|u| u.to_le_bytes()).collect();
    assert_eq!(values(&body, "max_tokens"), Ok(vec![Kind::Whole(7)]));
    assert_eq!(
        decode(&body).unwrap().as_bytes(),
        b"{\"p\":\"\xED\xA0\x80\",\"max_tokens\":7}"
    );
}

#[test]
fn nan_and_infinity_are_numbers_that_are_not_whole() {
    let body = br#"{"temperature":NaN,"top_p":-Infinity,"x":[Infinity],"max_tokens":9}"#;
    assert_eq!(values(body, "max_tokens"), Ok(vec![Kind::Whole(9)]));
    for bound in ["NaN", "Infinity", "-Infinity"] {
        let body = format!(r#"{{"max_tokens":{bound}}}"#);
        assert_eq!(
            values(body.as_bytes(), "max_tokens"),
            Ok(vec![Kind::Number])
        );
    }
    for bad in ["-NaN", "nan", "inf", "+Infinity", "-Inf", "Infinit"] {
        let body = format!(r#"{{"max_tokens":{bad}}}"#);
        assert!(!accepted(body.as_bytes()), "{bad}");
    }
}

#[test]
fn numbers_are_whole_as_the_estimate_counts_them() {
    let kind = |n: &str| values(format!(r#"{{"n":{n}}}"#).as_bytes(), "n").map(|v| v[0]);
    assert_eq!(kind("0"), Ok(Kind::Whole(0)));
    assert_eq!(kind("-0"), Ok(Kind::Whole(0)));
    assert_eq!(kind("-0.0"), Ok(Kind::Whole(0)));
    assert_eq!(kind("8000.0"), Ok(Kind::Whole(8000)));
    assert_eq!(kind("8e3"), Ok(Kind::Whole(8000)));
    assert_eq!(kind("8.0E+3"), Ok(Kind::Whole(8000)));
    assert_eq!(kind("1e-400"), Ok(Kind::Whole(0)));
    assert_eq!(kind("18446744073709551615"), Ok(Kind::Whole(u64::MAX)));
    for not_whole in [
        "18446744073709551616",
        "99999999999999999999999",
        "18446744073709551616.0",
        "1e400",
        "-1e400",
        "0.5",
        "-1",
        "-8e3",
        "1e300",
    ] {
        assert_eq!(kind(not_whole), Ok(Kind::Number), "{not_whole}");
    }
    for bad in [
        "01", "1.", ".5", "+1", "1e", "1e+", "-", "--1", "0x10", "1_000",
    ] {
        assert!(kind(bad).is_err(), "{bad}");
    }
    // CPython refuses to convert an integer of more than 4,300 digits.
    assert_eq!(kind(&"1".repeat(4_300)), Ok(Kind::Number));
    assert!(kind(&"1".repeat(4_301)).is_err());
    assert_eq!(kind(&format!("-{}", "1".repeat(4_300))), Ok(Kind::Number));
    assert_eq!(kind(&format!("{}.0", "1".repeat(5_000))), Ok(Kind::Number));
}

#[test]
fn escaped_key_names_are_the_keys_they_decode_to() {
    let body = br#"{"max\u005ftokens":5,"\u006dax_tokens":6,"max_tokens\u0000":7}"#;
    assert_eq!(
        values(body, "max_tokens"),
        Ok(vec![Kind::Whole(5), Kind::Whole(6)])
    );
    let body = br#"{"\ud83d\ude00":1,"\ud83d":2,"a\/b":3,"t\tab":4}"#;
    assert_eq!(values(body, "😀"), Ok(vec![Kind::Whole(1)]));
    assert_eq!(values(body, "a/b"), Ok(vec![Kind::Whole(3)]));
    assert_eq!(values(body, "t\tab"), Ok(vec![Kind::Whole(4)]));
    // A raw pair of surrogates is two code points, as in Python: not 😀.
    assert_eq!(
        values(b"{\"\xED\xA0\xBD\xED\xB8\x80\":1}", "😀"),
        Ok(vec![])
    );
}

#[test]
fn duplicate_keys_report_every_value_and_every_reader_that_finds_none() {
    let body = br#"{"max_tokens":1,"x":2,"max_tokens":100000}"#;
    assert_eq!(
        values(body, "max_tokens"),
        Ok(vec![Kind::Whole(1), Kind::Whole(100_000)])
    );
    let body =
        br#"{"generationConfig":{"maxOutputTokens":9},"generationConfig":{"maxOutputTokens":900}}"#;
    assert_eq!(
        values(body, "generationConfig.maxOutputTokens"),
        Ok(vec![Kind::Whole(9), Kind::Whole(900)])
    );
    // A duplicate parent without the key, or null, or not an object.
    let body = br#"{"g":{"m":9},"g":{"t":1},"g":null,"g":"x"}"#;
    let hits = read(body, &["g.m"]).unwrap();
    let found: Vec<_> = hits.into_iter().map(|h| h.found).collect();
    assert!(matches!(
        found[0],
        Found::Value {
            kind: Kind::Whole(9),
            ..
        }
    ));
    assert!(matches!(found[1], Found::Missing { depth: 1, .. }));
    assert!(matches!(
        found[2],
        Found::NotObject {
            depth: 1,
            kind: Kind::Null,
            ..
        }
    ));
    assert!(matches!(
        found[3],
        Found::NotObject {
            depth: 1,
            kind: Kind::String,
            ..
        }
    ));
    assert_eq!(found.len(), 4);
    // The root without the key: missing at depth 0.
    let hits = read(br#"{"a":1}"#, &["max_tokens"]).unwrap();
    assert!(matches!(
        hits[0].found,
        Found::Missing {
            depth: 0,
            object: ObjectSpan {
                open: 0,
                close: 6,
                empty: false
            }
        }
    ));
}

#[test]
fn spans_locate_values_members_and_objects() {
    let body = br#"{ "a" : 1 , "max_tokens" : 22 , "max_tokens":3 }"#;
    let hits = read(body, &["max_tokens"]).unwrap();
    let Found::Value {
        span,
        member,
        object,
        ..
    } = &hits[1].found
    else {
        panic!("{hits:?}");
    };
    assert_eq!(&body[span.clone()], b"3");
    assert_eq!(&body[member.clone()], br#" , "max_tokens":3"#);
    assert_eq!(*object, 0);
    let Found::Value { span, .. } = &hits[0].found else {
        panic!("{hits:?}");
    };
    assert_eq!(&body[span.clone()], b"22");
    let hits = read(br#"{"g":{ }}"#, &["g.m"]).unwrap();
    assert_eq!(
        hits[0].found,
        Found::Missing {
            depth: 1,
            object: ObjectSpan {
                open: 5,
                close: 7,
                empty: true
            }
        }
    );
}

#[test]
fn nesting_past_the_bound_is_refused_without_recursing_further() {
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert!(accepted(deep(MAX_DEPTH).as_bytes()));
    assert_eq!(
        read(deep(MAX_DEPTH + 1).as_bytes(), &[]),
        Err(Refused::TooDeep)
    );
    // Far past it: refused at the bound, whatever follows.
    assert_eq!(read(&vec![b'['; 1 << 20], &[]), Err(Refused::TooDeep));
    let objects = format!(
        "{}1{}",
        r#"{"a":"#.repeat(MAX_DEPTH + 1),
        "}".repeat(MAX_DEPTH + 1)
    );
    assert_eq!(read(objects.as_bytes(), &["a"]), Err(Refused::TooDeep));
}

#[test]
fn python_strictness_about_strings_whitespace_and_the_rest() {
    for bad in [
        &b"{\"a\":\"\x1f\"}"[..],
        b"{\"a\":\"line\nbreak\"}",
        b"{\"a\":\"\\x41\"}",
        b"{\"a\":\"\\u00\"}",
        b"{\"a\":\"\\ud800\\uZZZZ\"}",
        b"{\"a\":\"\\U0041\"}",
        b"{\"a\":1,}",
        b"[1,]",
        b"{'a':1}",
        b"{\"a\":1}\x00",
        b"\x0c{}",
        b"{\"a\":\xC2\xA01}",
        b"{\"a\" 1}",
        b"{\"a\":tru}",
        b"",
        b"   ",
        b"{\"a\":1",
        b"{\"a\":\"x",
        b"{\"a\":1}{}",
    ] {
        assert!(!accepted(bad), "{bad:?}");
    }
    for good in [
        &b"{\"a\":\"\x7f\"}"[..],
        b" \t\r\n{ \"a\" : [ 1 , { } , [ ] ] } \r\n",
        b"{\"a\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\"}",
        b"\"\\ud800\\ud800\"",
        b"{}",
        b"[]",
        b"null",
    ] {
        assert!(accepted(good), "{good:?}");
    }
}

#[test]
fn truncated_bodies_are_refused_at_every_cut() {
    let body = br#"{"model":"m","max_tokens":1000,"messages":[{"role":"user","content":"hi \u00e9"}],"t":NaN}"#;
    assert!(accepted(body));
    for cut in 0..body.len() {
        assert!(!accepted(&body[..cut]), "cut at {cut}");
    }
}

#[test]
fn huge_strings_are_read_in_one_pass() {
    let mut body = br#"{"prompt":""#.to_vec();
    body.extend(std::iter::repeat_n(b'x', 4 << 20));
    body.extend(br#"","max_tokens":12}"#);
    assert_eq!(values(&body, "max_tokens"), Ok(vec![Kind::Whole(12)]));
}

#[test]
fn more_paths_than_bits_are_refused_not_ignored() {
    let owned: Vec<Vec<String>> = (0..=MAX_PATHS).map(|i| vec![i.to_string()]).collect();
    let slices: Vec<&[String]> = owned.iter().map(Vec::as_slice).collect();
    assert_eq!(scan(b"{}", &slices, |_| {}), Err(Refused::TooManyPaths));
    assert_eq!(scan(b"{}", &slices[..MAX_PATHS], |_| {}), Ok(Kind::Object));
}
