//! The docs hold together: every link to a section finds its heading, every relative link
//! finds its file, and docs/README.md, the index, lists every page once. (What the docs'
//! examples and figures say is tests/tests/docs_examples.rs.)

use std::collections::BTreeSet;
use weir_e2e::{doc_files, repo_relative, repo_root};

/// GitHub's anchor for a heading: lower case, letters, digits, `-` and `_` kept, spaces
/// made `-`, everything else dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown text's headings (outside code blocks); a repeated heading
/// gets `-1`, `-2`, … as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        }
        let Some(heading) = line.strip_prefix('#').filter(|_| !in_code) else {
            continue;
        };
        let base = anchor(heading.trim_start_matches('#'));
        let mut name = base.clone();
        let mut n = 0;
        while !out.insert(name.clone()) {
            n += 1;
            name = format!("{base}-{n}");
        }
    }
    out
}

/// Every link to a section of the docs (`[x](global.md#leases)`, `[x](#reservoirs)`)
/// names a heading that exists: a renamed section breaks its links here, not for readers.
#[test]
fn every_link_to_a_section_finds_its_heading() {
    let files = doc_files();
    let mut checked = 0;
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let file = repo_relative(path);
        for (i, line) in text.lines().enumerate() {
            for (start, _) in line.match_indices("](") {
                let target = line[start + 2..].split(')').next().unwrap_or("");
                let Some((doc, section)) = target.split_once('#') else {
                    continue;
                };
                if doc.contains("://") {
                    continue;
                }
                let linked = if doc.is_empty() {
                    path.clone()
                } else {
                    path.parent().unwrap().join(doc)
                };
                let linked_text = std::fs::read_to_string(&linked)
                    .unwrap_or_else(|e| panic!("{file}:{}: {target}: {e}", i + 1));
                assert!(
                    anchors(&linked_text).contains(section),
                    "{file}:{}: `{target}`: no heading with the anchor #{section}",
                    i + 1
                );
                checked += 1;
            }
        }
    }
    eprintln!("{checked} links to sections");
    assert!(checked >= 40, "only {checked} links to sections");
}

#[test]
fn anchors_are_made_as_on_github() {
    assert_eq!(
        anchor(" Reservoirs: local limits without shared-data calls"),
        "reservoirs-local-limits-without-shared-data-calls"
    );
    assert_eq!(
        anchor("Cost after the response (`commit`)"),
        "cost-after-the-response-commit"
    );
    let found = anchors("# A\n```\n# not a heading\n```\n## A\n### B_c\n");
    assert_eq!(
        found,
        ["a", "a-1", "b_c"].map(String::from).into_iter().collect()
    );
}

/// docs/README.md is the index: every page of docs/ is on it, once, and every relative link
/// of the docs (to a page, a file or a folder of the repository) points at something that
/// exists.
#[test]
fn the_index_lists_every_page_and_every_link_finds_its_file() {
    let root = repo_root();
    let index = std::fs::read_to_string(root.join("docs/README.md")).unwrap();
    for path in doc_files() {
        let Ok(page) = path.strip_prefix(root.join("docs")) else {
            continue;
        };
        let page = page.to_string_lossy();
        if page == "README.md" {
            continue;
        }
        let listed = index.matches(&format!("]({page})")).count();
        assert_eq!(
            listed, 1,
            "docs/README.md lists docs/{page} {listed} times, not once"
        );
    }
    let mut checked = 0;
    for path in doc_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        let file = repo_relative(&path);
        let mut in_fence = false;
        for (i, line) in text.lines().enumerate() {
            if line.trim_start().starts_with("```") {
                in_fence = !in_fence;
            }
            if in_fence {
                continue;
            }
            for (start, _) in line.match_indices("](") {
                let target = line[start + 2..].split(')').next().unwrap_or("");
                let target = target.split('#').next().unwrap_or("");
                if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let linked = path.parent().unwrap().join(target);
                assert!(
                    linked.exists(),
                    "{file}:{}: `{target}` does not exist",
                    i + 1
                );
                checked += 1;
            }
        }
    }
    eprintln!("{checked} links to files");
    assert!(checked >= 40, "only {checked} links to files");
}
