//! Reading JSON bodies as the upstreams behind weir read them.
//!
//! What a request costs is read from its body, and what an upstream reads from the same
//! bytes is what it generates: if weir refused a body its upstream accepts, or read
//! another number from it, a client could pick the bytes that make its request cheap.
//! Many LLM servers (FastAPI, vLLM, SGLang) read a body with Python's
//! `json.loads(bytes)`, the most lenient reader in common use, so this module reads
//! exactly what it reads, and reports every value where other parsers may disagree.
//!
//! # Vocabulary
//! - **Text**: a body decoded as `json.loads` decodes bytes (CPython's
//!   `json.detect_encoding`): UTF-8 with or without a byte-order mark, UTF-16 or UTF-32
//!   (by their BOM, or by where the zero bytes of the first four are), all with
//!   `surrogatepass`, so a lone surrogate is a character. A text is kept as UTF-8 in
//!   which a surrogate is encoded like any other code point (three bytes, `ED A0 80` for
//!   U+D800), so a UTF-8 body is its own text, BOM aside, and is not copied.
//! - **Accepted**: what `json.loads` accepts: JSON, plus `NaN`, `Infinity` and
//!   `-Infinity`, lone surrogates raw or escaped (`"\ud800"`); whitespace is only space,
//!   tab, LF and CR; a control character inside a string is refused (CPython's `strict`).
//!   Anything else is [`Refused`], and so is a body nested deeper than [`MAX_DEPTH`] (the
//!   reader recurses once per level; Python refuses at about 1,000) and an integer of
//!   more than 4,300 digits (CPython refuses to convert it).
//! - **Path**: object keys from the root, `["generationConfig", "maxOutputTokens"]`. A key
//!   matches a segment when it decodes to it: `"max\u005ftokens"` is `max_tokens`, and
//!   `"\ud83d\ude00"` is 😀 (an escaped surrogate pair joins, as in Python). Arrays end a
//!   path.
//! - **Duplicate keys**: an object may name a key twice. Python and serde keep the last,
//!   RapidJSON's `FindMember` and several Go and C++ parsers the first. So the reader
//!   does not pick: it reports a [`Hit`] for **every** value found at a path, through
//!   every duplicate of every parent object, and every place where some parser finds
//!   nothing (a duplicate parent without the key, one that is `null` or not an object).
//! - **Whole number**: an integer ≥ 0 below 2^64, or a number whose value is one (`8000.0`,
//!   `8e3`, `-0`); fractions, negatives, 2^64 and more, `1e400`, `NaN` and the
//!   infinities are not ([`Kind::Number`]).
//!
//! Nothing is allocated but the text of a UTF-16 or UTF-32 body; hits come through a
//! callback, with byte ranges in the text so that a caller can rewrite a value in place.
//!
//! ```
//! use weir_core::usage::json::{decode, scan, Found, Kind};
//!
//! // A BOM, a NaN elsewhere, an escaped key and a duplicate: one reader sees 100, another 1.
//! let body = b"\xEF\xBB\xBF{\"t\":NaN,\"max\\u005ftokens\":1,\"max_tokens\":100}";
//! let text = decode(body).unwrap();
//! let path = ["max_tokens".to_string()];
//! let mut seen = Vec::new();
//! let root = scan(text.as_bytes(), &[&path[..]], |hit| {
//!     if let Found::Value { kind, .. } = hit.found {
//!         seen.push(kind);
//!     }
//! });
//! assert_eq!(root, Ok(Kind::Object));
//! assert_eq!(seen, [Kind::Whole(1), Kind::Whole(100)]);
//! ```

use std::borrow::Cow;
use std::ops::Range;

/// The deepest nesting of arrays and objects read: a body nested deeper is refused. The
/// reader recurses once per level, so this bounds its stack inside the VM (a stack
/// overflow there kills every request of the worker).
pub const MAX_DEPTH: usize = 128;

/// The most paths one scan follows (a bit each).
pub const MAX_PATHS: usize = 128;

/// CPython refuses to convert an integer literal of more digits (`int_max_str_digits`,
/// 4,300 by default since 3.11), so `json.loads` refuses the body.
const MAX_INTEGER_DIGITS: usize = 4_300;

/// Why a body is not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Not text in the encoding `json.loads` detects: invalid UTF-8 (a surrogate aside),
    /// an odd number of UTF-16 bytes, a UTF-32 code beyond U+10FFFF.
    Encoding,
    /// Not JSON as `json.loads` reads it, at this byte of the text.
    Syntax { at: usize },
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// More than [`MAX_PATHS`] paths asked for.
    TooManyPaths,
}

/// A body decoded (see the module docs): UTF-8 whose surrogates are code points too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text<'b>(Cow<'b, [u8]>);

impl Text<'_> {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Whether the text is the body's own bytes (a UTF-8 body, BOM aside).
    pub fn is_borrowed(&self) -> bool {
        matches!(self.0, Cow::Borrowed(_))
    }
}

/// What a value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Null,
    Bool,
    /// A whole number (see the module docs).
    Whole(u64),
    /// Any other number: a fraction, a negative number, one of 2^64 or more, `NaN`,
    /// `Infinity`, `-Infinity`.
    Number,
    String,
    Array,
    Object,
}

/// An object, by the bytes of its braces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectSpan {
    /// Where its `{` is.
    pub open: usize,
    /// Where its `}` is.
    pub close: usize,
    /// It has no member.
    pub empty: bool,
}

/// Something found while following a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A value at the path's end.
    Value {
        kind: Kind,
        /// The value's bytes.
        span: Range<usize>,
        /// The member without what comes before it in its object: from the end of the
        /// previous member's value (or the `{`) to the end of this value. Removing it
        /// leaves valid JSON when the member is not the object's first.
        member: Range<usize>,
        /// Where the object holding it opens: values of one object share it.
        object: usize,
    },
    /// An object that the path's first `depth` segments lead to (0: the root) and that
    /// has no member named the next one.
    Missing { depth: usize, object: ObjectSpan },
    /// A value that the path's first `depth` segments lead to (`1 ≤ depth <` the path's
    /// length), where an object was expected: `null`, or anything else.
    NotObject {
        depth: usize,
        kind: Kind,
        span: Range<usize>,
    },
}

/// One path's find: `path` indexes the paths given to [`scan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub path: usize,
    pub found: Found,
}

/// `bytes` as `json.loads(bytes)` decodes them, or why not.
pub fn decode(bytes: &[u8]) -> Result<Text<'_>, Refused> {
    match detect(bytes) {
        Encoding::Utf8 { bom } => {
            let text = bytes.get(bom..).unwrap_or_default();
            check_utf8(text)?;
            Ok(Text(Cow::Borrowed(text)))
        }
        Encoding::Utf16 { big, bom } => utf16(bytes.get(bom..).unwrap_or_default(), big),
        Encoding::Utf32 { big, bom } => utf32(bytes.get(bom..).unwrap_or_default(), big),
    }
}

/// Reads `text` whole, reporting to `visit` what it finds along `paths`; returns what the
/// root is. On `Err`, what was reported belongs to a body no one reads: drop it.
pub fn scan<F: FnMut(Hit)>(text: &[u8], paths: &[&[String]], visit: F) -> Result<Kind, Refused> {
    if paths.len() > MAX_PATHS {
        return Err(Refused::TooManyPaths);
    }
    let mut scanner = Scanner {
        text,
        at: 0,
        paths,
        visit,
    };
    let all = paths
        .iter()
        .enumerate()
        .filter(|(_, path)| !path.is_empty())
        .fold(0u128, |set, (i, _)| set | 1u128 << i);
    scanner.whitespace();
    let root = scanner.value(0, all, 0)?;
    scanner.whitespace();
    if scanner.at != text.len() {
        return Err(scanner.refuse());
    }
    Ok(root)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Utf8 { bom: usize },
    Utf16 { big: bool, bom: usize },
    Utf32 { big: bool, bom: usize },
}

/// CPython's `json.detect_encoding`, case by case: a BOM (UTF-32's first, since its
/// little-endian one starts with UTF-16's), else the zero bytes of the first four (of the
/// first two, for a body of two bytes), else UTF-8.
fn detect(b: &[u8]) -> Encoding {
    match b {
        [0, 0, 0xFE, 0xFF, ..] => Encoding::Utf32 { big: true, bom: 4 },
        [0xFF, 0xFE, 0, 0, ..] => Encoding::Utf32 { big: false, bom: 4 },
        [0xFE, 0xFF, ..] => Encoding::Utf16 { big: true, bom: 2 },
        [0xFF, 0xFE, ..] => Encoding::Utf16 { big: false, bom: 2 },
        [0xEF, 0xBB, 0xBF, ..] => Encoding::Utf8 { bom: 3 },
        [0, 0, _, _, ..] => Encoding::Utf32 { big: true, bom: 0 },
        [0, _, _, _, ..] => Encoding::Utf16 { big: true, bom: 0 },
        [_, 0, 0, 0, ..] => Encoding::Utf32 { big: false, bom: 0 },
        [_, 0, _, _, ..] => Encoding::Utf16 { big: false, bom: 0 },
        [0, _] => Encoding::Utf16 { big: true, bom: 0 },
        [_, 0] => Encoding::Utf16 { big: false, bom: 0 },
        _ => Encoding::Utf8 { bom: 0 },
    }
}

/// UTF-8, where `surrogatepass` also lets a surrogate's three bytes through.
fn check_utf8(mut rest: &[u8]) -> Result<(), Refused> {
    loop {
        match std::str::from_utf8(rest) {
            Ok(_) => return Ok(()),
            Err(e) => {
                let bad = rest.get(e.valid_up_to()..).unwrap_or_default();
                match bad {
                    [0xED, 0xA0..=0xBF, 0x80..=0xBF, after @ ..] => rest = after,
                    _ => return Err(Refused::Encoding),
                }
            }
        }
    }
}

/// Appends `code` (up to U+10FFFF, surrogates included) to `out` as UTF-8.
fn push_code(out: &mut Vec<u8>, code: u32) {
    // The casts keep the low bits on purpose: each byte is masked first.
    match code {
        0..=0x7F => out.push(code as u8),
        0x80..=0x7FF => out.extend([0xC0 | (code >> 6) as u8, 0x80 | (code & 0x3F) as u8]),
        0x800..=0xFFFF => out.extend([
            0xE0 | (code >> 12) as u8,
            0x80 | ((code >> 6) & 0x3F) as u8,
            0x80 | (code & 0x3F) as u8,
        ]),
        _ => out.extend([
            0xF0 | (code >> 18) as u8,
            0x80 | ((code >> 12) & 0x3F) as u8,
            0x80 | ((code >> 6) & 0x3F) as u8,
            0x80 | (code & 0x3F) as u8,
        ]),
    }
}

fn utf16(bytes: &[u8], big: bool) -> Result<Text<'static>, Refused> {
    if !bytes.len().is_multiple_of(2) {
        return Err(Refused::Encoding);
    }
    let mut units = bytes.chunks_exact(2).map(|pair| match pair {
        [a, b] if big => u16::from_be_bytes([*a, *b]),
        [a, b] => u16::from_le_bytes([*a, *b]),
        _ => 0,
    });
    let mut out = Vec::with_capacity(bytes.len());
    let mut pending: Option<u16> = None;
    while let Some(unit) = pending.take().or_else(|| units.next()) {
        if (0xD800..0xDC00).contains(&unit) {
            match units.next() {
                Some(low @ 0xDC00..=0xDFFF) => {
                    let code =
                        0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                    push_code(&mut out, code);
                    continue;
                }
                next => pending = next,
            }
        }
        // A lone surrogate is a character, as `surrogatepass` makes it.
        push_code(&mut out, u32::from(unit));
    }
    Ok(Text(Cow::Owned(out)))
}

fn utf32(bytes: &[u8], big: bool) -> Result<Text<'static>, Refused> {
    if !bytes.len().is_multiple_of(4) {
        return Err(Refused::Encoding);
    }
    let mut out = Vec::with_capacity(bytes.len() / 2);
    for unit in bytes.chunks_exact(4) {
        let quad = [
            *unit.first().unwrap_or(&0),
            *unit.get(1).unwrap_or(&0),
            *unit.get(2).unwrap_or(&0),
            *unit.get(3).unwrap_or(&0),
        ];
        let code = if big {
            u32::from_be_bytes(quad)
        } else {
            u32::from_le_bytes(quad)
        };
        if code > 0x10FFFF {
            return Err(Refused::Encoding);
        }
        push_code(&mut out, code);
    }
    Ok(Text(Cow::Owned(out)))
}

/// The bits of `set`, lowest first.
fn bits(mut set: u128) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if set == 0 {
            return None;
        }
        let bit = set.trailing_zeros() as usize;
        set &= set - 1;
        Some(bit)
    })
}

struct Scanner<'t, 'p, F> {
    text: &'t [u8],
    at: usize,
    paths: &'p [&'p [String]],
    visit: F,
}

impl<F: FnMut(Hit)> Scanner<'_, '_, F> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn refuse(&self) -> Refused {
        Refused::Syntax { at: self.at }
    }

    /// Python's JSON whitespace: `[ \t\n\r]*`, nothing else (no form feed, no NBSP).
    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Result<(), Refused> {
        if self.peek() != Some(byte) {
            return Err(self.refuse());
        }
        self.at += 1;
        Ok(())
    }

    fn literal(&mut self, word: &[u8], kind: Kind) -> Result<Kind, Refused> {
        if !self
            .text
            .get(self.at..)
            .unwrap_or_default()
            .starts_with(word)
        {
            return Err(self.refuse());
        }
        self.at += word.len();
        Ok(kind)
    }

    /// One value at nesting `depth`; `through` are the paths it lies on, each having
    /// used its first `level` segments, and going on past it.
    fn value(&mut self, depth: usize, through: u128, level: usize) -> Result<Kind, Refused> {
        let start = self.at;
        let kind = match self.peek() {
            Some(b'{') => return self.object(depth + 1, through, level),
            Some(b'[') => self.array(depth + 1)?,
            Some(b'"') => {
                self.string()?;
                Kind::String
            }
            Some(b'n') => self.literal(b"null", Kind::Null)?,
            Some(b't') => self.literal(b"true", Kind::Bool)?,
            Some(b'f') => self.literal(b"false", Kind::Bool)?,
            Some(b'N') => self.literal(b"NaN", Kind::Number)?,
            Some(b'I') => self.literal(b"Infinity", Kind::Number)?,
            Some(b'-') if self.text.get(self.at + 1) == Some(&b'I') => {
                self.literal(b"-Infinity", Kind::Number)?
            }
            Some(b'-' | b'0'..=b'9') => self.number()?,
            _ => return Err(self.refuse()),
        };
        // The root is no place on a path: a body that is not an object has none of them.
        if level > 0 {
            for path in bits(through) {
                (self.visit)(Hit {
                    path,
                    found: Found::NotObject {
                        depth: level,
                        kind,
                        span: start..self.at,
                    },
                });
            }
        }
        Ok(kind)
    }

    fn array(&mut self, depth: usize) -> Result<Kind, Refused> {
        if depth > MAX_DEPTH {
            return Err(Refused::TooDeep);
        }
        self.at += 1;
        self.whitespace();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Kind::Array);
        }
        loop {
            self.whitespace();
            self.value(depth, 0, 0)?;
            self.whitespace();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Kind::Array);
                }
                _ => return Err(self.refuse()),
            }
        }
    }

    /// An object on the paths `on` (each having used its first `level` segments).
    fn object(&mut self, depth: usize, on: u128, level: usize) -> Result<Kind, Refused> {
        if depth > MAX_DEPTH {
            return Err(Refused::TooDeep);
        }
        let open = self.at;
        self.at += 1;
        let mut previous_end = self.at;
        let mut seen = 0u128;
        self.whitespace();
        let empty = self.peek() == Some(b'}');
        if !empty {
            loop {
                self.whitespace();
                if self.peek() != Some(b'"') {
                    return Err(self.refuse());
                }
                let key = self.string()?;
                self.whitespace();
                self.expect(b':')?;
                self.whitespace();
                let here = bits(on)
                    .filter(|&i| self.key_is(&key, i, level))
                    .fold(0u128, |set, i| set | 1u128 << i);
                seen |= here;
                let ends = bits(here)
                    .filter(|&i| self.paths.get(i).is_some_and(|p| p.len() == level + 1))
                    .fold(0u128, |set, i| set | 1u128 << i);
                let start = self.at;
                let kind = self.value(depth, here & !ends, level + 1)?;
                for path in bits(ends) {
                    (self.visit)(Hit {
                        path,
                        found: Found::Value {
                            kind,
                            span: start..self.at,
                            member: previous_end..self.at,
                            object: open,
                        },
                    });
                }
                previous_end = self.at;
                self.whitespace();
                match self.peek() {
                    Some(b',') => self.at += 1,
                    Some(b'}') => break,
                    _ => return Err(self.refuse()),
                }
            }
        }
        let object = ObjectSpan {
            open,
            close: self.at,
            empty,
        };
        self.at += 1;
        for path in bits(on & !seen) {
            (self.visit)(Hit {
                path,
                found: Found::Missing {
                    depth: level,
                    object,
                },
            });
        }
        Ok(Kind::Object)
    }

    /// Whether the key whose string is `key` is segment `level` of path `path`.
    fn key_is(&self, key: &Range<usize>, path: usize, level: usize) -> bool {
        let Some(segment) = self.paths.get(path).and_then(|p| p.get(level)) else {
            return false;
        };
        let Some(raw) = self.text.get(key.clone()) else {
            return false;
        };
        if !raw.contains(&b'\\') {
            return raw == segment.as_bytes();
        }
        CodePoints { raw, at: 0 }.eq(segment.chars().map(u32::from))
    }

    /// A string (the reader is on its `"`); returns the range of what is between the
    /// quotes.
    fn string(&mut self) -> Result<Range<usize>, Refused> {
        self.at += 1;
        let start = self.at;
        loop {
            match self.peek() {
                Some(b'"') => {
                    let inside = start..self.at;
                    self.at += 1;
                    return Ok(inside);
                }
                Some(b'\\') => {
                    self.at += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                            self.at += 1
                        }
                        Some(b'u') => {
                            self.at += 1;
                            let digits = self.text.get(self.at..self.at + 4);
                            if !digits.is_some_and(|d| d.iter().all(u8::is_ascii_hexdigit)) {
                                return Err(self.refuse());
                            }
                            self.at += 4;
                        }
                        _ => return Err(self.refuse()),
                    }
                }
                // Python's strict mode: no control character in a string.
                Some(0..=0x1F) | None => return Err(self.refuse()),
                Some(_) => self.at += 1,
            }
        }
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?`, as Python's scanner matches it
    /// (ASCII digits only).
    fn number(&mut self) -> Result<Kind, Refused> {
        let start = self.at;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.at += 1;
        }
        let int_start = self.at;
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.refuse()),
        }
        let int_end = self.at;
        let mut float = false;
        if self.peek() == Some(b'.') && self.text.get(self.at + 1).is_some_and(u8::is_ascii_digit) {
            self.at += 1;
            self.digits();
            float = true;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            let mut after = self.at + 1;
            if matches!(self.text.get(after), Some(b'+' | b'-')) {
                after += 1;
            }
            // Without digits the `e` is not part of the number (and then refused after it).
            if self.text.get(after).is_some_and(u8::is_ascii_digit) {
                self.at = after;
                self.digits();
                float = true;
            }
        }
        let digits = self.text.get(int_start..int_end).unwrap_or_default();
        if float {
            let literal = self.text.get(start..self.at).unwrap_or_default();
            return Ok(std::str::from_utf8(literal)
                .ok()
                .and_then(|s| s.parse::<f64>().ok())
                .map_or(Kind::Number, whole_float));
        }
        if digits.len() > MAX_INTEGER_DIGITS {
            return Err(Refused::Syntax { at: start });
        }
        if negative {
            // `-0` is 0; any other negative integer is not a count.
            return Ok(if digits == b"0" {
                Kind::Whole(0)
            } else {
                Kind::Number
            });
        }
        let value = digits.iter().try_fold(0u64, |n, d| {
            n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
        });
        Ok(value.map_or(Kind::Number, Kind::Whole))
    }

    fn digits(&mut self) {
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
    }
}

/// A float written with a fraction or an exponent, as Python's `float()` rounds it: whole
/// when its value is an integer from 0 (`-0.0` included) to below 2^64.
fn whole_float(f: f64) -> Kind {
    // 2^64 as a float: every whole f64 below it converts exactly.
    let beyond = 18_446_744_073_709_551_616.0_f64;
    if f.fract() == 0.0 && (0.0..beyond).contains(&f) {
        Kind::Whole(f as u64)
    } else {
        Kind::Number
    }
}

/// The code points of a string's content as Python decodes it: escapes resolved, an
/// escaped surrogate pair joined, and a raw surrogate (from `surrogatepass`) a code point
/// of its own. The content was checked by [`Scanner::string`]; anything else ends it.
struct CodePoints<'r> {
    raw: &'r [u8],
    at: usize,
}

impl CodePoints<'_> {
    fn hex4(&self, at: usize) -> Option<u32> {
        let digits = self.raw.get(at..at + 4)?;
        u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()
    }
}

impl Iterator for CodePoints<'_> {
    type Item = u32;

    fn next(&mut self) -> Option<u32> {
        let lead = *self.raw.get(self.at)?;
        if lead == b'\\' {
            let escaped = *self.raw.get(self.at + 1)?;
            self.at += 2;
            let simple = match escaped {
                b'"' => '"',
                b'\\' => '\\',
                b'/' => '/',
                b'b' => '\u{8}',
                b'f' => '\u{c}',
                b'n' => '\n',
                b'r' => '\r',
                b't' => '\t',
                b'u' => {
                    let code = self.hex4(self.at)?;
                    self.at += 4;
                    if (0xD800..0xDC00).contains(&code)
                        && self.raw.get(self.at..self.at + 2) == Some(b"\\u")
                    {
                        if let Some(low @ 0xDC00..=0xDFFF) = self.hex4(self.at + 2) {
                            self.at += 6;
                            return Some(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00));
                        }
                    }
                    return Some(code);
                }
                _ => return None,
            };
            return Some(u32::from(simple));
        }
        let (len, bits) = match lead {
            0x00..=0x7F => (1, u32::from(lead)),
            0xC0..=0xDF => (2, u32::from(lead & 0x1F)),
            0xE0..=0xEF => (3, u32::from(lead & 0x0F)),
            _ => (4, u32::from(lead & 0x07)),
        };
        let tail = self.raw.get(self.at + 1..self.at + len)?;
        self.at += len;
        Some(
            tail.iter()
                .fold(bits, |code, b| (code << 6) | u32::from(b & 0x3F)),
        )
    }
}

#[cfg(test)]
mod tests;
