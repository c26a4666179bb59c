#!/usr/bin/env bash
# Entry point that works on a fresh machine: installs what is missing (including
# `just` itself, which a `just` command cannot do), then runs a justfile recipe.
#   ./dev.sh run     the demo stack, then shows limiting
#   ./dev.sh test    the whole test suite (what CI runs)
#   ./dev.sh test-fast   lint and the core's tests: the loop while changing code
#   ./dev.sh check-config FILE   a plugin configuration, checked offline (needs only cargo)
#   ./dev.sh <recipe> [args]   any other recipe; `./dev.sh --list` lists them
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")"

# check-config needs cargo and nothing else: no setup, no just. FILE is relative to the
# directory the user stands in, not to the repository root this script moved to. The
# justfile's check-config recipe runs the same command.
if [ "${1:-}" = check-config ]; then
  [ $# -eq 2 ] || { echo "usage: ./dev.sh check-config FILE   (FILE may be - for stdin)" >&2; exit 2; }
  file=$2
  case $file in
    - | /*) ;;
    *) file=$caller/$file ;;
  esac
  exec cargo run -q -p weir-check --bin weir-check -- check-config "$file"
fi

bash scripts/setup.sh
exec .tools/venv/bin/just "$@"
