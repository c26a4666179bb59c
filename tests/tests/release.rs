//! A release (`just release`, scripts/release.py) as an operator takes it: the folder's
//! checksums verify, its manifests pin exactly the images in it, they pass
//! `kubernetes-validate`, every part says the one workspace version, the same commit packs the
//! same folder twice, and both images pushed to a real registry come back by the digests the
//! manifests name. The refusals (a dirty tree, a version without a changelog section) are run
//! on a scratch repository.
//!
//! - **release folder** — what scripts/release.py writes: `weir.wasm`, the OCI layouts
//!   `weir-wasm/` and `weir-bridge/`, `manifests/`, `alerts/`, `dashboards/`, `RELEASE.md`,
//!   `SHA256SUMS`.
//! - **pin** — an image reference by digest: `…/weir-bridge:VERSION@sha256:…` in the
//!   bridge's Deployment, `url: oci://…/weir-wasm@sha256:…` and `sha256` in a WasmPlugin.
//!
//! It packs already-built artifacts (`just test-e2e` builds them): `weir.wasm`
//! (`$WEIR_WASM`), the static weir-bridge of `just oci-bridge` (`$WEIR_BRIDGE_MUSL`) and
//! `weir-check` (`$WEIR_CHECK_BIN`). On a work tree with uncommitted changes it packs with
//! `--dev`, the flag that lets the same code run on such a tree.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use weir_e2e::istio::{labels, parse_yaml_docs, Resource};
use weir_e2e::manifests::{overlays, validate_core_kinds, Rendered};
use weir_e2e::registry::{run_ok, Layout, Registry};
use weir_e2e::{repo_relative, repo_root, weir_wasm, TestDir};

/// Where the shipped manifests' images live before an operator points them at their own.
const SHIPPED_REGISTRY: &str = "registry.example.com";
const VERSION_LABEL: &str = "app.kubernetes.io/version";

/// `$VAR`, else `<target>/<under>`; panics with how to build it when it is not there.
fn built(var: &str, under: &str, how: &str) -> PathBuf {
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join("target"))
            .join(under)
    });
    assert!(
        path.is_file(),
        "{} not found: build it with `{how}`, or set {var}",
        path.display()
    );
    path
}

fn bridge_musl() -> PathBuf {
    built(
        "WEIR_BRIDGE_MUSL",
        "x86_64-unknown-linux-musl/bridge-image/weir-bridge",
        "just oci-bridge",
    )
}

fn weir_check() -> PathBuf {
    built(
        "WEIR_CHECK_BIN",
        "debug/weir-check",
        "cargo build -p weir-check",
    )
}

/// `[workspace.package] version` of the workspace's Cargo.toml, read without the script.
fn workspace_version() -> String {
    let text = read(&repo_root().join("Cargo.toml"));
    let section = text
        .split_once("[workspace.package]\n")
        .unwrap_or_else(|| panic!("Cargo.toml has no [workspace.package]"))
        .1;
    let section = section.split("\n[").next().unwrap_or_default();
    section
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or_else(|| panic!("Cargo.toml: no version in [workspace.package]"))
        .to_string()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn tree_is_dirty(repo: &Path) -> bool {
    let out = run_ok(
        Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(["status", "--porcelain"]),
    );
    !out.stdout.is_empty()
}

/// scripts/release.py of `repo` with `args`, run to its end (success or not).
fn release_py(repo: &Path, args: &[&str]) -> Output {
    Command::new("python3")
        .arg(repo.join("scripts/release.py"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 scripts/release.py: {e}"))
}

/// Packs this checkout's release into `out` from the built artifacts.
fn pack(out: &Path) -> String {
    let (wasm, bridge, check) = (weir_wasm(), bridge_musl(), weir_check());
    let root = repo_root();
    let mut args = vec![
        "--wasm".to_string(),
        wasm.display().to_string(),
        "--bridge-binary".into(),
        bridge.display().to_string(),
        "--weir-check".into(),
        check.display().to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    if tree_is_dirty(&root) {
        eprintln!("release: the work tree has uncommitted changes: packing with --dev");
        args.push("--dev".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let done = release_py(&root, &args);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&done.stdout),
        String::from_utf8_lossy(&done.stderr)
    );
    assert!(
        done.status.success(),
        "scripts/release.py failed ({}):\n{said}",
        done.status
    );
    said
}

/// Every file under `dir`, relative, sorted.
fn files(dir: &Path) -> Vec<String> {
    Layout::new(dir).files().into_iter().map(|f| f.0).collect()
}

/// The one image of an OCI layout: its tag and manifest digest.
fn only_image(layout: &Layout) -> (String, String) {
    let index = layout.index();
    let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
    assert_eq!(manifests.len(), 1, "{}: one image", layout.dir.display());
    let tag = manifests[0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let digest = manifests[0]["digest"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (tag, digest)
}

/// An image a manifest names: `repo` (after the registry host), `tag` if any, `digest`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Pin {
    source: String,
    host: String,
    repo: String,
    tag: Option<String>,
    digest: String,
}

fn parse_pin(reference: &str, source: &str) -> Pin {
    let (name, digest) = reference
        .split_once('@')
        .unwrap_or_else(|| panic!("{source}: {reference} is not pinned by digest"));
    let (host, path) = name
        .split_once('/')
        .unwrap_or_else(|| panic!("{source}: {reference} has no registry host"));
    let (repo, tag) = match path.rsplit_once(':') {
        Some((repo, tag)) => (repo.to_string(), Some(tag.to_string())),
        None => (path.to_string(), None),
    };
    Pin {
        source: source.to_string(),
        host: host.to_string(),
        repo,
        tag,
        digest: digest.to_string(),
    }
}

/// Every image a rendered manifest names: the containers' images and the WasmPlugins'
/// `oci://` urls (whose `sha256` must repeat the url's digest, as istio-agent checks it).
fn pins(resources: &[Resource]) -> Vec<Pin> {
    let mut out = Vec::new();
    for r in resources {
        let at = format!("{} {}/{}", r.source, r.kind(), r.name());
        if r.kind() == "WasmPlugin" {
            let url = r.spec()["url"].as_str().unwrap_or_default();
            let reference = url
                .strip_prefix("oci://")
                .unwrap_or_else(|| panic!("{at}: url {url} is not oci://"));
            let pin = parse_pin(reference, &at);
            assert_eq!(
                r.spec()["sha256"].as_str().map(|h| format!("sha256:{h}")),
                Some(pin.digest.clone()),
                "{at}: sha256 must be the url's digest"
            );
            out.push(pin);
        }
        let containers = r.spec()["template"]["spec"]["containers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for c in containers {
            let image = c["image"].as_str().unwrap_or_default();
            out.push(parse_pin(image, &format!("{at} container {}", c["name"])));
        }
    }
    out
}

/// The whole path, on one folder packed twice.
#[test]
fn release_folder_verifies_pins_its_images_and_round_trips() {
    let version = workspace_version();
    let dir = TestDir::new("release");
    let out = dir.join("release");
    let said = pack(&out);
    eprintln!("{said}");

    // What is in the folder.
    let listed = files(&out);
    let mut expected = vec![
        "RELEASE.md".to_string(),
        "SHA256SUMS".into(),
        "alerts/prometheusrule.yaml".into(),
        "alerts/weir-rules.yaml".into(),
        "dashboards/weir.json".into(),
        "weir.wasm".into(),
    ];
    expected.extend(overlays().iter().map(|o| format!("manifests/{o}.yaml")));
    for want in &expected {
        assert!(listed.contains(want), "{want} missing from {listed:?}");
    }
    for layout in ["weir-wasm", "weir-bridge"] {
        for f in ["oci-layout", "index.json"] {
            let want = format!("{layout}/{f}");
            assert!(listed.contains(&want), "{want} missing from {listed:?}");
        }
    }
    assert!(
        fs::read(out.join("weir.wasm")).ok() == fs::read(weir_wasm()).ok(),
        "weir.wasm in the folder is not the built module"
    );
    for (shipped, packed) in [
        (
            "deploy/alerts/prometheusrule.yaml",
            "alerts/prometheusrule.yaml",
        ),
        ("deploy/alerts/weir-rules.yaml", "alerts/weir-rules.yaml"),
        ("deploy/dashboards/weir.json", "dashboards/weir.json"),
    ] {
        assert_eq!(read(&repo_root().join(shipped)), read(&out.join(packed)));
    }

    // SHA256SUMS names every other file, and `sha256sum -c` verifies them.
    let sums = read(&out.join("SHA256SUMS"));
    let summed: Vec<String> = sums
        .lines()
        .map(|l| {
            l.split_once("  ")
                .unwrap_or_else(|| panic!("SHA256SUMS: {l:?} is not `HASH  NAME`"))
                .1
                .to_string()
        })
        .collect();
    let others: Vec<String> = listed
        .iter()
        .filter(|f| *f != "SHA256SUMS")
        .cloned()
        .collect();
    assert_eq!(
        summed, others,
        "SHA256SUMS must list every other file, sorted"
    );
    run_ok(
        Command::new("sha256sum")
            .args(["--check", "--strict", "--quiet", "SHA256SUMS"])
            .current_dir(&out),
    );

    // One version everywhere: the crates, the binaries, the images, the manifests.
    for manifest in ["Cargo.toml", "core/Cargo.toml", "bridge/Cargo.toml"] {
        let text = read(&repo_root().join(manifest));
        let package = text.split("[package]\n").nth(1).unwrap_or_default();
        assert!(
            package.contains("\nversion.workspace = true\n"),
            "{manifest}: the crate must take the workspace version (version.workspace = true)"
        );
    }
    for (bin, name) in [(bridge_musl(), "weir-bridge"), (weir_check(), "weir-check")] {
        let said = run_ok(Command::new(&bin).arg("--version"));
        assert_eq!(
            String::from_utf8_lossy(&said.stdout).trim(),
            format!("{name} {version}"),
            "{} --version",
            bin.display()
        );
    }
    let wasm_layout = Layout::new(out.join("weir-wasm"));
    let bridge_layout = Layout::new(out.join("weir-bridge"));
    let (wasm_tag, wasm_digest) = only_image(&wasm_layout);
    let (bridge_tag, bridge_digest) = only_image(&bridge_layout);
    assert_eq!(
        (&wasm_tag, &bridge_tag),
        (&version, &version),
        "layout tags"
    );
    let wasm_manifest = wasm_layout.json_blob(&wasm_digest);
    assert_eq!(
        wasm_manifest["annotations"]["org.opencontainers.image.version"], version,
        "weir-wasm's manifest annotation"
    );
    let bridge_manifest = bridge_layout.json_blob(&bridge_digest);
    assert_eq!(
        bridge_manifest["annotations"]["org.opencontainers.image.version"], version,
        "weir-bridge's manifest annotation"
    );
    let bridge_config =
        bridge_layout.json_blob(bridge_manifest["config"]["digest"].as_str().unwrap_or(""));
    assert_eq!(
        bridge_config["config"]["Labels"]["org.opencontainers.image.version"], version,
        "weir-bridge's config label"
    );

    // The changelog has the version's section, and RELEASE.md names the digests.
    let heading = format!("## [{version}] - ");
    assert!(
        read(&repo_root().join("CHANGELOG.md"))
            .lines()
            .any(|l| l.starts_with(&heading)),
        "CHANGELOG.md has no `{heading}YYYY-MM-DD` section"
    );
    let notes = read(&out.join("RELEASE.md"));
    for digest in [&wasm_digest, &bridge_digest] {
        assert!(notes.contains(digest.as_str()), "RELEASE.md lacks {digest}");
    }

    // The manifests: valid, labelled with the version, pinned to exactly the folder's images.
    let ours: BTreeMap<&str, &str> = [
        ("weir/weir-wasm", wasm_digest.as_str()),
        ("weir/weir-bridge", bridge_digest.as_str()),
    ]
    .into();
    let mut named: BTreeSet<Pin> = BTreeSet::new();
    for overlay in overlays() {
        let path = out.join(format!("manifests/{overlay}.yaml"));
        let yaml = read(&path);
        let resources = parse_yaml_docs(&yaml, &format!("manifests/{overlay}.yaml"));
        for r in &resources {
            assert_eq!(
                labels(&r.value["metadata"]["labels"])
                    .get(VERSION_LABEL)
                    .map(String::as_str),
                Some(version.as_str()),
                "{} {}/{}: {VERSION_LABEL}",
                r.source,
                r.kind(),
                r.name()
            );
            if r.kind() == "Deployment" {
                let template = &r.spec()["template"];
                assert_eq!(
                    labels(&template["metadata"]["labels"])
                        .get(VERSION_LABEL)
                        .map(String::as_str),
                    Some(version.as_str()),
                    "{} Deployment/{}: the pods' {VERSION_LABEL}",
                    r.source,
                    r.name()
                );
            }
        }
        for pin in pins(&resources) {
            if pin.repo.starts_with("weir/") {
                let want = ours.get(pin.repo.as_str()).unwrap_or_else(|| {
                    panic!("{}: an image of weir not in the folder", pin.source)
                });
                assert_eq!(&pin.digest, want, "{}: {pin:?}", pin.source);
                assert_eq!(pin.host, SHIPPED_REGISTRY, "{}", pin.source);
                if pin.repo == "weir/weir-bridge" {
                    assert_eq!(pin.tag.as_deref(), Some(version.as_str()), "{}", pin.source);
                }
                named.insert(pin);
            } else {
                // Not ours (the plain Envoy's official image): RELEASE.md lists what is left
                // to pin.
                assert!(
                    notes.contains(&format!("{}/{}", pin.host, pin.repo)),
                    "{}: {pin:?} is neither the folder's image nor listed in RELEASE.md",
                    pin.source
                );
            }
        }
        let validated = validate_core_kinds(&Rendered {
            overlay: overlay.clone(),
            yaml,
            resources,
        });
        assert!(validated > 0, "{overlay}: no Kubernetes object validated");
    }
    let digests: BTreeSet<&str> = named.iter().map(|p| p.digest.as_str()).collect();
    let want: BTreeSet<&str> = ours.values().copied().collect();
    assert_eq!(
        digests, want,
        "the manifests must name both images of the folder"
    );

    // Reproducible: packed again from the same commit, the same SHA256SUMS.
    let again = dir.join("again");
    pack(&again);
    assert_eq!(
        sums,
        read(&again.join("SHA256SUMS")),
        "packed twice from one commit, the folders differ"
    );

    // The operator's path: push both layouts, point the manifests at the registry, pull
    // what they name, by digest.
    let registry = Registry::start();
    registry.push(&wasm_layout, &version, "weir/weir-wasm");
    registry.push(&bridge_layout, &version, "weir/weir-bridge");
    for (i, pin) in named.iter().enumerate() {
        let pulled = registry.pull(
            &format!("{}@{}", pin.repo, pin.digest),
            &dir.join(format!("pulled-{i}")),
            "pulled",
        );
        assert_eq!(pulled.manifest_digest("pulled"), pin.digest, "{pin:?}");
        let built = if pin.repo == "weir/weir-wasm" {
            &wasm_layout
        } else {
            &bridge_layout
        };
        let manifest = pulled.json_blob(&pin.digest);
        let mut blobs = vec![manifest["config"]["digest"].clone()];
        blobs.extend(manifest["layers"].as_array().cloned().unwrap_or_default());
        for blob in blobs {
            let digest = blob
                .as_str()
                .or(blob["digest"].as_str())
                .unwrap_or_default();
            assert!(
                pulled.blob(digest) == built.blob(digest),
                "{pin:?}: blob {digest} pulled differs from the folder's"
            );
        }
    }
}

/// The refusals, on a scratch repository holding the script, Cargo.toml and CHANGELOG.md of
/// this checkout: clean and with the section it passes the preflight; a change no commit
/// holds, or a version without a section, is refused with the fix in the message; `--dev`
/// lets both through.
#[test]
fn release_refuses_a_dirty_tree_and_a_version_without_a_changelog_section() {
    let version = workspace_version();
    let dir = TestDir::new("release-refusals");
    let repo = dir.path();
    let git = |args: &[&str]| {
        run_ok(
            Command::new("git")
                .arg("-C")
                .arg(repo)
                .args([
                    "-c",
                    "user.name=weir-e2e",
                    "-c",
                    "user.email=e2e@weir.invalid",
                ])
                .args(args),
        );
    };
    git(&["init", "-q"]);
    fs::create_dir_all(repo.join("scripts")).unwrap_or_else(|e| panic!("mkdir: {e}"));
    for f in ["scripts/release.py", "Cargo.toml", "CHANGELOG.md"] {
        fs::copy(repo_root().join(f), repo.join(f)).unwrap_or_else(|e| panic!("copy {f}: {e}"));
    }
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "scratch"]);

    let preflight = |extra: &[&str]| {
        let mut args = vec!["--preflight"];
        args.extend_from_slice(extra);
        let done = release_py(repo, &args);
        let said = String::from_utf8_lossy(&done.stderr).into_owned();
        (done.status.success(), said)
    };

    let (ok, said) = preflight(&[]);
    assert!(ok, "a clean tree with the section must pass:\n{said}");

    fs::write(repo.join("scratch.txt"), "not committed\n").unwrap_or_else(|e| panic!("{e}"));
    let (ok, said) = preflight(&[]);
    assert!(!ok, "a dirty tree must be refused");
    assert!(
        said.contains(&format!("refusing to release {version}"))
            && said.contains("?? scratch.txt")
            && said.contains("commit or stash them"),
        "the message names the change and the fix:\n{said}"
    );
    let (ok, said) = preflight(&["--dev"]);
    assert!(ok, "--dev packs a dirty tree:\n{said}");
    fs::remove_file(repo.join("scratch.txt")).unwrap_or_else(|e| panic!("{e}"));

    // The version's heading gone (its entries then belong to Unreleased), committed.
    let changelog = read(&repo.join("CHANGELOG.md"));
    let heading = changelog
        .lines()
        .find(|l| l.starts_with(&format!("## [{version}] - ")))
        .unwrap_or_else(|| panic!("CHANGELOG.md has no section for {version}"))
        .to_string();
    fs::write(
        repo.join("CHANGELOG.md"),
        changelog.replacen(&format!("{heading}\n"), "", 1),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    git(&["commit", "-q", "-am", "no section"]);
    let (ok, said) = preflight(&[]);
    assert!(!ok, "a version without a section must be refused");
    assert!(
        said.contains(&format!(
            "CHANGELOG.md has no section `## [{version}] - YYYY-MM-DD`"
        )),
        "the message names the section:\n{said}"
    );
    let (ok, said) = preflight(&["--dev"]);
    assert!(ok, "--dev packs without a section:\n{said}");

    // A heading with nothing under it is no section either.
    fs::write(
        repo.join("CHANGELOG.md"),
        format!("# Changelog\n\n## [Unreleased]\n\n{heading}\n\n## [0.0.1] - 2000-01-01\n\n- x\n"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    git(&["commit", "-q", "-am", "empty section"]);
    let (ok, said) = preflight(&[]);
    assert!(!ok, "an empty section must be refused:\n{said}");
}

/// The examples in envoy/istio/ name the version this tree builds, in every image tag and
/// download path: a copied example must not point at a release that serves other paths
/// (a 0.1.0 bridge serves no `/v2` or `/v3`).
#[test]
fn the_istio_examples_name_the_workspace_version() {
    let version = workspace_version();
    let dir = repo_root().join("envoy/istio");
    let mut named = 0;
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = read(&path);
        for (i, line) in text.lines().enumerate() {
            for marker in ["weir-bridge:", "/weir/"] {
                let Some((_, after)) = line.split_once(marker) else {
                    continue;
                };
                let said: String = after
                    .chars()
                    .take_while(|c| c.is_ascii_digit() || *c == '.')
                    .collect();
                if said.is_empty() {
                    continue;
                }
                assert_eq!(
                    said.trim_end_matches('.'),
                    version,
                    "{}:{}: `{line}` names {said}, the workspace is {version}",
                    repo_relative(&path),
                    i + 1
                );
                named += 1;
            }
        }
    }
    assert!(
        named >= 2,
        "only {named} versioned references in envoy/istio"
    );
}
