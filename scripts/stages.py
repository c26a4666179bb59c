#!/usr/bin/env python3
"""Runs just recipes and prints how long each took.

    scripts/stages.py JUST RECIPE...     one after another, as `just a b c` would
    scripts/stages.py JUST --suite       the whole suite, its recipes side by side (below)

Per recipe: the wall time, and the CPU time (user + system) of everything it ran, its
children's children included. Compiling shows as CPU near twice the wall on a 2-core
machine; waiting (processes starting, timeouts, sleeps) as wall alone. Stops at the first
recipe that fails and still prints the table so far. `./dev.sh test` ends with this
table: it is where to look first when the suite gets slower.

`--suite` runs SUITE, a graph of recipes, so that waiting and compiling overlap: the
end-to-end and bridge tests spend part of their time waiting on Envoy, Redis and the
clock, and the builds and the core's tests fill the cores meanwhile. Two kinds of recipe:

- **work** (builds, clippy, the core's tests natively and under wasm, validation): not
  sensitive to time. They run under `nice -n 19` (build-timed-tests, which every timed
  recipe waits for, at 10), two at a time, one beside a timed recipe.
- **timed** (tests that start Envoy, Redis and the bridge and hold them to rates and
  timeouts): normal priority, one at a time, and only once at most one work recipe runs.

A recipe starts once the recipes it needs have passed, in the order SUITE lists them
(the builds the timed tests wait for first). Each recipe's output
goes to target/stages/RECIPE.log and is printed whole when it ends, so the logs of
recipes running side by side do not interleave. The first failure stops the rest (their
process groups are killed) and ends with that recipe's log.
"""
import os
import resource
import signal
import subprocess
import sys
import time

WORK, TIMED = "work", "timed"

# (recipe, kind, the recipes it needs). Order is priority: the builds the timed tests
# wait for first, then the timed tests in the order they can start.
SUITE = [
    ("build-timed-tests", WORK, []),
    ("build", WORK, []),
    ("test-bridge", TIMED, ["build-timed-tests"]),
    ("test-e2e-live", TIMED, ["build", "build-timed-tests"]),
    # The rest of the native tests (the core's), beside the timed recipes: they need none
    # of it, and started 312 s into the suite when they waited for all of it (CI of 9608aa3).
    ("build-tests", WORK, ["build-timed-tests"]),
    ("build-bench", WORK, []),
    ("bench-smoke", TIMED, ["build", "build-timed-tests", "build-bench"]),
    # The builds below wait for build-timed-tests, though they do not need it: every timed
    # recipe does, so it gets both cores (beside weir.wasm) and the timed recipes start
    # sooner. They then fill the cores beside the timed ones.
    ("oci-bridge", WORK, ["build-timed-tests"]),
    ("test-images", TIMED, ["build", "oci-bridge", "build-timed-tests"]),
    ("test-core-built", WORK, ["build-tests"]),
    ("test-bench", WORK, ["build-tests"]),
    ("wasm-bindgen-runner", WORK, ["build-timed-tests"]),
    ("build-core-wasm-tests", WORK, ["build-tests"]),
    ("test-wasm", WORK, ["wasm-bindgen-runner", "build-core-wasm-tests"]),
    # `lint`'s native half is in build-tests (clippy compiles the workspace's crates there).
    # Last: once the timed recipes end it runs beside the wasm tests, where only they were
    # left on one core (CI of 179133a: its last 45 s kept 1.2 cores busy).
    ("lint-wasm", WORK, ["build-tests"]),
    ("validate-yaml", WORK, ["build"]),
    ("test-alerts", WORK, []),
]
# At most one timed recipe at a time: two side by side (the bridge's tests and the
# end-to-end ones) made bridge calls miss their 50 ms timeout on 2 cores, and so did
# two niced builds beside them. Beside a timed recipe, one work recipe at a time.
AT_ONCE = {WORK: 2, TIMED: 1}
WORK_BESIDE_TIMED = 1
# Work runs at nice 19, but build-timed-tests at 10: every timed recipe waits for it, so the
# builds beside it (weir.wasm first) take only the cycles it leaves, in the gaps where
# cargo has fewer units ready than cores. (Alone it built in 215 s, beside weir.wasm at
# equal priority in 259 s; on a suite bound by CPU the order moves little of the wall.)
NICE = {"build-timed-tests": 10}
# Recipes run with `just --no-deps`: SUITE lists everything their justfile dependencies build.
NO_DEPS = {"test-e2e-live", "test-images", "test-bridge", "bench-smoke", "test-core-built", "test-bench"}


def set_autogroup_nice(pid, nice):
    """Gives the session `pid` leads the scheduling weight of `nice`.

    Each recipe runs in a session of its own (so that a failure can kill its process
    group), and where the kernel groups sessions for scheduling (autogroup, on here:
    /proc/sys/kernel/sched_autogroup_enabled), a process's nice value weighs only against
    the processes of its own session: the niced builds took as much of the CPU as the
    timed tests beside them. The group's own nice value is what weighs between sessions.
    Without autogroup the file is absent, and `nice -n` does the job alone.
    """
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError:
        pass


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def print_table(rows, wall, failed, status, extra=""):
    out = sys.stderr
    print("\nstages: recipe                  start     wall       cpu", file=out)
    for recipe, start, took, cpu in rows:
        start_text = "" if start is None else f"{start:5.0f} s"
        print(f"stages: {recipe:<22} {start_text:>7}  {took:6.0f} s  {cpu:6.0f} s", file=out)
    print(f"stages: {'total':<22} {'':>7}  {wall:6.0f} s  {sum(r[3] for r in rows):6.0f} s{extra}", file=out)
    if failed:
        print(f"stages: stopped: {failed} failed (exit {status})", file=out)


def sequential(just, recipes):
    rows, status, failed = [], 0, None
    suite_started = time.monotonic()
    for recipe in recipes:
        started, cpu_before = time.monotonic(), children_cpu()
        status = subprocess.call([just, recipe])
        rows.append((recipe, None, time.monotonic() - started, children_cpu() - cpu_before))
        if status != 0:
            failed = recipe
            break
    print_table(rows, time.monotonic() - suite_started, failed, status)
    return status


def suite(just):
    names = [name for name, _, _ in SUITE]
    for name, _, needs in SUITE:
        missing = [n for n in needs if n not in names]
        assert not missing, f"{name} needs {missing}, not in SUITE"
    logs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "stages")
    os.makedirs(logs, exist_ok=True)
    started = time.monotonic()
    pending = list(SUITE)
    running = {}  # pid -> (name, kind, start, log file)
    done, rows = set(), []
    failed, status = None, 0

    def say(text):
        print(f"stages: {time.monotonic() - started:5.0f} s  {text}", file=sys.stderr, flush=True)

    while pending or running:
        if failed is None:
            for job in list(pending):
                name, kind, needs = job
                no_deps = name in NO_DEPS
                busy = sum(1 for _, k, _, _ in running.values() if k == kind)
                timed = any(k == TIMED for _, k, _, _ in running.values())
                limit = WORK_BESIDE_TIMED if kind == WORK and timed else AT_ONCE[kind]
                if kind == TIMED:
                    # A timed recipe waits until at most WORK_BESIDE_TIMED work runs.
                    work = sum(1 for _, k, _, _ in running.values() if k == WORK)
                    limit = AT_ONCE[TIMED] if work <= WORK_BESIDE_TIMED else 0
                if busy >= limit or not all(n in done for n in needs):
                    continue
                log = open(os.path.join(logs, f"{name}.log"), "wb")
                # The graph has built what a recipe's own dependencies would build; run
                # again they would only wait on cargo's lock for other recipes' builds.
                command = [just, "--no-deps", name] if no_deps else [just, name]
                if kind == WORK:
                    command = ["nice", "-n", str(NICE.get(name, 19))] + command
                child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
                if kind == WORK:
                    set_autogroup_nice(child.pid, NICE.get(name, 19))
                running[child.pid] = (name, kind, time.monotonic(), log)
                pending.remove(job)
                say(f"start {name} ({kind})")
        if not running:
            break
        pid, wait_status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        name, kind, start, log = running.pop(pid)
        log.close()
        code = os.waitstatus_to_exitcode(wait_status)
        took = time.monotonic() - start
        rows.append((name, start - started, took, usage.ru_utime + usage.ru_stime))
        with open(log.name, "rb") as f:
            text = f.read().decode("utf-8", "replace")
        sys.stdout.write(f"\n===== {name} ({'passed' if code == 0 else f'exit {code}'}, {took:.0f} s) =====\n")
        sys.stdout.write(text)
        sys.stdout.flush()
        say(f"end {name}: {'ok' if code == 0 else f'exit {code}'} after {took:.0f} s")
        if code == 0:
            done.add(name)
        elif failed is None:
            failed, status = name, code
            for other_pid, (other, _, _, _) in running.items():
                say(f"stopping {other}")
                try:
                    os.killpg(other_pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
            pending.clear()
    if failed:
        with open(os.path.join(logs, f"{failed}.log"), "rb") as f:
            tail = f.read().decode("utf-8", "replace").splitlines()[-60:]
        sys.stdout.write(f"\n===== {failed} failed; the end of its log =====\n" + "\n".join(tail) + "\n")
        sys.stdout.flush()
    wall = time.monotonic() - started
    cpu = sum(r[3] for r in rows)
    print_table(rows, wall, failed, status,
                extra=f"  (the cores were busy {cpu / wall / (os.cpu_count() or 1) * 100:.0f} % of the wall)")
    return status


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    if sys.argv[2] == "--suite":
        sys.exit(suite(sys.argv[1]))
    sys.exit(sequential(sys.argv[1], sys.argv[2:]))
