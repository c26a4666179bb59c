//! The module graph has no cycles: each module of the core, and of the filter's glue,
//! uses only modules declared before it. The order is written once, where the modules are
//! declared (`core/src/lib.rs`, `protocol/src/lib.rs`, `testkit/src/lib.rs`, `src/lib.rs`,
//! and for the files of the engine and of the filter, their `mod.rs`); this test reads it
//! from there. A new `use crate::…` that points up a layer fails here.
//!
//! Uses are read from the sources (`crate::<module>` outside comments), so the test sees
//! what the compiler resolves, without a dependency on a parser.
#![cfg(not(target_arch = "wasm32"))]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The modules a root file (`lib.rs`, `mod.rs`) declares, in its order: `mod m;` and
/// `pub mod m;`, and for weir-core the modules it re-exports from weir-protocol
/// (`pub use weir_protocol::m;`), which it layers among its own.
fn declared(root: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(root);
    let source = std::fs::read_to_string(&path).unwrap();
    let mut order = Vec::new();
    for line in source.lines() {
        let line = line.trim();
        let line = line.strip_prefix("pub ").unwrap_or(line);
        let name = line
            .strip_prefix("mod ")
            .or_else(|| line.strip_prefix("use weir_protocol::"))
            .and_then(|rest| rest.strip_suffix(';'));
        if let Some(name) = name.filter(|n| n.chars().all(|c| c.is_ascii_lowercase() || c == '_')) {
            order.push(name.to_string());
        }
    }
    assert!(!order.is_empty(), "{} declares no module", path.display());
    order
}

/// [`declared`] with `mod` (the root file itself, which may use them all) last.
fn declared_files(root: &str) -> Vec<String> {
    let mut order = declared(root);
    order.push("mod".to_string());
    order
}

/// Every `.rs` file under `dir`, with the top-level module it belongs to (`lib.rs` and
/// binaries belong to none).
fn module_files(dir: &Path) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(dir).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let module = first.trim_end_matches(".rs").to_string();
            if module != "lib" && module != "bin" && module != "main" {
                out.push((module, path));
            }
        }
    }
    out.sort();
    out
}

/// The top-level modules a source file names as `crate::<module>`, comments ignored.
fn uses(source: &str) -> BTreeSet<String> {
    named_after(source, "crate::")
}

/// The names a source file puts right after `prefix` (`crate::`, `super::`), comments
/// ignored.
fn named_after(source: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in source.lines() {
        let code = match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        };
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            let after = &rest[at + prefix.len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `use crate::{a, b}` names several.
            if name.is_empty() && after.starts_with('{') {
                let inside = &after[1..after.find('}').unwrap_or(after.len())];
                for part in inside.split(',') {
                    let top = part.trim().split("::").next().unwrap_or("").trim();
                    if !top.is_empty() {
                        found.insert(top.to_string());
                    }
                }
            } else if !name.is_empty() {
                found.insert(name);
            }
            rest = after;
        }
    }
    found
}

/// Every use between two modules of `dir`, checked against `layers`.
fn check_layers(dir: &Path, layers: &[String], root: &str) {
    let rank = |m: &str| layers.iter().position(|l| l == m);
    let mut problems = Vec::new();
    let files = module_files(dir);
    assert!(!files.is_empty(), "no sources under {}", dir.display());
    for (module, path) in &files {
        let Some(own) = rank(module) else {
            problems.push(format!(
                "{}: module `{module}` is not declared in {root}",
                path.display()
            ));
            continue;
        };
        let source = std::fs::read_to_string(path).unwrap();
        for used in uses(&source) {
            if used == *module {
                continue;
            }
            match rank(&used) {
                Some(r) if r < own => {}
                Some(_) => problems.push(format!(
                    "{}: `{module}` uses `{used}`, which is not below it",
                    path.display()
                )),
                // Items of the crate root (macros, re-exports) are not modules.
                None => {}
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn core_modules_only_use_lower_layers() {
    check_layers(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &declared("src/lib.rs"),
        "core/src/lib.rs",
    );
}

#[test]
fn testkit_modules_only_use_lower_layers() {
    check_layers(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../testkit/src"),
        &declared("../testkit/src/lib.rs"),
        "testkit/src/lib.rs",
    );
}

#[test]
fn scripted_modules_only_use_lower_layers() {
    check_layers(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripted/src"),
        &declared("../scripted/src/lib.rs"),
        "scripted/src/lib.rs",
    );
}

#[test]
fn protocol_modules_only_use_lower_layers() {
    check_layers(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocol/src"),
        &declared("../protocol/src/lib.rs"),
        "protocol/src/lib.rs",
    );
}

#[test]
fn engine_files_only_use_lower_files() {
    check_files("engine", &declared_files("src/engine/mod.rs"));
}

#[test]
fn filter_files_only_use_lower_files() {
    check_files("filter", &declared_files("src/filter/mod.rs"));
}

/// The sources of one file of a module, or of each file of a folder of it, with what their
/// `super::` is written as when it names the module's root.
fn sources_of(path: &Path) -> Vec<(String, &'static str)> {
    if !path.is_dir() {
        return vec![(std::fs::read_to_string(path).unwrap(), "super::")];
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|file| {
            let root = if file.ends_with("mod.rs") {
                "super::"
            } else {
                "super::super::"
            };
            (std::fs::read_to_string(file).unwrap(), root)
        })
        .collect()
}

/// Every use between two files of `core/src/<module>/`, checked against `layers`.
fn check_files(module: &str, layers: &[String]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(module);
    let rank = |m: &str| layers.iter().position(|l| l == m);
    let mut problems = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no sources under {}", dir.display());
    for path in &files {
        let file = path.file_stem().unwrap().to_string_lossy().to_string();
        let Some(own) = rank(&file) else {
            problems.push(format!(
                "{}: file `{file}` is not declared in core/src/{module}/mod.rs",
                path.display()
            ));
            continue;
        };
        // A file's `super::` is the module's root; a folder's (`metrics/`) files are one
        // file of the module: its `mod.rs` as a file, the others one level further down.
        let mut used = BTreeSet::new();
        for (source, parent) in sources_of(path) {
            used.extend(named_after(&source, parent));
            used.extend(named_after(&source, &format!("crate::{module}::")));
        }
        for used in used {
            match rank(&used) {
                Some(r) if r < own => {}
                Some(_) => problems.push(format!(
                    "{}: `{file}` uses `{used}`, which is not below it",
                    path.display()
                )),
                // `super::Engine` and the like: the root re-exports them, but a file below
                // it names the file that defines them.
                None => problems.push(format!(
                    "{}: `{file}` uses `{used}` of the {module}'s root: name the file that defines it",
                    path.display()
                )),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn filter_modules_only_use_lower_layers() {
    let filter = Path::new(env!("CARGO_MANIFEST_DIR")).join("../src");
    check_layers(&filter, &declared("../src/lib.rs"), "src/lib.rs");
}

#[test]
fn the_checker_sees_uses_and_ignores_comments() {
    let source = "use crate::{key::Seed, rules};\n// crate::engine in a comment\nlet x = crate::store::MAX; // crate::wire\n";
    let found: Vec<String> = uses(source).into_iter().collect();
    assert_eq!(found, ["key", "rules", "store"]);
}

/// weir-bridge builds on weir-protocol, not on this crate: the bridge compiles what the
/// filter and it agree on, not the filter's config model, engine or lifecycle. (The
/// bridge's tests may use the core's scenario tables, as a dev-dependency.)
#[test]
fn the_bridge_depends_on_the_protocol_not_the_core() {
    let manifest =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../bridge/Cargo.toml"))
            .unwrap();
    let dependencies = manifest
        .split("\n[dependencies]\n")
        .nth(1)
        .expect("bridge/Cargo.toml has [dependencies]")
        .split("\n[")
        .next()
        .unwrap();
    let names: Vec<&str> = dependencies
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split([' ', '=']).next())
        .filter(|name| !name.is_empty())
        .collect();
    assert!(names.contains(&"weir-protocol"), "{names:?}");
    assert!(!names.contains(&"weir-core"), "{names:?}");
}

/// The order comes from the declarations, weir-protocol's re-exports included, comments
/// and `use` of items left out.
#[test]
fn the_order_is_read_from_where_the_modules_are_declared() {
    let core = declared("src/lib.rs");
    assert_eq!(core[..3], ["field_error", "bounds", "stats"]);
    assert_eq!(core.last().map(String::as_str), Some("filter"));
    assert!(core.contains(&"wire".to_string()), "{core:?}");
    let engine = declared_files("src/engine/mod.rs");
    assert_eq!(engine.first().map(String::as_str), Some("report"));
    assert_eq!(engine.last().map(String::as_str), Some("mod"));
    assert!(!engine.contains(&"bridge::".to_string()));
}
