#!/usr/bin/env bash
# Runs weir-core's tests compiled to wasm32-unknown-unknown, under Node.js, with
# wasm-bindgen-test: what is tested natively is what runs inside Envoy.
#
# Usage: scripts/test-core-wasm.sh [cargo test args...]   (default: --tests)
#        scripts/test-core-wasm.sh --install-only       (the runner, nothing else)
#
# Installs wasm-bindgen-test-runner (crate wasm-bindgen-cli) at exactly the version of the
# wasm-bindgen crate in Cargo.lock (the runner refuses test binaries built by another
# version), into a cache of this machine's user, one directory per version:
# ${WEIR_TOOL_CACHE:-${XDG_CACHE_HOME:-~/.cache}/weir}/wasm-bindgen-cli-VERSION. From scratch
# that is 160–200 CPU-seconds of compiling, once per machine and version, not once per
# clone: a tool, like the rustup target and the apt packages, not a build output (nothing
# in the repository's target/ is shared between clones).
# Doc tests cannot run under wasm, hence --tests. Needs node on PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf 'test-core-wasm: %s\n' "$*" >&2; }

command -v node >/dev/null || { say "node is needed to run wasm tests (apt-get install nodejs)"; exit 1; }

rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown

[ -f Cargo.lock ] || cargo generate-lockfile
version=$(awk '
  $0 == "name = \"wasm-bindgen\"" { found = 1; next }
  found && /^version = / { gsub(/"/, "", $3); print $3; exit }
' Cargo.lock)
[ -n "$version" ] || { say "no wasm-bindgen in Cargo.lock (is wasm-bindgen-test a wasm32 dev-dependency of core?)"; exit 1; }

tools="${WEIR_TOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weir}/wasm-bindgen-cli-$version"
export PATH="$tools/bin:$PATH"
# `--install-only`: the runner and nothing else; with `--no-run` among the arguments the
# tests are only built, and the runner is neither needed nor installed (the suite does
# both side by side: scripts/stages.py).
install_only=false
no_run=false
for arg in "$@"; do
  case $arg in
    --install-only) install_only=true ;;
    --no-run) no_run=true ;;
  esac
done
have=$(wasm-bindgen-test-runner --version 2>/dev/null | awk '{ print $2 }' || true)
if [ "$have" != "$version" ] && ! $no_run; then
  say "installing wasm-bindgen-cli $version into $tools (found: ${have:-none})"
  started=$SECONDS
  # --locked: the CLI is built with the dependencies its release was published with (the
  # Cargo.lock inside the crate), so the test toolchain is the same on every machine. A
  # wasm-bindgen whose published lockfile names a crate the registry does not serve cannot be
  # installed so: pick one that can (`cargo update -p wasm-bindgen-test --precise ...`)
  # rather than resolve the CLI's dependencies afresh.
  # --debug: unoptimised, it built in 240 CPU-seconds here against 435 at opt-level 1 (more
  # at the release profile's 3), and it runs as fast on test binaries without debug info.
  # Without debug info of its own and without its default feature (rustls, which only the
  # browser runners' driver downloads use; tests here run under Node.js): 161 CPU-seconds
  # (measured 2026-11-29, cold, nothing beside it). Only the runner: the other two binaries
  # of the crate are not linked.
  CARGO_PROFILE_DEV_DEBUG=false \
    cargo install --locked --debug --no-default-features --quiet --root "$tools" --version "$version" \
      --bin wasm-bindgen-test-runner wasm-bindgen-cli || {
    say "cannot install wasm-bindgen-cli $version with --locked (above: which dependency of its lockfile failed)"
    exit 1
  }
  say "installed in $((SECONDS - started)) s"
fi

$install_only && exit 0
[ $# -gt 0 ] || set -- --tests
# Without debug info the test wasm is a seventh of the size (6 MB, not 43), and the runner
# (which rewrites the whole binary) takes a third of the time.
export CARGO_PROFILE_DEV_DEBUG=false
export CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner
# The workspace builds the core at opt-level 1 for its searches (Cargo.toml); under wasm the
# tests run in seconds and the build is what costs, so here it is built unoptimised.
exec cargo test -p weir-protocol -p weir-core --target wasm32-unknown-unknown \
  --config 'profile.dev.package.weir-core.opt-level=0' \
  --config 'profile.dev.package.weir-protocol.opt-level=0' \
  --config 'profile.dev.package.weir-testkit.opt-level=0' \
  --config 'profile.dev.package.weir-scripted.opt-level=0' "$@"
