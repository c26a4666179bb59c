#!/usr/bin/env python3
"""Writes weir-bridge's OCI image layout without a container daemon or builder.

    python3 scripts/oci-bridge.py BINARY OUT_DIR --tag 0.1.0 --epoch 1700000000 --revision abc123

The image is one gzip layer on nothing (like `FROM scratch`):

    /weir-bridge                       the static (musl) binary, 0755
    /etc/passwd, /etc/group            root and nonroot (65532), from deploy/oci/bridge/
    /etc/ssl/certs/ca-certificates.crt the CA bundle, for --redis-tls without --redis-ca-file

and a config that runs `/weir-bridge` as 65532:65532 with WEIR_BRIDGE_LISTEN=0.0.0.0:8081.

Reproducible: every timestamp in the tar and the config is --epoch (the recipe passes the
commit's time), owners are numeric 0:0, entries are written in a fixed order, and gzip
gets mtime 0 and no file name. The digest is then a function of the inputs alone: the
binary (commit and toolchain), the CA bundle (the build machine's ca-certificates package),
--tag, --epoch, --revision, and the zlib that compresses the layer. The layout is written to
a fresh directory, so a blob of an older build never lingers in it.
"""

import argparse
import gzip
import hashlib
import io
import json
import shutil
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ROOT / "deploy" / "oci" / "bridge"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

# The user of distroless' "nonroot": no shell, no home, no capabilities; Kubernetes'
# runAsNonRoot can check a numeric UID without reading /etc/passwd.
UID = 65532
PORT = 8081

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX = "application/vnd.oci.image.index.v1+json"


def canonical(value):
    """JSON with sorted keys and no spaces: the bytes, and so the digest, are fixed."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def layer_tar(binary, epoch):
    """The root filesystem as an uncompressed tar, entries in the order given."""
    entries = [
        ("etc/", None, 0o755),
        ("etc/group", (FILES / "group").read_bytes(), 0o644),
        ("etc/passwd", (FILES / "passwd").read_bytes(), 0o644),
        ("etc/ssl/", None, 0o755),
        ("etc/ssl/certs/", None, 0o755),
        ("etc/ssl/certs/ca-certificates.crt", CA_BUNDLE.read_bytes(), 0o644),
        ("weir-bridge", Path(binary).read_bytes(), 0o755),
    ]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data, mode in entries:
            info = tarfile.TarInfo(name.rstrip("/"))
            info.mode = mode
            info.mtime = epoch
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def gzipped(data):
    out = io.BytesIO()
    with gzip.GzipFile(filename="", fileobj=out, mode="wb", compresslevel=9, mtime=0) as gz:
        gz.write(data)
    return out.getvalue()


def descriptor(media_type, blob):
    return {"mediaType": media_type, "digest": digest(blob), "size": len(blob)}


def digest(blob):
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary", help="the static weir-bridge to ship")
    parser.add_argument("out", help="the OCI layout directory to write (replaced)")
    parser.add_argument("--tag", required=True, help="the ref name in index.json")
    parser.add_argument("--epoch", type=int, required=True, help="every timestamp, s since the epoch")
    parser.add_argument("--revision", default="", help="the source revision, for a label")
    args = parser.parse_args()

    if not CA_BUNDLE.is_file():
        sys.exit(f"oci-bridge: {CA_BUNDLE} is missing (apt-get install ca-certificates)")
    with open(args.binary, "rb") as f:
        head = f.read(4)
    if head != b"\x7fELF":
        sys.exit(f"oci-bridge: {args.binary} is not an ELF binary")

    tar = layer_tar(args.binary, args.epoch)
    layer = gzipped(tar)
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(args.epoch))
    labels = {
        "org.opencontainers.image.title": "weir-bridge",
        "org.opencontainers.image.description": "weir's global-quota service on a Redis Cluster",
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.version": args.tag,
        "org.opencontainers.image.created": created,
    }
    if args.revision:
        labels["org.opencontainers.image.revision"] = args.revision
    config = canonical({
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": f"{UID}:{UID}",
            "Entrypoint": ["/weir-bridge"],
            # The binary's default listen address is loopback; in a pod the kubelet's probes
            # and the proxies come from outside the container.
            "Env": [f"WEIR_BRIDGE_LISTEN=0.0.0.0:{PORT}"],
            "ExposedPorts": {f"{PORT}/tcp": {}},
            "WorkingDir": "/",
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [digest(tar)]},
        "history": [{"created": created, "created_by": "scripts/oci-bridge.py"}],
    })
    manifest = canonical({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": descriptor(CONFIG, config),
        "layers": [descriptor(LAYER, layer)],
        # As the config's labels, on the manifest too: what a registry UI and `skopeo inspect
        # --raw` show without fetching the config (weir.wasm's image has the same).
        "annotations": {k: v for k, v in labels.items()
                        if k.rsplit(".", 1)[1] in ("created", "version", "revision", "title")},
    })
    index = canonical({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [dict(descriptor(MANIFEST, manifest),
                           annotations={"org.opencontainers.image.ref.name": args.tag})],
    })

    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for blob in (layer, config, manifest):
        (blobs / digest(blob).removeprefix("sha256:")).write_bytes(blob)
    (out / "oci-layout").write_bytes(canonical({"imageLayoutVersion": "1.0.0"}))
    (out / "index.json").write_bytes(index)
    print(f"weir-bridge image: {out}:{args.tag} manifest {digest(manifest)}; "
          f"layer {len(layer)} bytes compressed, {len(tar)} bytes unpacked")


if __name__ == "__main__":
    main()
