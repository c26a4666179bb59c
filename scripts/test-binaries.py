#!/usr/bin/env python3
"""Builds packages' test binaries and runs them later without cargo.

    scripts/test-binaries.py build LIST -- CARGO_ARGS...    cargo build --all-targets ARGS;
                                                             the test binaries into LIST
    scripts/test-binaries.py run LIST [--package NAME]... [-- TEST_ARGS...]
                                                             each binary of LIST (of those
                                                             packages) in turn

`cargo test` takes the build directory's lock even when nothing is to build, and waits
for any other cargo building there: the suite (scripts/stages.py) runs the end-to-end and
bridge tests while other recipes compile, so they run their binaries directly, as cargo
would (the package's directory as the working directory, one binary after another,
stopping at the first that fails).

The suite builds every native package's tests in one cargo invocation (`just build-tests`):
cargo unifies features over the packages it builds together, so weir-core, serde_json and
the rest are compiled once, where a build per package compiled them once per feature set.
`--all-targets` (not `cargo test --no-run`) also builds the packages' binaries as they run
(weir-bridge, weir-check, weir-bench) with the same features.
"""
import json
import os
import subprocess
import sys


def package_names():
    """Each workspace package's name by its manifest's path."""
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1"],
        stdout=subprocess.PIPE, text=True, check=True,
    ).stdout
    return {p["manifest_path"]: p["name"] for p in json.loads(out)["packages"]}


def build(listing, cargo_args):
    command = ["cargo", "build", "--all-targets", "--message-format=json-render-diagnostics", *cargo_args]
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        return result.returncode
    names = package_names()
    binaries = []
    for line in result.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message.get("profile", {}).get("test"):
            continue
        target = message["target"]
        binaries.append({
            "package": names[message["manifest_path"]],
            "name": target["name"],
            "kind": target["kind"][0],
            "executable": message["executable"],
            "cwd": os.path.dirname(message["manifest_path"]),
        })
    os.makedirs(os.path.dirname(os.path.abspath(listing)), exist_ok=True)
    with open(listing, "w") as f:
        json.dump(binaries, f, indent=1)
    for b in binaries:
        print(f"  Built {b['package']} {b['kind']} {b['name']}: {b['executable']}")
    return 0


def run(listing, packages, test_args):
    with open(listing) as f:
        binaries = json.load(f)
    if packages:
        unknown = set(packages) - {b["package"] for b in binaries}
        if unknown:
            print(f"test-binaries: {listing} lists no test binary of {', '.join(sorted(unknown))}",
                  file=sys.stderr)
            return 1
        binaries = [b for b in binaries if b["package"] in packages]
    if not binaries:
        print(f"test-binaries: {listing} lists no test binary", file=sys.stderr)
        return 1
    for b in binaries:
        print(f"     Running {b['kind']} {b['name']} ({b['executable']})", flush=True)
        status = subprocess.call([b["executable"], *test_args], cwd=b["cwd"])
        if status != 0:
            print(f"error: test failed: {b['kind']} {b['name']} (exit {status})", file=sys.stderr)
            return status if status > 0 else 1
    return 0


def main(argv):
    if len(argv) < 2 or argv[0] not in ("build", "run"):
        sys.exit(__doc__)
    what, listing, rest = argv[0], argv[1], argv[2:]
    packages = []
    while what == "run" and len(rest) >= 2 and rest[0] == "--package":
        packages.append(rest[1])
        rest = rest[2:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    elif rest and what == "run":
        sys.exit(f"test-binaries: unexpected {rest[0]!r}\n{__doc__}")
    return build(listing, rest) if what == "build" else run(listing, packages, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
