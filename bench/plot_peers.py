#!/usr/bin/env python3
"""Draws weir-bench's picture of weir beside its peers (issue 35).

usage: plot_peers.py RESULTS_JSON OUT_PNG

Left: each limiter's own whole-system CPU per request (Envoy, weir-bridge or the rate
limit service, and Redis, less the baseline with no filter on the same route), median
over the rounds of the cost run, below its limit and with most requests limited. Right:
under-admission against the exact bound for each load the peers were offered (5x and
20x spread evenly over two Envoys, 2x with 90 % of it on one Envoy, then all of it).
Every figure is read from RESULTS_JSON (`docs/bench/results.json` as weir-bench writes
it); a limiter or load the run left out is left out here.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (scenario id, bar label) of the cost run, weir's first.
COST = [
    ("weir-global-leases", "weir leased"),
    ("weir-global-exact", "weir exact"),
    ("weir-global-saturated", "weir, 1 key far over"),
    ("rls-limitador-async", "RLS limitador async"),
    ("rls-limitador-async-limited", "RLS async, limited"),
    ("rls-limitador-cached", "RLS limitador cached"),
    ("rls-limitador-cached-limited", "RLS cached, limited"),
]
LOADS = ["5×", "20×", "2×, 90 % on one Envoy", "2×, all on one Envoy"]


def weir_limiter(mode):
    return "weir exact" if mode.startswith("global_exact") else "weir leased"


def load_of(mode):
    if mode.endswith("uneven"):
        return LOADS[2]
    if mode.endswith("one_envoy"):
        return LOADS[3]
    if mode == "global_leased20x":
        return LOADS[1]
    if mode in ("global_exact", "global_leased"):
        return LOADS[0]
    return None


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    with open(argv[1]) as f:
        results = json.load(f)
    own = {s["id"]: s.get("own_cpu_us_per_request") for s in results["scenarios"]}
    bars = [(label, own[i]) for i, label in COST if own.get(i) is not None]

    under = {}  # limiter -> {load: under %}
    acc = results["accuracy"]
    for run in acc["runs"]:
        load = load_of(run["mode"])
        if load is None or run.get("bridge_delay_ms", 0):
            continue
        under.setdefault(weir_limiter(run["mode"]), {})[load] = run["under_pct"]
    for run in acc.get("peers", []):
        load = load_of(run["mode"])
        if load is not None:
            under.setdefault(run["limiter"], {})[load] = run["under_pct"]

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5), dpi=120)
    names = [b[0] for b in bars]
    values = [b[1] for b in bars]
    colors = ["#ff7f0e" if n.startswith("weir") else "#7f7f7f" for n in names]
    left.barh(range(len(bars)), values, color=colors)
    left.set_yticks(range(len(bars)))
    left.set_yticklabels(names, fontsize=8)
    left.invert_yaxis()
    for y, v in enumerate(values):
        left.text(v, y, " {:.1f}".format(v), va="center", fontsize=8)
    left.set_xlabel("own CPU per request, µs (whole system less no filter on the same route)")
    left.set_title("Cost (median over rounds)", fontsize=10)
    left.grid(True, axis="x", alpha=0.3)

    limiters = list(under)
    width = 0.8 / max(len(limiters), 1)
    for k, limiter in enumerate(limiters):
        xs = [i + k * width for i in range(len(LOADS))]
        ys = [under[limiter].get(load, 0.0) for load in LOADS]
        right.bar(xs, ys, width=width, label=limiter)
    right.set_xticks([i + 0.4 - width / 2 for i in range(len(LOADS))])
    right.set_xticklabels(LOADS, fontsize=8)
    right.set_ylabel("under-admission, % of the exact bound")
    right.set_title("Accuracy on two Envoys (limit {:,}/s)".format(acc["rate_per_s"]), fontsize=10)
    right.grid(True, axis="y", alpha=0.3)
    right.legend(fontsize=8)
    fig.suptitle("weir beside its peers (weir-bench, {} UTC)".format(results["generated_utc"]),
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(argv[2])


if __name__ == "__main__":
    main(sys.argv)
