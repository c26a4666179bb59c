#!/usr/bin/env python3
"""Builds a package's test binaries and runs them later without cargo.

    scripts/test-binaries.py build LIST -- CARGO_TEST_ARGS...   cargo test --no-run ARGS;
                                                                 the binaries into LIST
    scripts/test-binaries.py run LIST [-- TEST_ARGS...]         each binary of LIST in turn

`cargo test` takes the build directory's lock even when nothing is to build, and waits
for any other cargo building there: the suite (scripts/stages.py) runs the end-to-end and
bridge tests while other recipes compile, so they run their binaries directly, as cargo
would (the package's directory as the working directory, one binary after another,
stopping at the first that fails).
"""
import json
import os
import subprocess
import sys


def build(listing, cargo_args):
    command = ["cargo", "test", "--no-run", "--message-format=json-render-diagnostics", *cargo_args]
    result = subprocess.run(command, stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        return result.returncode
    binaries = []
    for line in result.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") != "compiler-artifact" or not message.get("executable"):
            continue
        if not message.get("profile", {}).get("test"):
            continue
        target = message["target"]
        binaries.append({
            "name": target["name"],
            "kind": target["kind"][0],
            "executable": message["executable"],
            "cwd": os.path.dirname(message["manifest_path"]),
        })
    os.makedirs(os.path.dirname(os.path.abspath(listing)), exist_ok=True)
    with open(listing, "w") as f:
        json.dump(binaries, f, indent=1)
    for b in binaries:
        print(f"  Built {b['kind']} {b['name']}: {b['executable']}")
    return 0


def run(listing, test_args):
    with open(listing) as f:
        binaries = json.load(f)
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
    if rest and rest[0] == "--":
        rest = rest[1:]
    return build(listing, rest) if what == "build" else run(listing, rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
