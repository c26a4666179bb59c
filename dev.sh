#!/usr/bin/env bash
# Entry point that works on a fresh machine: installs what is missing (including
# `just` itself, which a `just` command cannot do), then runs a justfile recipe.
#   ./dev.sh run     the demo stack, then shows limiting
#   ./dev.sh test    the whole test suite (what CI runs)
#   ./dev.sh <recipe> [args]   any other recipe; `./dev.sh --list` lists them
set -euo pipefail
cd "$(dirname "$0")"
bash scripts/setup.sh
exec .tools/venv/bin/just "$@"
