#!/usr/bin/env bash
# Writes weir.wasm as an OCI image layout that Istio's WasmPlugin `oci://` fetcher accepts.
#   bash scripts/oci-wasm.sh WASM OUT [TAG]
# WASM: the built module; OUT: the layout directory (made anew); TAG: the name in
# index.json (default: the workspace version). `just oci-wasm` runs it on the wasm build.
#
# The form: the "compat" variant of the Wasm image spec (solo-io/wasm spec/spec-compat.md) with
# OCI media types: one layer `application/vnd.oci.image.layer.v1.tar+gzip` holding
# `plugin.wasm`, an OCI image config, and the manifest annotation
# `module.wasm.image/variant: compat`. Istio's fetcher (pkg/wasm/imagefetcher.go) tries this
# form first: it takes the last layer, requires that media type, gunzips, untars and reads the
# file whose base name is plugin.wasm. Its other form, the "oci" artifact variant, wants
# exactly two layers (the `application/vnd.module.wasm.content.layer.v1+wasm` module and the
# `application/vnd.module.wasm.config.v1+json` runtime config as a second layer); one module
# layer with that media type as the manifest's config is refused ("number of layers must be 2").
# Standard media types also go through every registry and tool (skopeo, crane, docker pull).
#
# Reproducible: the same module and commit give the same bytes and so the same manifest digest.
# The layer depends on the module alone: its tar entry has mtime 0, uid/gid 0, no user names,
# mode 0644, and gzip -n stores no name or time, so images of commits that did not change the
# module share it. The config's and manifest's `created` is SOURCE_DATE_EPOCH, else the commit
# time of HEAD, else 0; the JSON is written compact with sorted keys; nothing of the host
# (architecture, user, path, clock) goes in.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] && [ $# -le 3 ] || { echo "usage: $0 WASM OUT [TAG]" >&2; exit 2; }
wasm=$1
out=$2
# The workspace version (Cargo.toml's [workspace.package]), the crates' and the release's.
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
tag=${3:-$version}
[ -f "$wasm" ] || { echo "oci-wasm: $wasm not found: build it with just build" >&2; exit 1; }
[ -n "$version" ] || { echo "oci-wasm: no [workspace.package] version in Cargo.toml" >&2; exit 1; }

epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)

rm -rf "$out"
mkdir -p "$out/blobs/sha256"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }
# Moves a file into the blob store under its digest and prints the digest.
blob() {
  local d
  d=$(sha "$1")
  mv "$1" "$out/blobs/sha256/$d"
  echo "$d"
}

cp "$wasm" "$stage/plugin.wasm"
tar --format=ustar --owner=0 --group=0 --numeric-owner --mode=0644 --mtime=@0 \
  -C "$stage" -cf "$stage/layer.tar" plugin.wasm
diff_id=$(sha "$stage/layer.tar")
gzip -9 -n "$stage/layer.tar"
layer_size=$(size "$stage/layer.tar.gz")
layer=$(blob "$stage/layer.tar.gz")

# GOARCH/GOOS names for a WASI preview 1 module, as the CNCF Wasm OCI artifact spec uses.
printf '{"architecture":"wasm","config":{},"created":"%s","os":"wasip1","rootfs":{"diff_ids":["sha256:%s"],"type":"layers"}}' \
  "$created" "$diff_id" >"$stage/config.json"
config_size=$(size "$stage/config.json")
config=$(blob "$stage/config.json")

printf '{"annotations":{"module.wasm.image/variant":"compat","org.opencontainers.image.created":"%s","org.opencontainers.image.revision":"%s","org.opencontainers.image.title":"weir.wasm","org.opencontainers.image.version":"%s"},"config":{"digest":"sha256:%s","mediaType":"application/vnd.oci.image.config.v1+json","size":%s},"layers":[{"digest":"sha256:%s","mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","size":%s}],"mediaType":"application/vnd.oci.image.manifest.v1+json","schemaVersion":2}' \
  "$created" "$revision" "$version" "$config" "$config_size" "$layer" "$layer_size" >"$stage/manifest.json"
manifest_size=$(size "$stage/manifest.json")
manifest=$(blob "$stage/manifest.json")

printf '{"manifests":[{"annotations":{"org.opencontainers.image.ref.name":"%s"},"digest":"sha256:%s","mediaType":"application/vnd.oci.image.manifest.v1+json","size":%s}],"mediaType":"application/vnd.oci.image.index.v1+json","schemaVersion":2}' \
  "$tag" "$manifest" "$manifest_size" >"$out/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$out/oci-layout"

cat <<EOF
oci-wasm: $out, tag $tag
  image digest sha256:$manifest
  weir.wasm    sha256:$(sha "$wasm") ($(size "$wasm") bytes)
  layer        sha256:$layer ($layer_size bytes, plugin.wasm in tar+gzip)
WasmPlugin:
  url: oci://REGISTRY/weir/weir-wasm@sha256:$manifest
  sha256: "$manifest"
push: skopeo copy --preserve-digests oci:$out:$tag docker://REGISTRY/weir/weir-wasm:$tag
EOF
