#!/usr/bin/env python3
"""Packs a weir release into one folder: the two images, the manifests pinned to them, checksums.

    python3 scripts/release.py --preflight [--dev]
    python3 scripts/release.py --wasm WASM --bridge-binary BIN --weir-check BIN [--out DIR] [--dev]

`just release` runs the preflight, builds (weir.wasm, the static weir-bridge, weir-check), then
packs; `just release --dev` does the same on a tree that is not a release. The folder,
target/release-VERSION (target/release-VERSION-dev for --dev, or --out):

    weir.wasm                 the filter, for a ConfigMap, `file://` or `https://`
    weir-wasm/                weir.wasm as an OCI image layout (scripts/oci-wasm.sh), for `oci://`
    weir-bridge/              weir-bridge's OCI image layout (scripts/oci-bridge.py)
    manifests/OVERLAY.yaml    each overlay of deploy/kubernetes rendered by kubectl's kustomize,
                              weir's two images pinned to the digests above, every object
                              labelled app.kubernetes.io/version
    alerts/, dashboards/      deploy/alerts' rules and deploy/dashboards' Grafana dashboard
    RELEASE.md                version, commit, digests, what is left to pin, the changelog section
    SHA256SUMS                every other file, for `sha256sum -c SHA256SUMS`

The version is the workspace's (Cargo.toml, [workspace.package]), the one the crates take, and
the built binaries must say so (`--version`): a stale build is refused. A release (no --dev)
needs a clean work tree and a CHANGELOG.md section `## [VERSION] - YYYY-MM-DD` with entries.

Reproducible: the images are (see their scripts: timestamps from the commit, nothing of the
host); kustomize's output depends on the sources alone; files are listed sorted. The same
commit and toolchain give the same SHA256SUMS. The placeholders of the sources are replaced
in the rendered copies only; deploy/ is never written.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ZERO = "0" * 64

# The image references of the sources (deploy/kubernetes) that a release pins: the bridge's
# Deployment image and the WasmPlugins' `url` + `sha256` (the image's manifest digest, which
# istio-agent checks; docs/istio.md).
BRIDGE_IMAGE = re.compile(r"(image: \S+/weir-bridge)@sha256:" + ZERO)
WASM_URL = re.compile(r"(url: oci://\S+/weir-wasm)@sha256:" + ZERO)
WASM_SHA = re.compile(r'(sha256: )"' + ZERO + '"')
PLACEHOLDER = re.compile(r"\S+@sha256:" + ZERO)


def fail(message):
    sys.exit(f"release: {message}")


def run(args, **kwargs):
    """Runs a command to its end; its output, or the release fails with what it printed."""
    done = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        fail(f"{' '.join(map(str, args))} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def version():
    """The workspace version: Cargo.toml's [workspace.package] version."""
    with open(ROOT / "Cargo.toml", "rb") as f:
        found = tomllib.load(f).get("workspace", {}).get("package", {}).get("version")
    if not found:
        fail("Cargo.toml has no [workspace.package] version")
    return found


def changelog_section(ver):
    """The entries of CHANGELOG.md's `## [VER] - YYYY-MM-DD` section, or None."""
    text = (ROOT / "CHANGELOG.md").read_text()
    heading = re.compile(r"^## \[" + re.escape(ver) + r"\] - \d{4}-\d{2}-\d{2}$", re.M)
    m = heading.search(text)
    if not m:
        return None
    rest = text[m.end():]
    end = re.search(r"^## ", rest, re.M)
    body = rest[: end.start()] if end else rest
    if not re.search(r"^- ", body, re.M):
        return None
    return m.group(0) + body.rstrip() + "\n"


def dirty():
    """What `git status --porcelain` lists (untracked files included; ignored ones not)."""
    return run(["git", "-C", ROOT, "status", "--porcelain"]).rstrip("\n")


def preflight(ver, dev):
    """A release needs a clean tree and a changelog section; --dev only warns."""
    problems = []  # (what is wrong, what to do)
    changes = dirty()
    if changes:
        problems.append((
            "the work tree has changes no commit holds:\n"
            + "\n".join("    " + line for line in changes.splitlines()[:20]),
            "commit or stash them",
        ))
    if changelog_section(ver) is None:
        problems.append((
            f"CHANGELOG.md has no section `## [{ver}] - YYYY-MM-DD` with entries",
            "move the Unreleased entries under one (Keep a Changelog), or set the version "
            "of Cargo.toml's [workspace.package]",
        ))
    for problem, fix in problems:
        if dev:
            print(f"release: --dev: packing although {problem}", file=sys.stderr)
        else:
            fail(f"refusing to release {ver}: {problem}\n  {fix}; or `just release --dev` "
                 "for a dev build")


def check_binary_version(binary, name, ver):
    said = run([binary, "--version"]).strip()
    if said != f"{name} {ver}":
        fail(f"{binary} --version says {said!r}, not '{name} {ver}': a stale build? "
             "`just release` builds it")


def kubectl():
    return os.environ.get("KUBECTL_BIN") or str(ROOT / ".tools/venv/bin/kubectl")


def index_digest(layout):
    index = json.loads((layout / "index.json").read_text())
    (entry,) = index["manifests"]
    return entry["digest"]


def pin(text, overlay, ver, bridge, wasm):
    """The rendered overlay with weir's image placeholders replaced by the built digests."""
    hex_wasm = wasm.removeprefix("sha256:")
    # The tag is for people (`kubectl get pods -o wide`); the digest is what is pulled.
    text, n_bridge = BRIDGE_IMAGE.subn(lambda m: f"{m.group(1)}:{ver}@{bridge}", text)
    text, n_url = WASM_URL.subn(lambda m: f"{m.group(1)}@{wasm}", text)
    text, n_sha = WASM_SHA.subn(lambda m: f'{m.group(1)}"{hex_wasm}"', text)
    if n_bridge == 0:
        fail(f"overlay {overlay}: no `image: …/weir-bridge@sha256:{ZERO}` to pin: "
             "did the placeholder in deploy/kubernetes change?")
    if n_sha != n_url:
        fail(f"overlay {overlay}: {n_url} oci:// urls of weir-wasm but {n_sha} sha256 "
             "placeholders: each WasmPlugin pins the image twice")
    return text


def render(overlay, ver, bridge, wasm, scratch):
    """`kubectl kustomize` of the overlay, pinned, then labelled with the version by a
    kustomization around the pinned file (kustomize's own labels transformer, pod templates
    included, selectors not: they are immutable)."""
    rendered = run([kubectl(), "kustomize", ROOT / "deploy/kubernetes/overlays" / overlay])
    wrap = scratch / overlay
    wrap.mkdir()
    (wrap / "pinned.yaml").write_text(pin(rendered, overlay, ver, bridge, wasm))
    (wrap / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "resources:\n- pinned.yaml\n"
        "labels:\n- pairs:\n"
        f'    app.kubernetes.io/version: "{ver}"\n'
        "  includeSelectors: false\n  includeTemplates: true\n"
    )
    return run([kubectl(), "kustomize", wrap])


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def files_under(out):
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def notes(ver, dev, revision, digests, placeholders, section):
    lines = [f"# weir {ver}{' (dev build)' if dev else ''}", ""]
    if dev:
        lines += ["A dev build (`just release --dev`): not a release; the tree or the changelog "
                  "was not ready.", ""]
    lines += [
        f"Commit `{revision}`. Install: docs/istio.md, \"Installing a release\" "
        "(verify with `sha256sum -c SHA256SUMS` first).",
        "",
        "| image | layout | digest |",
        "|---|---|---|",
    ]
    for name, digest in digests:
        lines.append(f"| {name} | `{name}/` (tag `{ver}`) | `{digest}` |")
    lines += ["", "The manifests name these digests. Still to pin or set in your copy:", ""]
    lines += [f"- `{p}`" for p in placeholders] or ["- nothing"]
    lines += ["- the registry (`registry.example.com/weir/`), the Redis address and the "
              "Secrets' values (docs/kubernetes.md)", ""]
    if section:
        lines += ["## Changes", "", section.split("\n", 1)[1].strip(), ""]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preflight", action="store_true",
                        help="only check the tree and the changelog (before building)")
    parser.add_argument("--dev", action="store_true",
                        help="a dev build: a dirty tree or no changelog section only warn")
    parser.add_argument("--wasm", type=Path, help="the built weir.wasm")
    parser.add_argument("--bridge-binary", type=Path, help="the static (musl) weir-bridge")
    parser.add_argument("--weir-check", type=Path, help="the built weir-check")
    parser.add_argument("--out", type=Path, help="the folder (replaced)")
    args = parser.parse_args()

    ver = version()
    preflight(ver, args.dev)
    if args.preflight:
        return
    for flag in ("wasm", "bridge_binary", "weir_check"):
        path = getattr(args, flag)
        if path is None or not path.is_file():
            fail(f"--{flag.replace('_', '-')} {path}: not a file (`just release` builds it)")
    check_binary_version(args.bridge_binary, "weir-bridge", ver)
    check_binary_version(args.weir_check, "weir-check", ver)

    revision = run(["git", "-C", ROOT, "rev-parse", "HEAD"]).strip()
    epoch = run(["git", "-C", ROOT, "log", "-1", "--format=%ct"]).strip()
    out = args.out or ROOT / "target" / f"release-{ver}{'-dev' if args.dev else ''}"
    out = out.resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    shutil.copyfile(args.wasm, out / "weir.wasm")
    env = dict(os.environ, SOURCE_DATE_EPOCH=epoch)
    run(["bash", ROOT / "scripts/oci-wasm.sh", args.wasm, out / "weir-wasm", ver], env=env)
    run([sys.executable, ROOT / "scripts/oci-bridge.py", args.bridge_binary, out / "weir-bridge",
         "--tag", ver, "--epoch", epoch, "--revision", revision])
    wasm = index_digest(out / "weir-wasm")
    bridge = index_digest(out / "weir-bridge")

    (out / "manifests").mkdir()
    placeholders = []
    overlays = sorted(p.name for p in (ROOT / "deploy/kubernetes/overlays").iterdir()
                      if (p / "kustomization.yaml").is_file())
    with tempfile.TemporaryDirectory() as scratch:
        for overlay in overlays:
            text = render(overlay, ver, bridge, wasm, Path(scratch))
            (out / "manifests" / f"{overlay}.yaml").write_text(text)
            placeholders += [f"manifests/{overlay}.yaml: {m}" for m in PLACEHOLDER.findall(text)]

    (out / "alerts").mkdir()
    for name in ("prometheusrule.yaml", "weir-rules.yaml"):
        shutil.copyfile(ROOT / "deploy/alerts" / name, out / "alerts" / name)
    (out / "dashboards").mkdir()
    shutil.copyfile(ROOT / "deploy/dashboards/weir.json", out / "dashboards/weir.json")

    digests = [("weir-wasm", wasm), ("weir-bridge", bridge)]
    (out / "RELEASE.md").write_text(
        notes(ver, args.dev, revision, digests, placeholders, changelog_section(ver)))

    sums = "".join(f"{sha256(out / name)}  {name}\n" for name in files_under(out))
    (out / "SHA256SUMS").write_text(sums)

    print(f"release {ver}{' (dev)' if args.dev else ''}: {out}")
    for name, digest in digests:
        print(f"  {name:<12} {digest}")
    for p in placeholders:
        print(f"  still a placeholder: {p}")
    print(f"  SHA256SUMS   sha256:{sha256(out / 'SHA256SUMS')} ({len(sums.splitlines())} files)")


if __name__ == "__main__":
    main()
