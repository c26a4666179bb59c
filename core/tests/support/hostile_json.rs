//! Hostile JSON bodies: what a client that wants its request to look cheap may send, for
//! tests that judge weir's body reading against real parsers (CONFORMANCE.md, "The
//! generator plays hostile clients").
//!
//! - [`hostile_body`]`(rng, fields)` draws one body that sets some of `fields` (dotted
//!   paths, e.g. `"generationConfig.maxOutputTokens"`), mixing plain JSON with every
//!   trick of [`Trick`]; it returns the bytes and the tricks it used.
//! - [`Trick`] names each trick; [`Trick::ALL`] lists them, for reports.
//!
//! The generator knows nothing of what a parser reads from its bodies: judge them with
//! a reference parser. Self-contained (it needs only [`Rng`]), so any test can use it.
#![allow(dead_code)]

use super::Rng;

/// One way to make a body hard to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Trick {
    /// A UTF-8 byte-order mark (sometimes two).
    Bom,
    /// UTF-16, little- or big-endian, with or without its BOM.
    Utf16,
    /// UTF-32, little- or big-endian, with or without its BOM.
    Utf32,
    /// `NaN`, `Infinity` or `-Infinity` in a field that is not a bound.
    NanElsewhere,
    /// `NaN`, `Infinity` or `-Infinity` as a bound.
    NanInBound,
    /// A lone surrogate in a string: escaped (`"\ud800"`) or raw.
    LoneSurrogate,
    /// A bound named twice in one object, the small one first or last.
    DuplicateKey,
    /// A bound's parent object named twice: with the bound or without, `null`, or not an
    /// object.
    DuplicateParent,
    /// A key written with escapes (`"max\u005ftokens"`), or a near miss of a bound's name.
    EscapedName,
    /// A bound written `8e3`, `8000.0`, `-0`, as a fraction, a negative number, beyond
    /// 2^64, or `1e400`.
    NumberSyntax,
    /// A bound that is a string, `true`, `null`, an object or an array.
    OddValue,
    /// Arrays and objects nested 100 to 1,100 deep.
    Deep,
    /// A string of tens of KiB.
    HugeString,
    /// An integer of more than 4,300 digits elsewhere (CPython refuses to convert it).
    LongInteger,
    /// Whitespace other than space, tab, LF and CR between tokens (form feed, NBSP), or
    /// plenty of the valid kind.
    OddWhitespace,
    /// A raw control character in a string (or DEL, which is allowed).
    ControlChar,
    /// Cut short.
    Truncated,
    /// A byte that is not UTF-8.
    InvalidUtf8,
    /// A trailing comma, or more after the document.
    TrailingGarbage,
    /// No bytes at all.
    Empty,
    /// A form-encoded body.
    NotJson,
    /// The document is not an object.
    NotAnObject,
}

impl Trick {
    pub const ALL: [Trick; 22] = [
        Trick::Bom,
        Trick::Utf16,
        Trick::Utf32,
        Trick::NanElsewhere,
        Trick::NanInBound,
        Trick::LoneSurrogate,
        Trick::DuplicateKey,
        Trick::DuplicateParent,
        Trick::EscapedName,
        Trick::NumberSyntax,
        Trick::OddValue,
        Trick::Deep,
        Trick::HugeString,
        Trick::LongInteger,
        Trick::OddWhitespace,
        Trick::ControlChar,
        Trick::Truncated,
        Trick::InvalidUtf8,
        Trick::TrailingGarbage,
        Trick::Empty,
        Trick::NotJson,
        Trick::NotAnObject,
    ];
}

/// A body and how it was made.
#[derive(Debug, Clone)]
pub struct HostileBody {
    pub bytes: Vec<u8>,
    /// The tricks used, each once, in [`Trick::ALL`]'s order; empty for plain JSON.
    pub tricks: Vec<Trick>,
}

impl HostileBody {
    pub fn has(&self, trick: Trick) -> bool {
        self.tricks.contains(&trick)
    }
}

/// One body that sets some of the bound `fields` (dotted paths), plain JSON about a third
/// of the time, otherwise with one to four tricks.
pub fn hostile_body(rng: &mut Rng, fields: &[&str]) -> HostileBody {
    let mut g = Gen {
        rng,
        tricks: Vec::new(),
        plain: false,
        odd_space: false,
    };
    g.plain = g.one_in(3);
    g.odd_space = g.play(Trick::OddWhitespace, 25);
    let bytes = g.body(fields);
    let mut tricks = g.tricks;
    tricks.sort();
    tricks.dedup();
    HostileBody { bytes, tricks }
}

/// A JSON value as written: keys and string contents are the raw text between the
/// quotes, as code points (a lone surrogate may be one of them).
enum Node {
    /// A literal written as is: a number, `null`, `NaN`...
    Lit(String),
    Str(Vec<u32>),
    Arr(Vec<Node>),
    Obj(Vec<(Vec<u32>, Node)>),
}

fn text(s: &str) -> Vec<u32> {
    s.chars().map(u32::from).collect()
}

struct Gen<'r> {
    rng: &'r mut Rng,
    tricks: Vec<Trick>,
    /// Plain JSON: no trick at all.
    plain: bool,
    /// Whitespace JSON does not allow is still to be put somewhere.
    odd_space: bool,
}

impl Gen<'_> {
    fn one_in(&mut self, n: u64) -> bool {
        self.rng.below(n) == 0
    }

    /// Whether to play `trick` now, one time in `n` (never in a plain body).
    fn play(&mut self, trick: Trick, n: u64) -> bool {
        if self.plain || !self.one_in(n) {
            return false;
        }
        self.tricks.push(trick);
        true
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.rng.below(items.len() as u64) as usize]
    }

    fn body(&mut self, fields: &[&str]) -> Vec<u8> {
        if self.play(Trick::Empty, 60) {
            return Vec::new();
        }
        if self.play(Trick::NotJson, 60) {
            return format!(
                "max_tokens={}&prompt=hello&model=m",
                self.rng.below(200_000)
            )
            .into_bytes();
        }
        let mut root = self.document(fields);
        if self.play(Trick::NotAnObject, 40) {
            root = if self.one_in(2) {
                Node::Arr(vec![root])
            } else {
                Node::Lit(self.rng.below(100_000).to_string())
            };
        }
        let mut code = Vec::new();
        self.whitespace(&mut code);
        self.render(&root, &mut code);
        self.whitespace(&mut code);
        if std::mem::take(&mut self.odd_space) {
            self.odd_whitespace(&mut code);
        }
        if self.play(Trick::TrailingGarbage, 40) {
            let tail = *self.pick(&[",", "}", " {}", "x", "\u{0}", "]"]);
            code.extend(text(tail));
        }
        let mut bytes = self.encode(&code);
        if self.play(Trick::InvalidUtf8, 30) {
            let at = self.rng.below(bytes.len() as u64 + 1) as usize;
            const BAD: [&[u8]; 5] = [
                b"\xFF",
                b"\xC0\x80",
                b"\x80",
                b"\xED\xA0",
                b"\xF4\x90\x80\x80",
            ];
            let bad = BAD[self.rng.below(BAD.len() as u64) as usize];
            bytes.splice(at..at, bad.iter().copied());
        }
        if !bytes.is_empty() && self.play(Trick::Truncated, 25) {
            let cut = self.rng.below(bytes.len() as u64) as usize;
            bytes.truncate(cut);
        }
        bytes
    }

    /// A chat-like request object with some of the bounds set.
    fn document(&mut self, fields: &[&str]) -> Node {
        let mut members: Vec<(Vec<u32>, Node)> = vec![
            (self.key("model"), Node::Str(text("some-model"))),
            (self.key("messages"), self.messages()),
        ];
        if self.one_in(3) {
            let t = if self.play(Trick::NanElsewhere, 3) {
                self.pick(&["NaN", "Infinity", "-Infinity"]).to_string()
            } else {
                format!("0.{}", self.rng.below(10))
            };
            members.push((self.key("temperature"), Node::Lit(t)));
        }
        if self.play(Trick::NanElsewhere, 15) {
            let values = vec![Node::Lit("NaN".into()), Node::Lit("-Infinity".into())];
            members.push((self.key("logit_bias"), Node::Arr(values)));
        }
        if self.play(Trick::LongInteger, 50) {
            let digits = 4_295 + self.rng.below(12) as usize;
            members.push((self.key("seed"), Node::Lit("7".repeat(digits))));
        }
        if self.play(Trick::Deep, 30) {
            let depth = *self.pick(&[100, 127, 128, 129, 200, 900, 1_100]);
            members.push((self.key("tools"), self.deep(depth)));
        }
        if self.play(Trick::EscapedName, 12) {
            // Near misses: not a bound for any parser.
            let near = *self.pick(&["max_tokens ", "Max_tokens", "max-tokens", "max_token"]);
            members.push((text(near), Node::Lit(self.rng.below(1 << 20).to_string())));
        }
        for field in fields {
            if self.one_in(2) {
                let path: Vec<&str> = field.split('.').collect();
                self.set(&mut members, &path);
            }
        }
        // Shuffle so that the bounds are not always last.
        for i in (1..members.len()).rev() {
            let j = self.rng.below(i as u64 + 1) as usize;
            members.swap(i, j);
        }
        Node::Obj(members)
    }

    fn messages(&mut self) -> Node {
        let content = self.content();
        Node::Arr(vec![Node::Obj(vec![
            (self.key("role"), Node::Str(text("user"))),
            (self.key("content"), Node::Str(content)),
        ])])
    }

    /// A prompt's raw string content, with surrogates, escapes, controls or bulk.
    fn content(&mut self) -> Vec<u32> {
        let mut s = text("hello é 😀 \\\" \\n \\u00e9");
        if self.play(Trick::LoneSurrogate, 5) {
            let piece: &[u32] = match self.rng.below(5) {
                0 => &[0xD800],
                1 => &[0xDC00, 0x41],
                2 => &[0xD83D, 0xDE00],
                _ => &[],
            };
            s.extend_from_slice(piece);
            let escaped = *self.pick(&["\\ud800", "\\udfff x", "\\ud83d\\u0041", "\\udc00\\ud800"]);
            s.extend(text(escaped));
        }
        if self.play(Trick::ControlChar, 30) {
            s.push(*self.pick(&[0x01, 0x0A, 0x1F, 0x7F, 0x09]));
        }
        if self.play(Trick::HugeString, 40) {
            let n = 10_000 + self.rng.below(50_000) as usize;
            s.extend(std::iter::repeat_n(u32::from('x'), n));
            s.extend(text("é\\u00e9"));
        }
        s
    }

    fn deep(&mut self, depth: usize) -> Node {
        let mut node = Node::Lit("1".into());
        for level in 0..depth {
            node = if level % 3 == 0 {
                Node::Obj(vec![(text("max_tokens"), node)])
            } else {
                Node::Arr(vec![node])
            };
        }
        node
    }

    /// A key as written: its name, or with escapes.
    fn key(&mut self, name: &str) -> Vec<u32> {
        if !self.play(Trick::EscapedName, 10) {
            return text(name);
        }
        let mut out = Vec::new();
        for c in name.chars() {
            if self.one_in(3) {
                let code = u32::from(c);
                let hex = if self.one_in(2) {
                    format!("\\u{code:04x}")
                } else {
                    format!("\\u{code:04X}")
                };
                out.extend(text(&hex));
            } else {
                out.push(u32::from(c));
            }
        }
        out
    }

    /// Sets `path` in `members`, with its parents, maybe duplicated.
    fn set(&mut self, members: &mut Vec<(Vec<u32>, Node)>, path: &[&str]) {
        let (name, rest) = path.split_first().unwrap();
        if rest.is_empty() {
            let value = self.bound();
            members.push((self.key(name), value));
            if self.play(Trick::DuplicateKey, 4) {
                let other = self.bound();
                let at = self.rng.below(members.len() as u64 + 1) as usize;
                members.insert(at, (self.key(name), other));
            }
            return;
        }
        let mut inner = Vec::new();
        self.set(&mut inner, rest);
        if self.one_in(3) {
            inner.push((self.key("temperature"), Node::Lit("0.5".into())));
        }
        members.push((self.key(name), Node::Obj(inner)));
        if self.play(Trick::DuplicateParent, 4) {
            let twin = match self.rng.below(5) {
                0 => {
                    let mut twin = Vec::new();
                    self.set(&mut twin, rest);
                    Node::Obj(twin)
                }
                1 => Node::Obj(vec![(self.key("topK"), Node::Lit("3".into()))]),
                2 => Node::Lit("null".into()),
                3 => Node::Str(text("x")),
                _ => Node::Obj(Vec::new()),
            };
            let at = self.rng.below(members.len() as u64 + 1) as usize;
            members.insert(at, (self.key(name), twin));
        }
    }

    /// A bound's value.
    fn bound(&mut self) -> Node {
        let n = match self.rng.below(3) {
            0 => self.rng.below(100),
            1 => self.rng.below(20_000),
            _ => self.rng.below(300_000),
        };
        let number = |s: String| Node::Lit(s);
        if self.play(Trick::NumberSyntax, 4) {
            return number(match self.rng.below(10) {
                0 => format!("{n}.0"),
                1 => format!("{n}e0"),
                2 => format!("{}E+3", n / 1000),
                3 => self.pick(&["-0", "-0.0", "0e5", "-0E-2"]).to_string(),
                4 => format!("{n}.5"),
                5 => format!("-{}", n.max(1)),
                6 => self
                    .pick(&[
                        "18446744073709551615",
                        "18446744073709551616",
                        "99999999999999999999999",
                        "1.8446744073709552e19",
                    ])
                    .to_string(),
                7 => self
                    .pick(&["1e400", "-1e400", "1e300", "1e-400"])
                    .to_string(),
                8 => format!("{n}.000000000000001"),
                _ => format!("0{n}"),
            });
        }
        if self.play(Trick::NanInBound, 15) {
            return number(self.pick(&["NaN", "Infinity", "-Infinity"]).to_string());
        }
        if self.play(Trick::OddValue, 8) {
            return match self.rng.below(5) {
                0 => Node::Str(text(&n.to_string())),
                1 => Node::Lit("null".into()),
                2 => Node::Lit("true".into()),
                3 => Node::Obj(vec![(text("n"), Node::Lit(n.to_string()))]),
                _ => Node::Arr(vec![Node::Lit(n.to_string())]),
            };
        }
        number(n.to_string())
    }

    fn whitespace(&mut self, out: &mut Vec<u32>) {
        if self.one_in(4) {
            let ws = *self.pick(&[" ", "\t", "\n", "\r\n", "  "]);
            out.extend(text(ws));
        }
        if self.odd_space && self.one_in(8) {
            self.odd_space = false;
            self.odd_whitespace(out);
        }
    }

    /// A character some think is whitespace (a space too, sometimes).
    fn odd_whitespace(&mut self, out: &mut Vec<u32>) {
        out.push(*self.pick(&[0x0C, 0xA0, 0x0B, 0x20, 0x2028, 0xFEFF]));
    }

    fn render(&mut self, node: &Node, out: &mut Vec<u32>) {
        match node {
            Node::Lit(s) => out.extend(text(s)),
            Node::Str(content) => {
                out.push(u32::from('"'));
                out.extend_from_slice(content);
                out.push(u32::from('"'));
            }
            Node::Arr(items) => {
                out.push(u32::from('['));
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(u32::from(','));
                    }
                    self.whitespace(out);
                    self.render(item, out);
                }
                out.push(u32::from(']'));
            }
            Node::Obj(members) => {
                out.push(u32::from('{'));
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(u32::from(','));
                    }
                    self.whitespace(out);
                    out.push(u32::from('"'));
                    out.extend_from_slice(key);
                    out.push(u32::from('"'));
                    self.whitespace(out);
                    out.push(u32::from(':'));
                    self.whitespace(out);
                    self.render(value, out);
                    self.whitespace(out);
                }
                out.push(u32::from('}'));
            }
        }
    }

    /// The code points as bytes: UTF-8 (surrogates as their three bytes), with a BOM,
    /// UTF-16 or UTF-32.
    fn encode(&mut self, code: &[u32]) -> Vec<u8> {
        let mut out = Vec::new();
        if self.play(Trick::Utf16, 10) {
            let big = self.one_in(2);
            let mut units: Vec<u16> = Vec::new();
            if self.one_in(2) {
                units.push(0xFEFF);
            }
            for &c in code {
                if c >= 0x10000 {
                    let c = c - 0x10000;
                    units.push(0xD800 + (c >> 10) as u16);
                    units.push(0xDC00 + (c & 0x3FF) as u16);
                } else {
                    units.push(c as u16);
                }
            }
            for u in units {
                out.extend(if big {
                    u.to_be_bytes()
                } else {
                    u.to_le_bytes()
                });
            }
            return out;
        }
        if self.play(Trick::Utf32, 12) {
            let big = self.one_in(2);
            let bom = self.one_in(2).then_some(0xFEFF);
            for c in bom.into_iter().chain(code.iter().copied()) {
                out.extend(if big {
                    c.to_be_bytes()
                } else {
                    c.to_le_bytes()
                });
            }
            return out;
        }
        if self.play(Trick::Bom, 8) {
            out.extend(b"\xEF\xBB\xBF");
            if self.one_in(8) {
                out.extend(b"\xEF\xBB\xBF");
            }
        }
        for &c in code {
            match c {
                0..=0x7F => out.push(c as u8),
                0x80..=0x7FF => out.extend([0xC0 | (c >> 6) as u8, 0x80 | (c & 0x3F) as u8]),
                0x800..=0xFFFF => out.extend([
                    0xE0 | (c >> 12) as u8,
                    0x80 | ((c >> 6) & 0x3F) as u8,
                    0x80 | (c & 0x3F) as u8,
                ]),
                _ => out.extend([
                    0xF0 | (c >> 18) as u8,
                    0x80 | ((c >> 12) & 0x3F) as u8,
                    0x80 | ((c >> 6) & 0x3F) as u8,
                    0x80 | (c & 0x3F) as u8,
                ]),
            }
        }
        out
    }
}
