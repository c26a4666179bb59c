//! docs/architecture.md's two pictures are drawn from the code, not beside it: the crate
//! picture has a box for each crate weir ships and an arrow for each of their
//! dependencies on one another (their `Cargo.toml`s, `[dependencies]` only), and the
//! state picture names exactly the states of `Stage` (`core/src/filter/request.rs`).
#![cfg(not(target_arch = "wasm32"))]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The Mermaid block of the architecture page whose first line is `kind`.
fn picture(kind: &str) -> String {
    let page = read("docs/architecture.md");
    page.split("```mermaid\n")
        .skip(1)
        .filter_map(|rest| rest.split("\n```").next())
        .find(|block| block.trim_start().starts_with(kind))
        .unwrap_or_else(|| panic!("docs/architecture.md has no ```mermaid {kind} picture"))
        .to_string()
}

/// A manifest's `name` under `[package]`, and the workspace crates under `[dependencies]`.
fn package(dir: &str) -> (String, BTreeSet<String>) {
    let manifest = read(&format!("{dir}/Cargo.toml"));
    let mut section = "";
    let mut name = None;
    let mut uses = BTreeSet::new();
    for line in manifest.lines() {
        if line.starts_with('[') {
            section = line;
        } else if section == "[package]" {
            if let Some(n) = line.strip_prefix("name = ") {
                name = Some(n.trim_matches('"').to_string());
            }
        } else if section == "[dependencies]" && line.contains("path = ") {
            uses.insert(line.split_whitespace().next().unwrap().to_string());
        }
    }
    (
        name.unwrap_or_else(|| panic!("{dir}/Cargo.toml has no name")),
        uses,
    )
}

/// The crates weir ships (the test and benchmark crates sit above them all, as the page says).
const SHIPPED: [&str; 6] = [".", "protocol", "core", "scripted", "check", "bridge"];
const NOT_SHIPPED: [&str; 4] = ["testkit", "tests", "bench", "bench/empty-filter"];

#[test]
fn the_crate_picture_has_each_shipped_crate_and_its_dependencies() {
    let members = read("Cargo.toml");
    for dir in SHIPPED.iter().chain(&NOT_SHIPPED) {
        assert!(
            members.contains(&format!("\"{dir}\"")),
            "{dir} is not a workspace member any more: update this test and the picture"
        );
    }
    let drawn = picture("flowchart");
    // `id["crate-name<br/>what it is"]`, and `a --> b`.
    let mut crate_of = std::collections::BTreeMap::new();
    let mut arrows = BTreeSet::new();
    for line in drawn.lines().map(str::trim) {
        if let Some((id, label)) = line.split_once("[\"") {
            let name = label.split(['<', ' ', '"']).next().unwrap();
            crate_of.insert(id.to_string(), name.to_string());
        } else if let Some((from, to)) = line.split_once(" --> ") {
            arrows.insert((from.to_string(), to.to_string()));
        }
    }
    let boxes: BTreeSet<String> = crate_of.values().cloned().collect();
    let packages: Vec<(String, BTreeSet<String>)> = SHIPPED.iter().map(|d| package(d)).collect();
    let shipped: BTreeSet<String> = packages.iter().map(|(n, _)| n.clone()).collect();
    assert_eq!(boxes, shipped, "the crate picture's boxes");
    let drawn_deps: BTreeSet<(String, String)> = arrows
        .iter()
        .map(|(a, b)| (crate_of[a].clone(), crate_of[b].clone()))
        .collect();
    let deps: BTreeSet<(String, String)> = packages
        .iter()
        .flat_map(|(name, uses)| uses.iter().map(move |u| (name.clone(), u.clone())))
        .collect();
    assert_eq!(drawn_deps, deps, "the crate picture's arrows");
}

#[test]
fn the_state_picture_names_every_state_of_a_request() {
    let source = read("core/src/filter/request.rs");
    let body = source
        .split("\nenum Stage {\n")
        .nth(1)
        .and_then(|rest| rest.split("\n}\n").next())
        .expect("enum Stage in core/src/filter/request.rs");
    let states: BTreeSet<String> = body
        .lines()
        .filter(|l| l.starts_with("    ") && !l.starts_with("     "))
        .map(str::trim)
        .filter(|l| !l.starts_with("///"))
        .map(|l| l.split(['(', ' ', ',']).next().unwrap().to_string())
        .collect();
    let drawn: BTreeSet<String> = picture("stateDiagram")
        .lines()
        .filter_map(|l| l.split_once("-->"))
        .flat_map(|(from, to)| [from.trim(), to.split(':').next().unwrap().trim()])
        .filter(|s| *s != "[*]")
        .map(str::to_string)
        .collect();
    assert_eq!(drawn, states, "the states drawn, and Stage's");
}
