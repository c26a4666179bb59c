#!/usr/bin/env python3
"""Builds packages' test binaries and runs them later without cargo.

    scripts/test-binaries.py build LIST -- CARGO_ARGS...    cargo build --all-targets ARGS;
                                                             the test binaries into LIST
    scripts/test-binaries.py run LIST [--package NAME]... [--jobs N [--first NAME]...] [-- TEST_ARGS...]
                                                             each binary of LIST (of those
                                                             packages) in turn, or N at a
                                                             time, the binaries named
                                                             --first first

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
import signal
import subprocess
import sys
import tempfile
import time


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
    # Written whole, then renamed over the old list: the suite rewrites it (`build-tests`
    # after `build-timed-tests`) while the timed recipes read it.
    with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(os.path.abspath(listing)),
                                     delete=False, suffix=".tmp") as f:
        json.dump(binaries, f, indent=1)
    os.replace(f.name, listing)
    for b in binaries:
        print(f"  Built {b['package']} {b['kind']} {b['name']}: {b['executable']}")
    return 0


def run(listing, packages, test_args, jobs=1, first=()):
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
    if jobs <= 1:
        for b in binaries:
            print(f"     Running {b['kind']} {b['name']} ({b['executable']})", flush=True)
            status = subprocess.call([b["executable"], *test_args], cwd=b["cwd"])
            if status != 0:
                print(f"error: test failed: {b['kind']} {b['name']} (exit {status})", file=sys.stderr)
                return status if status > 0 else 1
        return 0
    return run_side_by_side(binaries, test_args, jobs, first)


def run_side_by_side(binaries, test_args, jobs, first):
    """`jobs` binaries at a time, those named in `first` first (the longest, so that the
    others fill the second lane beside it); each one's output printed whole when it ends.
    The first failure stops the others."""
    order = sorted(binaries, key=lambda b: (b["name"] not in first, first.index(b["name"]) if b["name"] in first else 0))
    waiting, running, status = list(order), {}, 0
    while waiting or running:
        while waiting and len(running) < jobs and status == 0:
            b = waiting.pop(0)
            out = tempfile.TemporaryFile()
            child = subprocess.Popen([b["executable"], *test_args], cwd=b["cwd"],
                                     stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            running[child.pid] = (b, child, out, time.monotonic())
        if not running:
            break
        pid, wait_status = os.wait()
        if pid not in running:
            continue
        b, child, out, started = running.pop(pid)
        code = os.waitstatus_to_exitcode(wait_status)
        out.seek(0)
        print(f"     Running {b['kind']} {b['name']} ({b['executable']}; {time.monotonic() - started:.1f} s)",
              flush=True)
        sys.stdout.buffer.write(out.read())
        sys.stdout.flush()
        if code != 0 and status == 0:
            print(f"error: test failed: {b['kind']} {b['name']} (exit {code})", file=sys.stderr)
            status = code if code > 0 else 1
            waiting.clear()
            for _, other, _, _ in running.values():
                try:
                    os.killpg(other.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
    return status


def main(argv):
    if len(argv) < 2 or argv[0] not in ("build", "run"):
        sys.exit(__doc__)
    what, listing, rest = argv[0], argv[1], argv[2:]
    packages, jobs, first = [], 1, []
    while what == "run" and len(rest) >= 2 and rest[0] in ("--package", "--jobs", "--first"):
        if rest[0] == "--package":
            packages.append(rest[1])
        elif rest[0] == "--first":
            first.append(rest[1])
        else:
            jobs = int(rest[1])
        rest = rest[2:]
    if rest and rest[0] == "--":
        rest = rest[1:]
    elif rest and what == "run":
        sys.exit(f"test-binaries: unexpected {rest[0]!r}\n{__doc__}")
    return build(listing, rest) if what == "build" else run(listing, packages, rest, jobs, first)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
