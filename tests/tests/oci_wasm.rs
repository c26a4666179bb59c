//! `weir.wasm` as an OCI image (`just oci-wasm`, scripts/oci-wasm.sh): the layout is the form
//! Istio's Wasm image fetcher reads, the same module gives the same image digest, and a real
//! registry serves, by digest, an image whose module is the built `weir.wasm` byte for byte.
//!
//! The module is read from the image the way istio-agent reads it (pkg/wasm/imagefetcher.go,
//! "compat" variant, read from its source, not run): the manifest's last layer, of media type
//! `application/vnd.oci.image.layer.v1.tar+gzip`, gunzipped and untarred, the entry whose base
//! name is `plugin.wasm`. istio-agent then checks a WasmPlugin's `sha256` against the
//! *manifest* digest (pkg/wasm/cache.go), which is why the shipped examples pin that one.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use serde_json::Value;
use weir_e2e::registry::{run_ok, sha256_digest, Layout, Registry, OCI_MANIFEST};
use weir_e2e::{repo_root, weir_wasm, TestDir};

const TAG: &str = "0.1.0-test";
const REPO: &str = "weir/weir-wasm";
const COMPAT_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// Runs scripts/oci-wasm.sh on `wasm` into `out`, as `just oci-wasm` does.
fn build_image(wasm: &Path, out: &Path) -> Layout {
    build_image_at(wasm, out, None)
}

/// [`build_image`] with SOURCE_DATE_EPOCH set to `epoch` (unset: the commit time of HEAD).
fn build_image_at(wasm: &Path, out: &Path, epoch: Option<&str>) -> Layout {
    let script = repo_root().join("scripts/oci-wasm.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script).arg(wasm).arg(out).arg(TAG);
    match epoch {
        Some(epoch) => cmd.env("SOURCE_DATE_EPOCH", epoch),
        None => cmd.env_remove("SOURCE_DATE_EPOCH"),
    };
    run_ok(&mut cmd);
    Layout::new(out)
}

/// The digest of the one layer of the image tagged [`TAG`].
fn layer_digest(layout: &Layout) -> String {
    let manifest = layout.json_blob(&layout.manifest_digest(TAG));
    manifest["layers"][0]["digest"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The module istio-agent would load from the image `digest` of `layout`.
fn module_as_istio_reads_it(layout: &Layout, digest: &str, scratch: &Path) -> Vec<u8> {
    let manifest = layout.json_blob(digest);
    let layers = manifest["layers"].as_array().cloned().unwrap_or_default();
    let last = layers
        .last()
        .unwrap_or_else(|| panic!("manifest {digest} has no layers: {manifest}"));
    assert_eq!(last["mediaType"], COMPAT_LAYER, "the layer Istio reads");
    let layer_digest = last["digest"].as_str().unwrap_or_default();
    let blob = layout.blob(layer_digest);
    assert_eq!(last["size"], blob.len(), "layer size in the manifest");

    let tarball = scratch.join("layer.tar.gz");
    fs::write(&tarball, &blob).unwrap_or_else(|e| panic!("{}: {e}", tarball.display()));
    let list = run_ok(Command::new("tar").arg("-tzf").arg(&tarball));
    assert_eq!(
        String::from_utf8_lossy(&list.stdout),
        "plugin.wasm\n",
        "the layer holds plugin.wasm and nothing else"
    );
    let unpack = scratch.join("unpacked");
    fs::create_dir_all(&unpack).unwrap_or_else(|e| panic!("{}: {e}", unpack.display()));
    run_ok(
        Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&unpack),
    );
    let module = unpack.join("plugin.wasm");
    fs::read(&module).unwrap_or_else(|e| panic!("{}: {e}", module.display()))
}

/// The layout is the compat variant, with nothing of the build host in it.
#[test]
fn image_has_the_form_istio_reads() {
    let wasm = weir_wasm();
    let module = fs::read(&wasm).unwrap_or_else(|e| panic!("{}: {e}", wasm.display()));
    let dir = TestDir::new("oci-wasm-form");
    let layout = build_image(&wasm, &dir.join("layout"));

    assert_eq!(
        fs::read_to_string(layout.dir.join("oci-layout"))
            .ok()
            .as_deref(),
        Some(r#"{"imageLayoutVersion":"1.0.0"}"#)
    );
    let digest = layout.manifest_digest(TAG);
    let manifest = layout.json_blob(&digest);
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["mediaType"], OCI_MANIFEST);
    assert_eq!(
        manifest["annotations"]["module.wasm.image/variant"], "compat",
        "the compat variant with OCI media types carries this annotation"
    );
    assert_eq!(manifest["layers"].as_array().map(Vec::len), Some(1));

    let config = layout.json_blob(manifest["config"]["digest"].as_str().unwrap_or_default());
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.oci.image.config.v1+json"
    );
    // The Go names of a WASI preview 1 module, not the build host's (amd64/linux).
    assert_eq!(config["architecture"], "wasm");
    assert_eq!(config["os"], "wasip1");

    let got = module_as_istio_reads_it(&layout, &digest, dir.path());
    assert!(got == module, "plugin.wasm in the image is not weir.wasm");
    // The layer's uncompressed tar is what config.rootfs.diff_ids names.
    let tar = run_ok(
        Command::new("gzip")
            .arg("-dc")
            .arg(dir.join("layer.tar.gz")),
    );
    assert_eq!(
        config["rootfs"]["diff_ids"],
        Value::from(vec![sha256_digest(&tar.stdout)])
    );
}

/// The same module gives the same image, byte for byte, wherever and whenever it is packed:
/// another copy of the file (another path, mtime and mode), packed again a second later. The
/// layer depends on the module alone; `created` (the commit's time) only on the config and
/// manifest.
#[test]
fn same_module_gives_the_same_digest() {
    let wasm = weir_wasm();
    let dir = TestDir::new("oci-wasm-repro");
    let first = build_image(&wasm, &dir.join("first"));

    let copy = dir.join("elsewhere/weir.wasm");
    fs::create_dir_all(dir.join("elsewhere")).unwrap_or_else(|e| panic!("mkdir: {e}"));
    fs::copy(&wasm, &copy).unwrap_or_else(|e| panic!("copy weir.wasm: {e}"));
    fs::set_permissions(&copy, fs::Permissions::from_mode(0o600))
        .unwrap_or_else(|e| panic!("chmod: {e}"));
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let second = build_image(&copy, &dir.join("second"));

    assert_eq!(first.manifest_digest(TAG), second.manifest_digest(TAG));
    let (a, b) = (first.files(), second.files());
    let names = |files: &[(String, Vec<u8>)]| files.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b));
    assert!(a == b, "the two layouts differ in content");

    // Another moment (as another commit's time): another image, the same layer.
    let later = build_image_at(&wasm, &dir.join("later"), Some("2000000000"));
    assert_ne!(later.manifest_digest(TAG), first.manifest_digest(TAG));
    assert_eq!(layer_digest(&later), layer_digest(&first));
}

/// Pushed to a real registry, pulled back by digest into a fresh layout: the registry serves
/// the digest that was built, and the module in what came back is `weir.wasm`.
#[test]
fn registry_round_trip_by_digest() {
    let started = Instant::now();
    let wasm = weir_wasm();
    let module = fs::read(&wasm).unwrap_or_else(|e| panic!("{}: {e}", wasm.display()));
    let dir = TestDir::new("oci-wasm-registry");
    let built = build_image(&wasm, &dir.join("built"));
    let digest = built.manifest_digest(TAG);

    let registry = Registry::start();
    registry.push(&built, TAG, REPO);
    assert_eq!(
        registry.served_digest(REPO, TAG),
        digest,
        "the registry serves another digest for the tag than was built"
    );

    let pulled = registry.pull(&format!("{REPO}@{digest}"), &dir.join("pulled"), "pulled");
    assert_eq!(pulled.manifest_digest("pulled"), digest);
    let got = module_as_istio_reads_it(&pulled, &digest, dir.path());
    assert_eq!(
        sha256_digest(&got),
        sha256_digest(&module),
        "the module pulled by digest is not the built weir.wasm"
    );
    eprintln!(
        "oci-wasm: image {digest}, module {} ({} bytes), round trip in {:?}",
        sha256_digest(&module),
        module.len(),
        started.elapsed()
    );
}

/// Every shipped WasmPlugin that pulls an image pins it by digest, in the url and in `sha256`
/// alike (tests/src/istio/plugins.rs holds them equal, as istio-agent does), and names the
/// repository `just oci-wasm` prints the push command for.
#[test]
fn shipped_oci_plugins_pin_the_image_digest() {
    let pinned: Vec<_> = weir_e2e::istio::shipped()
        .into_iter()
        .filter(|r| r.kind() == "WasmPlugin")
        .filter(|r| r.spec()["url"].as_str().unwrap_or("").starts_with("oci://"))
        .collect();
    assert!(!pinned.is_empty(), "no shipped WasmPlugin pulls an image");
    for r in &pinned {
        let url = r.spec()["url"].as_str().unwrap_or_default();
        let (image, digest) = url
            .split_once("@sha256:")
            .unwrap_or_else(|| panic!("{}: {url} is not pinned by digest", r.source));
        assert!(image.ends_with(&format!("/{REPO}")), "{}: {url}", r.source);
        assert_eq!(
            r.spec()["sha256"].as_str(),
            Some(digest),
            "{}: sha256 must repeat the url's digest",
            r.source
        );
        weir_e2e::istio::wasm_plugin(r);
    }
}

/// A WasmPlugin whose `sha256` is the module's rather than the image's is refused, as
/// istio-agent would refuse every pull of it.
#[test]
#[should_panic(expected = "sha256 of an oci:// url is the image (manifest) digest")]
fn module_sha256_beside_an_image_digest_is_refused() {
    let image = "a".repeat(64);
    let module = "b".repeat(64);
    let yaml = format!(
        "apiVersion: extensions.istio.io/v1alpha1\n\
         kind: WasmPlugin\n\
         metadata: {{name: weir, namespace: shop}}\n\
         spec:\n  url: oci://registry.example.com/{REPO}@sha256:{image}\n  sha256: {module}\n  \
         pluginName: weir\n  pluginConfig: {{rules: []}}\n"
    );
    let resources = weir_e2e::istio::parse_yaml_docs(&yaml, "mismatched pins");
    weir_e2e::istio::wasm_plugin(&resources[0]);
}
