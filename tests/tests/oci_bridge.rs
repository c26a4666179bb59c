//! weir-bridge's OCI image (`just oci-bridge` writes it to `target/oci/weir-bridge`) taken the
//! way a cluster takes it: pushed to a real registry (Debian's `docker-registry`, the CNCF
//! distribution registry) on 127.0.0.1, pulled back by digest, unpacked by `umoci`, and the
//! binary it contains run against a real Redis Cluster — as root, inside the image's own root
//! filesystem (`chroot`) and as the image's user, so a missing file, a dynamic loader the
//! image lacks or a need for root would show here.
//!
//! - **layout** — the OCI image layout on disk (`oci-layout`, `index.json`, `blobs/sha256/`).
//! - **bundle** — what `umoci unpack` makes of an image: `rootfs/` and the runtime
//!   `config.json` a container runtime would start (user, args, env).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use weir_e2e::{
    free_port, get, repo_root, send, wait_until, Child, Process, RedisCluster, Request, TestDir,
};

/// The ceiling docs/istio.md promises for the compressed image (2.3 MB in 0.2.0, optimised for size).
const MAX_LAYER_BYTES: usize = 4 << 20;

/// The user the image runs as (`deploy/oci/bridge/passwd`'s nonroot).
const UID: u32 = 65532;

/// `$WEIR_BRIDGE_IMAGE`, else `<target>/oci/weir-bridge`.
fn image_layout() -> PathBuf {
    let path = std::env::var_os("WEIR_BRIDGE_IMAGE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::var_os("CARGO_TARGET_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| repo_root().join("target"))
                .join("oci/weir-bridge")
        });
    assert!(
        path.join("index.json").is_file(),
        "no weir-bridge image at {}: build it with `just oci-bridge`, or set WEIR_BRIDGE_IMAGE",
        path.display()
    );
    path
}

fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One image of a layout: its tag, its manifest digest and the blobs it names.
struct Image {
    layout: PathBuf,
    tag: String,
    manifest: String,
}

impl Image {
    /// The layout's only image.
    fn open(layout: &Path) -> Image {
        let index = read_json(&layout.join("index.json"));
        let manifests = index["manifests"].as_array().cloned().unwrap_or_default();
        assert_eq!(
            manifests.len(),
            1,
            "{}: one image expected",
            layout.display()
        );
        let entry = &manifests[0];
        Image {
            layout: layout.to_path_buf(),
            tag: entry["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .unwrap_or_else(|| panic!("{}: the image has no tag", layout.display()))
                .to_string(),
            manifest: entry["digest"].as_str().unwrap_or_default().to_string(),
        }
    }

    fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest
            .strip_prefix("sha256:")
            .unwrap_or_else(|| panic!("not a sha256 digest: {digest}"));
        self.layout.join("blobs/sha256").join(hex)
    }

    /// A blob's bytes, checked against its digest.
    fn blob(&self, digest: &str) -> Vec<u8> {
        let path = self.blob_path(digest);
        let bytes =
            std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        assert_eq!(
            format!("sha256:{}", sha256_hex(&bytes)),
            digest,
            "{} does not hash to its name",
            path.display()
        );
        bytes
    }

    fn json(&self, digest: &str) -> Value {
        serde_json::from_slice(&self.blob(digest)).unwrap_or_else(|e| panic!("{digest}: {e}"))
    }

    /// Every blob the image is made of: the manifest, the config, the layers.
    fn blobs(&self) -> Vec<String> {
        let manifest = self.json(&self.manifest);
        let mut digests = vec![
            self.manifest.clone(),
            manifest["config"]["digest"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ];
        for layer in manifest["layers"].as_array().cloned().unwrap_or_default() {
            digests.push(layer["digest"].as_str().unwrap_or_default().to_string());
        }
        digests
    }

    /// The digest of the image's one layer.
    fn layer(&self) -> String {
        let layers = self.json(&self.manifest)["layers"].clone();
        let layers = layers.as_array().cloned().unwrap_or_default();
        assert_eq!(layers.len(), 1, "weir-bridge's image is one layer");
        layers[0]["digest"].as_str().unwrap_or_default().to_string()
    }

    fn config(&self) -> Value {
        let manifest = self.json(&self.manifest);
        self.json(manifest["config"]["digest"].as_str().unwrap_or_default())
    }
}

/// Runs `program args`, panicking with its output (and how to install it) when it fails.
fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap_or_else(|e| {
        panic!("cannot run {program} ({e}): run `bash scripts/setup.sh` (apt-get install {program})")
    });
    assert!(
        out.status.success(),
        "{program} {} failed ({}):\n{}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The distribution registry on a free loopback port, storing into its own test dir;
/// killed by PID on drop.
struct Registry {
    port: u16,
    // Field order: the process dies before its directory goes.
    _child: Child,
    _dir: TestDir,
}

impl Registry {
    fn start() -> Registry {
        let dir = TestDir::new("registry");
        let port = free_port();
        let storage = dir.join("storage");
        let config = dir.write(
            "config.yml",
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: 127.0.0.1:{port}\n",
                storage.display()
            ),
        );
        let config = config.display().to_string();
        let mut child = Child::spawn(
            "docker-registry",
            "docker-registry",
            ["serve", config.as_str()],
            &[],
            &dir.join("registry.log"),
        );
        let up = wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
            get(port, "/v2/", &[]).is_ok_and(|r| r.status == 200)
        });
        assert!(
            up,
            "the registry did not answer GET /v2/ in 20 s (running: {}); log:\n{}",
            child.is_running(),
            child.log()
        );
        Registry {
            port,
            _child: child,
            _dir: dir,
        }
    }

    fn reference(&self, name: &str) -> String {
        format!("docker://127.0.0.1:{}/{name}", self.port)
    }
}

/// skopeo with a policy of its own: a fresh machine's /etc/containers/policy.json may be
/// missing or stricter, and the test must not depend on either.
fn skopeo(dir: &TestDir, args: &[&str]) -> String {
    let policy = dir.write(
        "policy.json",
        r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
    );
    let policy = policy.display().to_string();
    let mut all = vec!["--policy", policy.as_str()];
    all.extend_from_slice(args);
    run("skopeo", &all)
}

/// Whether `elf` asks for a program interpreter (`PT_INTERP`): a dynamically linked binary,
/// which would not start in an image holding no `ld.so`.
fn has_interpreter(elf: &[u8]) -> bool {
    let word = |at: usize, n: usize| -> u64 {
        elf.get(at..at + n)
            .map(|b| {
                b.iter()
                    .rev()
                    .fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
            })
            .unwrap_or_else(|| panic!("truncated ELF header"))
    };
    assert_eq!(elf.get(..4), Some(&b"\x7fELF"[..]), "not an ELF binary");
    assert_eq!(elf.get(4), Some(&2), "not a 64-bit ELF");
    let (phoff, phentsize, phnum) = (word(0x20, 8), word(0x36, 2), word(0x38, 2));
    (0..phnum).any(|i| word((phoff + i * phentsize) as usize, 4) == 3)
}

const ACQUIRE: &str = r#"{"domain":"weir","items":[{"id":1,"rule":"oci-image","descriptor":["=acme"],
  "limit":{"algorithm":"token_bucket","capacity":2,"refill":1,"period_us":3600000000},
  "cost":1,"want":1}]}"#;

const SECRET: &str = "oci-test-secret";

#[test]
fn the_image_goes_through_a_registry_byte_for_byte_and_its_binary_serves_as_nonroot() {
    let started = Instant::now();
    let built = Image::open(&image_layout());
    let work = TestDir::new("oci-bridge");
    let pulled = push_and_pull_by_digest(&built, &work);
    let bundle = Bundle::unpack(&pulled, &work.join("bundle"));

    let redis = RedisCluster::start(3, 0);
    let (mut bridge, port) = bundle.start(&redis);
    let healthy = wait_until(Duration::from_secs(20), Duration::from_millis(50), || {
        get(port, "/healthz", &[]).is_ok_and(|r| r.status == 200 && r.text() == "ok")
    });
    assert!(
        healthy,
        "the image's weir-bridge not healthy in 20 s (running: {}); log:\n{}",
        bridge.is_running(),
        bridge.log()
    );
    if euid() == 0 {
        check_runs_unprivileged(bridge.pid());
    }

    // Decisions from Redis: a bucket of 2 admits two requests and refuses the third.
    let acquire = |secret: &str| {
        let reply = send(
            port,
            Request::post("/v2/acquire", ACQUIRE)
                .header("content-type", "application/json")
                .header("x-weir-secret", secret),
        )
        .unwrap_or_else(|e| panic!("POST /v2/acquire: {e}\n{}", bridge.log()));
        (reply.status, reply.text())
    };
    let mut allowed = Vec::new();
    for _ in 0..3 {
        let (status, body) = acquire(SECRET);
        assert_eq!(status, 200, "{body}");
        let reply: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        let item = &reply["items"][0];
        assert_eq!(item["id"], 1, "{body}");
        assert_eq!(item["limit"], 2, "{body}");
        allowed.push(item["allowed"].as_bool().unwrap_or_default());
    }
    assert_eq!(allowed, [true, true, false]);
    let (status, _) = acquire("wrong");
    assert_eq!(status, 401, "a call with a wrong secret is refused");

    bridge.kill();
    let layer_bytes = built.blob(&built.layer()).len();
    eprintln!(
        "image {} ({layer_bytes} bytes of layer) pushed, pulled, unpacked and served in {:.1} s",
        built.manifest,
        started.elapsed().as_secs_f64()
    );
    assert!(
        layer_bytes < MAX_LAYER_BYTES,
        "the image's layer is {layer_bytes} bytes, over {MAX_LAYER_BYTES}: what grew?"
    );
}

/// Pushes `built` by tag to a fresh registry, checks the registry serves the manifest as
/// built (the digest a Deployment pins is the one `just oci-bridge` printed), and pulls it
/// back by digest into a layout under `work` whose every blob equals ours.
fn push_and_pull_by_digest(built: &Image, work: &TestDir) -> Image {
    let registry = Registry::start();
    let repo = registry.reference("weir/weir-bridge");
    let source = format!("oci:{}:{}", built.layout.display(), built.tag);
    let tagged = format!("{repo}:{}", built.tag);
    skopeo(
        work,
        &[
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            &source,
            &tagged,
        ],
    );
    let raw = skopeo(work, &["inspect", "--raw", "--tls-verify=false", &tagged]);
    assert_eq!(
        format!("sha256:{}", sha256_hex(raw.as_bytes())),
        built.manifest,
        "the registry serves another manifest than the one built"
    );

    let pulled_dir = work.join("pulled");
    let pulled_ref = format!("oci:{}:pulled", pulled_dir.display());
    let by_digest = format!("{repo}@{}", built.manifest);
    skopeo(
        work,
        &[
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            &by_digest,
            &pulled_ref,
        ],
    );
    let pulled = Image::open(&pulled_dir);
    assert_eq!(pulled.manifest, built.manifest);
    for digest in built.blobs() {
        assert_eq!(pulled.blob(&digest), built.blob(&digest), "blob {digest}");
    }
    let config = pulled.config();
    assert_eq!(config["config"]["User"], format!("{UID}:{UID}"));
    assert_eq!(config["config"]["Entrypoint"], json!(["/weir-bridge"]));
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    pulled
}

/// The image as `umoci unpack` hands it to a container runtime: the root filesystem and
/// the process's environment, checked.
struct Bundle {
    rootfs: PathBuf,
    env: Vec<(String, String)>,
}

impl Bundle {
    fn unpack(image: &Image, dir: &Path) -> Bundle {
        let reference = format!("{}:{}", image.layout.display(), image.tag);
        let dir_arg = dir.display().to_string();
        run(
            "umoci",
            &["unpack", "--rootless", "--image", &reference, &dir_arg],
        );
        let runtime = read_json(&dir.join("config.json"));
        let process = &runtime["process"];
        assert_eq!(process["user"]["uid"], UID, "{runtime:#}");
        assert_eq!(process["user"]["gid"], UID, "{runtime:#}");
        assert_eq!(process["args"], json!(["/weir-bridge"]), "{runtime:#}");
        let env: Vec<(String, String)> = process["env"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter_map(|v| v.as_str()?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        assert!(
            env.iter()
                .any(|(k, v)| k == "WEIR_BRIDGE_LISTEN" && v == "0.0.0.0:8081"),
            "the image must listen beyond loopback: {env:?}"
        );

        let rootfs = dir.join("rootfs");
        let binary = std::fs::read(rootfs.join("weir-bridge")).unwrap_or_default();
        assert!(
            !has_interpreter(&binary),
            "the image's weir-bridge is dynamically linked; the image has no loader"
        );
        let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap_or_default();
        assert!(
            passwd.contains(&format!(":{UID}:{UID}:")),
            "no user {UID} in /etc/passwd:\n{passwd}"
        );
        let mut files = Vec::new();
        list_files(&rootfs, &rootfs, &mut files);
        files.sort();
        assert_eq!(
            files,
            [
                "etc/group",
                "etc/passwd",
                "etc/ssl/certs/ca-certificates.crt",
                "weir-bridge"
            ],
            "the image holds exactly the binary, the users and the CA bundle"
        );
        Bundle { rootfs, env }
    }

    /// Starts the image's binary with the image's environment, then the test's listen
    /// address, Redis seeds and secret on top. As root: `chroot` into the root filesystem as
    /// the image's user, so only the image's files exist for it, as in a pod.
    fn start(&self, redis: &RedisCluster) -> (Process, u16) {
        let port = free_port();
        let mut vars = self.env.clone();
        vars.extend([
            ("WEIR_BRIDGE_LISTEN".into(), format!("127.0.0.1:{port}")),
            (
                "WEIR_BRIDGE_REDIS_NODES".into(),
                redis.seed_nodes().join(","),
            ),
            ("WEIR_BRIDGE_SECRET".into(), SECRET.into()),
            // Stopped by the test, not rolled: no drain to wait for.
            ("WEIR_BRIDGE_DRAIN_DELAY".into(), "0s".into()),
            // As the other end-to-end tests' bridges (tests/src/bridge.rs): a loaded CI
            // machine's first script calls can take longer than the 40 ms default.
            ("WEIR_BRIDGE_REDIS_TIMEOUT".into(), "100ms".into()),
        ]);
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let process = if euid() == 0 {
            let rootfs = self.rootfs.display().to_string();
            let userspec = format!("--userspec={UID}:{UID}");
            Process::spawn("chroot", [&userspec, &rootfs, "/weir-bridge"], &vars)
        } else {
            eprintln!(
                "not root: running {}/weir-bridge directly (no chroot, as this user)",
                self.rootfs.display()
            );
            Process::spawn(self.rootfs.join("weir-bridge"), Vec::<&str>::new(), &vars)
        };
        (process, port)
    }
}

/// The process runs as the image's user with no capabilities: what a pod with
/// `runAsNonRoot` and `capabilities: {drop: [ALL]}` allows.
fn check_runs_unprivileged(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    let uid = UID.to_string();
    assert_eq!(
        field("Uid:"),
        [uid.as_str(); 4],
        "real, effective, saved, fs uid"
    );
    assert_eq!(
        field("Gid:"),
        [uid.as_str(); 4],
        "real, effective, saved, fs gid"
    );
    assert_eq!(field("CapEff:"), ["0000000000000000"], "{status}");
}

/// The image's bytes depend on its inputs alone: the layout writer run twice on the image's
/// own binary, with the tag, time and revision the image records, writes the same manifest.
#[test]
fn the_layout_writer_gives_the_same_digest_for_the_same_inputs() {
    let built = Image::open(&image_layout());
    let config = built.config();
    let labels = &config["config"]["Labels"];
    let created = labels["org.opencontainers.image.created"]
        .as_str()
        .unwrap_or_default();
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap_or_default();
    let epoch = run("date", &["-u", "-d", created, "+%s"]);
    let work = TestDir::new("oci-bridge-repro");
    let layer = built.layer();
    let layer_path = built.blob_path(&layer).display().to_string();
    let unpacked = work.join("rootfs");
    std::fs::create_dir_all(&unpacked).unwrap_or_default();
    run(
        "tar",
        &[
            "-xzf",
            &layer_path,
            "-C",
            &unpacked.display().to_string(),
            "weir-bridge",
        ],
    );
    let binary = unpacked.join("weir-bridge").display().to_string();
    let script = repo_root()
        .join("scripts/oci-bridge.py")
        .display()
        .to_string();
    let mut digests = Vec::new();
    for attempt in ["a", "b"] {
        let out = work.join(attempt).display().to_string();
        run(
            "python3",
            &[
                &script,
                &binary,
                &out,
                "--tag",
                &built.tag,
                "--epoch",
                epoch.trim(),
                "--revision",
                revision,
            ],
        );
        digests.push(Image::open(Path::new(&out)).manifest);
    }
    assert_eq!(digests, [built.manifest.clone(), built.manifest]);
}

/// Regular files under `dir`, relative to `root`.
fn list_files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.map(|e| e.path()).unwrap_or_default();
        if path.is_dir() {
            list_files(root, &path, out);
        } else {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push(rel.display().to_string());
        }
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}
