//! docs/algorithms.md, "Adding an algorithm", stays true: its table lists every file a
//! new slot algorithm is named in, and nothing else names one.
//!
//! An algorithm is *named* on a line that holds its kind (`AlgorithmKind::Gcra`,
//! `Limit::Gcra`, a variant declared as `Gcra,` or `Gcra(…)`), its config name as a
//! string (`"gcra"`), its module (`gcra::…`, `mod gcra;`). Read from the sources with
//! comments, doctests and inline test modules (`#[cfg(test)]` to the end) left out, so
//! the test sees code, without a dependency on a parser. The checks, for the slot
//! algorithms (the table is theirs; a global-only one also needs a `GlobalLimit` variant):
//!
//! - every file the table lists exists, for every algorithm where it has `<name>`,
//!   `<script>` or `<settle_script>` in it;
//! - the code of the core, the bridge and the filter names an algorithm only in the
//!   algorithm modules and in the files the table lists: a `matches!` on a kind or a
//!   `"gcra"` anywhere else fails here (ask the spec or the traits instead);
//! - every file the table lists names every slot algorithm (an entry nothing needs any
//!   more fails too), its test modules included; on exactly as many lines of its code
//!   as its `lines` column says when that is a number: each is one line a new algorithm
//!   adds;
//! - a file that enumerates the slot algorithms is listed: any source, test, fixture or
//!   page with a line that names them all (a message that lists them, a table), and a
//!   test or example with a match arm for every one as a variant of one enum
//!   (`AlgorithmKind::… =>` or `Limit::…(…) =>`: a match the compiler or a runner will make
//!   a new one join; limits built by hand for a test are a choice of cases, not a list).
#![cfg(not(target_arch = "wasm32"))]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use weir_core::algorithms::{AlgorithmKind, AlgorithmSpec};

/// The workspace root: `core/`'s parent.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// One row of the table: the files (as written, placeholders included) and its `lines`
/// column (`None` when it is not a number).
#[derive(Debug)]
struct Row {
    files: Vec<String>,
    lines: Option<usize>,
}

/// The table under "## Adding an algorithm" in `text`.
fn rows(text: &str) -> Vec<Row> {
    let section = text
        .split("\n## Adding an algorithm\n")
        .nth(1)
        .expect("docs/algorithms.md has a section \"Adding an algorithm\"");
    let section = section.split("\n## ").next().unwrap();
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        if cells.first().is_none_or(|c| !c.contains('`')) {
            continue; // the header and the rule under it
        }
        let files = cells[0]
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        let lines = cells.get(1).and_then(|c| c.parse().ok());
        rows.push(Row { files, lines });
    }
    assert!(!rows.is_empty(), "the section has no table");
    rows
}

fn slot_specs() -> Vec<&'static AlgorithmSpec> {
    AlgorithmKind::ALL
        .into_iter()
        .map(AlgorithmKind::spec)
        .filter(|spec| spec.global_only.is_none())
        .collect()
}

/// `pattern` with its placeholders filled in for `spec`; `None` when it has one the spec
/// has no value for (`<settle_script>` of an algorithm that does not settle).
fn fill(pattern: &str, spec: &AlgorithmSpec) -> Option<String> {
    let mut path = pattern
        .replace("<name>", spec.name)
        .replace("<script>", spec.script);
    if path.contains("<settle_script>") {
        path = path.replace("<settle_script>", spec.settle_script?);
    }
    Some(path)
}

/// `text` without comments (`//` to the end of the line, outside strings) and without
/// what follows `#[cfg(test)]`.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or(text);
    text.lines()
        .map(|line| {
            let mut in_string = false;
            let mut prev = ' ';
            for (at, c) in line.char_indices() {
                match c {
                    '"' if prev != '\\' => in_string = !in_string,
                    '/' if !in_string && prev == '/' => return &line[..at - 1],
                    _ => {}
                }
                prev = c;
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `AlgorithmKind::Gcra` → `Gcra`: the variant as the enums spell it.
fn variant(spec: &AlgorithmSpec) -> String {
    format!("{:?}", spec.kind)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `word` occurs in `line` as a whole identifier, followed by `after`.
fn has_word(line: &str, word: &str, after: &str) -> bool {
    line.match_indices(word).any(|(at, _)| {
        let before_ok = line[..at].chars().next_back().is_none_or(|c| !is_ident(c));
        let rest = &line[at + word.len()..];
        before_ok && rest.starts_with(after) && (!after.is_empty() || !rest.starts_with(is_ident))
    })
}

/// Whether `line` names the algorithm of `spec` (see the module docs).
fn names(line: &str, spec: &AlgorithmSpec) -> bool {
    let v = variant(spec);
    let declared = line.trim_start();
    has_word(line, &format!("AlgorithmKind::{v}"), "")
        || has_word(line, &format!("Limit::{v}"), "")
        || ((declared.starts_with(&format!("{v},")) || declared.starts_with(&format!("{v}(")))
            && !declared.starts_with(&format!("{v}::")))
        || line.contains(&format!("\"{}\"", spec.name))
        || has_word(line, spec.name, "::")
        || line.contains(&format!("mod {};", spec.name))
}

/// Whether `line` names the algorithm as a variant of `enumeration` (`AlgorithmKind`,
/// `Limit`): a dispatch on it, or a list of them.
fn names_as(line: &str, enumeration: &str, spec: &AlgorithmSpec) -> bool {
    has_word(line, &format!("{enumeration}::{}", variant(spec)), "")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The listed files without placeholders, with their `lines` column.
fn listed(rows: &[Row]) -> Vec<(String, Option<usize>)> {
    rows.iter()
        .flat_map(|row| row.files.iter().map(move |f| (f.clone(), row.lines)))
        .filter(|(f, _)| !f.contains('<'))
        .collect()
}

/// The algorithm modules: `protocol/src/algorithms/<name>.rs` of every algorithm.
fn algorithm_modules() -> BTreeSet<String> {
    AlgorithmKind::ALL
        .into_iter()
        .map(|kind| format!("protocol/src/algorithms/{}.rs", kind.spec().name))
        .collect()
}

fn docs_rows() -> Vec<Row> {
    rows(&read("docs/algorithms.md"))
}

#[test]
fn every_listed_file_exists_for_every_algorithm() {
    for row in docs_rows() {
        for pattern in &row.files {
            for spec in slot_specs() {
                let Some(path) = fill(pattern, spec) else {
                    continue;
                };
                assert!(
                    root().join(&path).is_file(),
                    "docs/algorithms.md lists `{pattern}`, but {path} does not exist"
                );
            }
        }
    }
}

#[test]
fn only_the_listed_files_and_the_algorithm_modules_name_an_algorithm() {
    let listed: BTreeSet<String> = listed(&docs_rows()).into_iter().map(|(f, _)| f).collect();
    let homes = algorithm_modules();
    let mut strays = Vec::new();
    for dir in [
        "protocol/src",
        "core/src",
        "bridge/src",
        "src",
        "bridge/build.rs",
    ] {
        let files = if dir.ends_with(".rs") {
            vec![dir.to_string()]
        } else {
            files_ending(dir, &[".rs"])
        };
        for file in files {
            if listed.contains(&file) || homes.contains(&file) {
                continue;
            }
            let code = code_of(&read(&file));
            for (n, line) in code.lines().enumerate() {
                if let Some(spec) = slot_specs().into_iter().find(|s| names(line, s)) {
                    strays.push(format!(
                        "{file}:{}: names {}: {}",
                        n + 1,
                        spec.name,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        strays.is_empty(),
        "code outside an algorithm's module and the files docs/algorithms.md lists names an \
         algorithm; ask its spec or traits instead (or list the file, if every new algorithm \
         must be named there):\n{}",
        strays.join("\n")
    );
}

/// The lines of `file`: for Rust, with comments left out (test modules kept).
fn lines_of(file: &str, text: &str) -> Vec<String> {
    if is_rust(file) {
        text.lines().map(code_of).collect()
    } else {
        text.lines().map(str::to_string).collect()
    }
}

fn is_rust(file: &str) -> bool {
    file.ends_with(".rs")
}

/// Whether `line` of `file` names the algorithm of `spec`: as code names it in Rust, by
/// its config name elsewhere.
fn named_in(file: &str, line: &str, spec: &AlgorithmSpec) -> bool {
    if is_rust(file) {
        names(line, spec)
    } else {
        has_word(line, spec.name, "")
    }
}

#[test]
fn every_listed_file_names_every_algorithm_on_the_lines_it_says() {
    for (file, lines) in listed(&docs_rows()) {
        let text = read(&file);
        for spec in slot_specs() {
            // Anywhere, by any of its names (a test's message has them in backquotes).
            assert!(
                lines_of(&file, &text)
                    .iter()
                    .any(|line| named_in(&file, line, spec) || has_word(line, spec.name, "")),
                "{file} is listed but does not name {}",
                spec.name
            );
            if let Some(lines) = lines {
                let count = code_of(&text)
                    .lines()
                    .filter(|line| named_in(&file, line, spec))
                    .count();
                assert_eq!(
                    count, lines,
                    "{file} names {} on {count} lines of its code, docs/algorithms.md says {lines}",
                    spec.name
                );
            }
        }
    }
}

/// The files below `dir` (relative to the root) whose name ends with one of `endings`.
fn files_ending(dir: &str, endings: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root().join(dir)];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root()).unwrap();
            let rel = rel.to_string_lossy().replace('\\', "/");
            if path.is_dir() {
                stack.push(path);
            } else if endings.iter().any(|e| rel.ends_with(e)) {
                out.push(rel);
            }
        }
    }
    out.sort();
    out
}

/// Whether `lines` of `file` enumerate the slot algorithms: one line names them all (a
/// message that lists them, a table), or, in a test or example, every one is matched as
/// a variant of the same enum (a match the compiler makes a new one join).
fn enumerates(file: &str, lines: &[String]) -> bool {
    let in_one_line = lines.iter().any(|line| {
        slot_specs()
            .into_iter()
            .all(|spec| has_word(line, spec.name, ""))
    });
    let test_code = is_rust(file)
        && !file.starts_with("protocol/src/")
        && !file.starts_with("core/src/")
        && !file.starts_with("bridge/src/");
    // A match arm on each (`Limit::Gcra(g) =>`): a list of limits built by hand is a
    // choice of cases, which a new algorithm need not join.
    let arm = |line: &String, enumeration: &str, spec: &AlgorithmSpec| {
        names_as(line, enumeration, spec) && line.contains("=>")
    };
    let by_kind = test_code
        && ["AlgorithmKind", "Limit"].into_iter().any(|enumeration| {
            slot_specs()
                .into_iter()
                .all(|spec| lines.iter().any(|line| arm(line, enumeration, spec)))
        });
    in_one_line || by_kind
}

#[test]
fn every_file_that_enumerates_the_algorithms_is_listed() {
    let listed: BTreeSet<String> = listed(&docs_rows()).into_iter().map(|(f, _)| f).collect();
    let dirs = [
        "protocol/src",
        "core/src",
        "core/tests",
        "testkit/src",
        "bridge/src",
        "bridge/tests",
        "bridge/examples",
        "src",
        "tests",
        "docs",
    ];
    let mut files: Vec<String> = dirs
        .into_iter()
        .flat_map(|dir| files_ending(dir, &[".rs", ".expected", ".md"]))
        .filter(|file| !file.starts_with("docs/bench/"))
        // This file's own samples are not a list a new algorithm joins.
        .filter(|file| file != "core/tests/adding_an_algorithm.rs")
        .collect();
    files.extend(["README.md".to_string(), "bridge/README.md".to_string()]);
    let missing: Vec<String> = files
        .into_iter()
        .filter(|file| !listed.contains(file))
        .filter(|file| {
            std::fs::read_to_string(root().join(file))
                .is_ok_and(|text| enumerates(file, &lines_of(file, &text)))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "these enumerate the slot algorithms, so a new one joins them: list them in \
         docs/algorithms.md (\"Adding an algorithm\"): {missing:?}"
    );
}

/// The checks above can fail: a stray name, a wrong count and a missing file are seen.
#[test]
fn the_checks_see_what_they_are_for() {
    let gcra = AlgorithmKind::Gcra.spec();
    assert!(names(
        "    if !matches!(limit, Limit::Gcra(_) | Limit::TokenBucket(_)) {",
        gcra
    ));
    assert!(names(r#"    let delays = matches!(name, "gcra");"#, gcra));
    assert!(names("    Gcra(super::gcra::Gcra),", gcra));
    assert!(names("pub mod gcra;", gcra));
    assert!(!names("    let gcra_like = Gcra2::new();", gcra));
    assert!(!names(&code_of("    // Limit::Gcra in a comment"), gcra));
    assert_eq!(code_of("a // Limit::Gcra"), "a ");
    assert_eq!(code_of(r#"let s = "//"; x"#), r#"let s = "//"; x"#);
    // Built from the algorithms there are, so that adding one keeps them true.
    let specs = slot_specs();
    let names: Vec<&str> = specs.iter().map(|spec| spec.name).collect();
    let message = format!("expected one of {}, sliding_log", names.join(", "));
    assert!(enumerates("core/tests/config/bad/x.expected", &[message]));
    let some = format!("{} and {}", names[0], names[1]);
    assert!(!enumerates("docs/x.md", &[some]));
    let kinds: Vec<String> = specs
        .iter()
        .map(|spec| format!("Limit::{}(x) => 1,", variant(spec)))
        .collect();
    assert!(enumerates("core/tests/x.rs", &kinds));
    assert!(!enumerates("core/tests/x.rs", &kinds[1..]));
    let built: Vec<String> = specs
        .iter()
        .map(|spec| format!("Limit::{}(x),", variant(spec)))
        .collect();
    assert!(
        !enumerates("core/tests/x.rs", &built),
        "limits chosen by hand"
    );
    assert!(
        !enumerates("core/src/x.rs", &kinds),
        "code is checked for strays instead"
    );
    let table = "intro\n\n## Adding an algorithm\n\n| file | lines | what |\n|---|---|---|\n\
                 | `protocol/src/algorithms/<name>.rs` | new | the module |\n\
                 | `core/src/a.rs`, `docs/b.md` | 2 | x |\n\n## Next\n| `not/this.rs` | 1 | y |\n";
    let rows = rows(table);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1].files, ["core/src/a.rs", "docs/b.md"]);
    assert_eq!(rows[1].lines, Some(2));
    assert_eq!(rows[0].lines, None);
    assert_eq!(
        fill("bridge/lua/<settle_script>.lua", gcra),
        None,
        "gcra does not settle"
    );
}
