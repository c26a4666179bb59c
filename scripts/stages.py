#!/usr/bin/env python3
"""Runs just recipes one after another, as `just a b c` would, and prints how long each took.

    scripts/stages.py JUST RECIPE...

Per recipe: the wall time, and the CPU time (user + system) of everything it ran, its
children's children included. Compiling shows as CPU near twice the wall on a 2-core machine;
waiting (processes starting, timeouts, sleeps) as wall alone. Stops at the first recipe that
fails and still prints the table so far. `./dev.sh test` ends with this table: it is where to
look first when the suite gets slower.
"""
import resource
import subprocess
import sys
import time


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(just, recipes):
    rows, status, failed = [], 0, None
    suite_started = time.monotonic()
    for recipe in recipes:
        started, cpu_before = time.monotonic(), children_cpu()
        status = subprocess.call([just, recipe])
        rows.append((recipe, time.monotonic() - started, children_cpu() - cpu_before))
        if status != 0:
            failed = recipe
            break
    out = sys.stderr
    print("\nstages: recipe               wall       cpu", file=out)
    for recipe, wall, cpu in rows:
        print(f"stages: {recipe:<18} {wall:6.0f} s  {cpu:6.0f} s", file=out)
    print(f"stages: {'total':<18} {time.monotonic() - suite_started:6.0f} s  {sum(r[2] for r in rows):6.0f} s", file=out)
    if failed:
        print(f"stages: stopped: {failed} failed (exit {status})", file=out)
    return status


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2:]))
