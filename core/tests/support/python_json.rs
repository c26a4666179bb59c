//! Python 3's `json.loads(bytes)` as a reference reader of JSON bodies (what FastAPI,
//! vLLM and SGLang read), twice: as it is (a duplicate key keeps its last value) and with
//! an `object_pairs_hook` that keeps the first (RapidJSON's `FindMember`, several Go and
//! C++ parsers). One `python3` process reads many bodies: in one batch ([`python`]), or
//! one at a time while a test runs ([`PythonReader`]).
#![allow(dead_code)]

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use serde_json::Value;

/// Reads each input line — `E <hex>`: a body; `C <hex> <hex>`: a body and the body a
/// clamp sent for it — and answers one JSON line: what each reader reads at each path
/// (a whole number, "absent", "null" or "other"; `null` when it refuses the body), and
/// for a clamp whether every other field reads as before.
pub const READERS: &str = r#"
import json, sys

PATHS = [p.split('.') for p in sys.argv[1].split(',')]

def first_wins(pairs):
    d = {}
    for k, v in pairs:
        if k not in d:
            d[k] = v
    return d

def load(b, first):
    try:
        return json.loads(b, object_pairs_hook=first_wins) if first else json.loads(b)
    except Exception:
        return REFUSED

REFUSED = object()

def read(doc, path):
    for seg in path:
        if isinstance(doc, dict) and seg in doc:
            doc = doc[seg]
        else:
            return "absent"
    if doc is None:
        return "null"
    if isinstance(doc, bool):
        return "other"
    if isinstance(doc, int):
        return doc if 0 <= doc < 2**64 else "other"
    if isinstance(doc, float):
        if doc == doc and abs(doc) != float('inf') and doc.is_integer() and 0 <= doc < 2**64:
            return int(doc)
        return "other"
    return "other"

def readings(doc):
    return None if doc is REFUSED else [read(doc, p) for p in PATHS]

def show(v):
    try:
        return repr(v)
    except Exception:
        return "?"

def same(a, b, paths):
    if not isinstance(a, dict) or not isinstance(b, dict):
        return show(a) == show(b)
    leaf = {p[0] for p in paths if len(p) == 1}
    through = {}
    for p in paths:
        if len(p) > 1:
            through.setdefault(p[0], []).append(p[1:])
    kept_a = [k for k in a if k not in leaf]
    kept_b = [k for k in b if k not in leaf and (k in a or k not in through)]
    if kept_a != kept_b:
        return False
    for k in kept_a:
        if k in through and a[k] is None:
            continue
        if k in through and isinstance(a[k], dict):
            if not same(a[k], b[k], through[k]):
                return False
        elif show(a[k]) != show(b[k]):
            return False
    return True

class Pairs(list):
    pass

def most_in_one_object(doc, path):
    """The most values other than null that one object holds under the path's last key,
    through every duplicate parent."""
    if not isinstance(doc, Pairs):
        return 0
    found = [v for k, v in doc if k == path[0]]
    if len(path) == 1:
        return len([v for v in found if v is not None])
    return max([most_in_one_object(v, path[1:]) for v in found], default=0)

def duplicated(b):
    try:
        doc = json.loads(b, object_pairs_hook=Pairs)
    except Exception:
        return False
    return any(most_in_one_object(doc, p) > 1 for p in PATHS)

for line in iter(sys.stdin.readline, ''):
    parts = line.split()
    out = {}
    if parts[0] == "E":
        body = bytes.fromhex(parts[1]) if len(parts) > 1 else b""
        for name, first in (("last", False), ("first", True)):
            out[name] = readings(load(body, first))
    else:
        before, after = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
        for name, first in (("last", False), ("first", True)):
            a, b = load(before, first), load(after, first)
            out[name] = readings(b)
            out["same_" + name] = a is not REFUSED and b is not REFUSED and same(a, b, PATHS)
        out["duplicated"] = duplicated(after)
    print(json.dumps(out), flush=True)
"#;

/// What one reader reads at one path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    Absent,
    Null,
    Whole(u64),
    Other,
}

pub fn reads(v: &Value) -> Option<Vec<Read>> {
    let list = v.as_array()?;
    Some(
        list.iter()
            .map(|r| match r {
                Value::Number(n) => Read::Whole(n.as_u64().unwrap()),
                Value::String(s) if s == "absent" => Read::Absent,
                Value::String(s) if s == "null" => Read::Null,
                _ => Read::Other,
            })
            .collect(),
    )
}

pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        write!(out, "{b:02x}").unwrap();
    }
    out
}

/// Runs the readers over `lines`; one answer per line.
pub fn python(lines: &[String], paths: &[&str]) -> Vec<Value> {
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(READERS)
        .arg(paths.join(","))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "this test judges weir against Python's json.loads and needs python3 on PATH \
                 (apt-get install python3, or brew install python): {e}"
            )
        });
    let mut stdin = child.stdin.take().unwrap();
    let input = lines.join("\n") + "\n";
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()).unwrap());
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(
        output.status.success(),
        "python3 failed: {:?}",
        output.status
    );
    let answers: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(answers.len(), lines.len(), "one answer per body");
    answers
}

/// A `python3` running [`READERS`], read one body at a time.
pub struct PythonReader {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// What the two readers read at each path of a body; `None` for a reader that refuses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readings {
    pub last: Option<Vec<Read>>,
    pub first: Option<Vec<Read>>,
}

impl PythonReader {
    /// A reader of the values at `paths` (dotted).
    pub fn start(paths: &[&str]) -> PythonReader {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(READERS)
            .arg(paths.join(","))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "this test judges weir against Python's json.loads and needs python3 on \
                     PATH (apt-get install python3): {e}"
                )
            });
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        PythonReader {
            child,
            stdin,
            stdout,
        }
    }

    /// How both readers read `body`.
    pub fn read(&mut self, body: &[u8]) -> Readings {
        writeln!(self.stdin, "E {}", hex(body)).unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let answer: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("python3 answered {line:?}: {e}"));
        Readings {
            last: reads(&answer["last"]),
            first: reads(&answer["first"]),
        }
    }
}

impl Drop for PythonReader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
