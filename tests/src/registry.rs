//! A real OCI registry on 127.0.0.1 for the image tests, and the OCI image layouts moved in and
//! out of it.
//!
//! Vocabulary:
//! - **layout** — an OCI image layout directory (`oci-layout`, `index.json`, `blobs/sha256/…`),
//!   what `just oci-wasm` writes and what `skopeo copy … oci:DIR:TAG` reads and writes
//!   ([`Layout`]).
//! - **digest** — `sha256:<64 hex>` of a blob; the image's digest is its manifest's, the one a
//!   `@sha256:` reference and a registry's `Docker-Content-Digest` header name.
//! - **registry** — Debian's `docker-registry` (the CNCF distribution registry), plain HTTP on a
//!   free port, its storage in its own [`TestDir`] ([`Registry`]); `skopeo` pushes and pulls.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::http::get;
use crate::ports::free_port;
use crate::process::{wait_until, Child, TestDir};

/// The OCI manifest media type; asked for explicitly so the registry never converts.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// An OCI image layout on disk.
#[derive(Debug, Clone)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    pub fn new(dir: impl Into<PathBuf>) -> Layout {
        Layout { dir: dir.into() }
    }

    /// `index.json`.
    pub fn index(&self) -> Value {
        read_json(&self.dir.join("index.json"))
    }

    /// The digest of the manifest named `tag` in `index.json`
    /// (`org.opencontainers.image.ref.name`).
    pub fn manifest_digest(&self, tag: &str) -> String {
        let index = self.index();
        let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
        let found = manifests
            .iter()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
            .unwrap_or_else(|| panic!("{}: no manifest tagged {tag}: {index}", self.dir.display()));
        found["digest"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: manifest without a digest", self.dir.display()))
            .to_string()
    }

    /// The bytes of blob `digest`, checked against it.
    pub fn blob(&self, digest: &str) -> Vec<u8> {
        let hex = digest
            .strip_prefix("sha256:")
            .unwrap_or_else(|| panic!("not a sha256 digest: {digest}"));
        let path = self.dir.join("blobs/sha256").join(hex);
        let bytes =
            fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        assert_eq!(
            sha256_digest(&bytes),
            digest,
            "{} does not hash to its name",
            path.display()
        );
        bytes
    }

    /// The blob `digest` parsed as JSON (a manifest or a config).
    pub fn json_blob(&self, digest: &str) -> Value {
        serde_json::from_slice(&self.blob(digest))
            .unwrap_or_else(|e| panic!("blob {digest} is not JSON: {e}"))
    }

    /// Every file of the layout, relative path and bytes, sorted: two layouts are the same
    /// image byte for byte when these are equal.
    pub fn files(&self) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        collect_files(&self.dir, &self.dir, &mut out);
        out.sort();
        out
    }
}

fn collect_files(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
    let entries =
        fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    for entry in entries {
        let path = entry
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
            .path();
        if path.is_dir() {
            collect_files(root, &path, out);
        } else {
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .display()
                .to_string();
            let bytes =
                fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            out.push((rel, bytes));
        }
    }
}

fn read_json(path: &Path) -> Value {
    let text =
        fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// A distribution registry we started, killed by PID when dropped.
#[derive(Debug)]
pub struct Registry {
    // Field order matters: the process dies before its storage is removed.
    child: Child,
    _dir: TestDir,
    pub port: u16,
}

impl Registry {
    /// Starts `docker-registry serve` on a free port with a temp config and storage, and waits
    /// until `/v2/` answers 200.
    pub fn start() -> Registry {
        let bin = tool("docker-registry", "docker-registry");
        let dir = TestDir::new("registry");
        let port = free_port();
        // A fixed http secret: without one the registry logs a warning and makes one up.
        let config = format!(
            "version: 0.1\n\
             log:\n  level: warn\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: 127.0.0.1:{port}\n  secret: weir-e2e\n",
            dir.join("storage").display()
        );
        let config = dir.write("config.yml", config);
        let mut child = Child::spawn(
            "docker-registry",
            &bin,
            [Path::new("serve"), config.as_path()],
            &[],
            &dir.join("registry.log"),
        );
        let up = wait_until(Duration::from_secs(15), Duration::from_millis(50), || {
            get(port, "/v2/", &[]).is_ok_and(|r| r.status == 200)
        });
        assert!(
            up && child.is_running(),
            "docker-registry did not answer on 127.0.0.1:{port}/v2/ within 15 s:\n{}",
            child.log_tail(20)
        );
        Registry {
            child,
            _dir: dir,
            port,
        }
    }

    /// `127.0.0.1:<port>`, the host part of an image reference.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `skopeo copy` of `layout:tag` to `<host>/<repo>:<tag>`; fails rather than change the
    /// digest (`--preserve-digests`): what was built is what is served.
    pub fn push(&self, layout: &Layout, tag: &str, repo: &str) {
        let src = format!("oci:{}:{tag}", layout.dir.display());
        let dest = format!("docker://{}/{repo}:{tag}", self.host());
        skopeo(&[
            "copy",
            "--dest-tls-verify=false",
            "--preserve-digests",
            &src,
            &dest,
        ]);
    }

    /// `skopeo copy` of `<host>/<reference>` (`repo@sha256:…` or `repo:tag`) into a fresh
    /// layout at `dir`, tagged `tag` there.
    pub fn pull(&self, reference: &str, dir: &Path, tag: &str) -> Layout {
        let src = format!("docker://{}/{reference}", self.host());
        let dest = format!("oci:{}:{tag}", dir.display());
        skopeo(&["copy", "--src-tls-verify=false", &src, &dest]);
        Layout::new(dir)
    }

    /// The digest the registry serves for `<repo>:<tag>` (`Docker-Content-Digest` of the
    /// manifest, asked for as an OCI manifest).
    pub fn served_digest(&self, repo: &str, tag: &str) -> String {
        let path = format!("/v2/{repo}/manifests/{tag}");
        let r = get(self.port, &path, &[("accept", OCI_MANIFEST)])
            .unwrap_or_else(|e| panic!("GET {path}: {e}"));
        assert_eq!(r.status, 200, "GET {path}: {}", r.text());
        assert_eq!(r.header("content-type"), Some(OCI_MANIFEST), "GET {path}");
        let digest = r
            .header("docker-content-digest")
            .unwrap_or_else(|| panic!("GET {path}: no Docker-Content-Digest"))
            .to_string();
        assert_eq!(sha256_digest(&r.body), digest, "GET {path}: body vs header");
        digest
    }

    /// The registry's log so far.
    pub fn log(&self) -> String {
        self.child.log()
    }
}

/// Runs `skopeo --insecure-policy ARGS` (the host's signature policy plays no part in a test)
/// and panics with its output when it fails.
pub fn skopeo(args: &[&str]) {
    let mut cmd = Command::new(tool("skopeo", "skopeo"));
    cmd.arg("--insecure-policy").args(args);
    run_ok(&mut cmd);
}

/// Runs `cmd` to its end and returns its output; panics with the command and what it printed
/// when it cannot start or exits non-zero.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn tool(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found on PATH: run `bash scripts/setup.sh` \
                 (apt-get install -y {package})"
            )
        })
}
