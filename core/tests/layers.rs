//! The module graph has no cycles: each module of the core, and of the filter's glue,
//! uses only modules listed before it. A new `use crate::…` that points up a layer, or a
//! new module that is not placed in a layer, fails here.
//!
//! Uses are read from the sources (`crate::<module>` outside comments), so the test sees
//! what the compiler resolves, without a dependency on a parser.
#![cfg(not(target_arch = "wasm32"))]
#![allow(clippy::unwrap_used, clippy::panic, clippy::indexing_slicing)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The core's modules, lowest first (lib.rs says what each is).
const CORE_LAYERS: &[&str] = &[
    "field_error",
    "bounds",
    "stats",
    "time",
    "buffers",
    "algorithms",
    "conformance",
    "adaptive",
    "concurrency",
    "key",
    "store",
    "lease",
    "response",
    "usage",
    "deadline",
    "rules",
    "reservoir",
    "config",
    "delay",
    "worker",
    "wire",
    "engine",
    "flight",
    "filter",
    "scenarios",
    "simulation",
];

/// weir-protocol's modules, lowest first (its lib.rs says what each is). weir-core
/// re-exports them under the same names, so `CORE_LAYERS` places them too.
const PROTOCOL_LAYERS: &[&str] = &[
    "field_error",
    "bounds",
    "time",
    "duration",
    "algorithms",
    "conformance",
    "key",
    "wire",
];

/// The files of `core/src/engine/`, lowest first: each uses (`super::<file>`) only the
/// ones before it. `mod` declares them all and comes last.
const ENGINE_LAYERS: &[&str] = &[
    "report",
    "evaluation",
    "local",
    "concurrency",
    "global",
    "runtime",
    "bridge",
    "outstanding",
    "mod",
];

/// The files of `core/src/filter/`, lowest first, as for the engine.
const FILTER_FILE_LAYERS: &[&str] = &[
    "host",
    "facts",
    "metrics",
    "plugin",
    "settling",
    "reply",
    "request",
    "root",
    "vm",
    "scripted",
    "scripted_envoy",
    "mod",
];

/// The filter crate's modules (the ABI translation), lowest first.
const FILTER_LAYERS: &[&str] = &["host", "abi"];

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
fn check_layers(dir: &Path, layers: &[&str]) {
    let rank = |m: &str| layers.iter().position(|l| *l == m);
    let mut problems = Vec::new();
    let files = module_files(dir);
    assert!(!files.is_empty(), "no sources under {}", dir.display());
    for (module, path) in &files {
        let Some(own) = rank(module) else {
            problems.push(format!(
                "{}: module `{module}` is in no layer; add it to the list in core/tests/layers.rs",
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
        CORE_LAYERS,
    );
}

#[test]
fn protocol_modules_only_use_lower_layers() {
    check_layers(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../protocol/src"),
        PROTOCOL_LAYERS,
    );
}

#[test]
fn engine_files_only_use_lower_files() {
    check_files("engine", ENGINE_LAYERS);
}

#[test]
fn filter_files_only_use_lower_files() {
    check_files("filter", FILTER_FILE_LAYERS);
}

/// Every use between two files of `core/src/<module>/`, checked against `layers`.
fn check_files(module: &str, layers: &[&str]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src")
        .join(module);
    let rank = |m: &str| layers.iter().position(|l| *l == m);
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
                "{}: file `{file}` is in no layer; add it to the {module} list in core/tests/layers.rs",
                path.display()
            ));
            continue;
        };
        let source = std::fs::read_to_string(path).unwrap();
        let mut used = named_after(&source, "super::");
        used.extend(named_after(&source, &format!("crate::{module}::")));
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
    check_layers(&filter, FILTER_LAYERS);
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
