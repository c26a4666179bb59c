#!/usr/bin/env python3
"""Draws weir-bench's accuracy picture: admitted requests per second against the limit.

usage: plot.py RESULTS_JSON OUT_PNG

RESULTS_JSON is `docs/bench/results.json` as weir-bench writes it; the picture has one
line per run of the accuracy run (admitted in each second, by send time, as a share of
that run's limit; a run with a slowed bridge is its mode's line dashed or dotted), the
limit, and whether the conformance checker accepted the run. weir-bench runs this with `.tools/venv/bin/python`
after installing matplotlib there.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

STYLES = {
    "global_exact": {"color": "#1f77b4", "marker": "o", "label": "global, exact (lease 1), 5x"},
    "global_leased": {"color": "#ff7f0e", "marker": "s", "label": "global, leases, 5x"},
    "global_leased20x": {"color": "#d62728", "marker": "D",
                         "label": "global, leases, 20x (limit 250/s)"},
    "global_idle_then_burst": {"color": "#9467bd", "marker": "v",
                               "label": "global, leases, 2x, idle, burst"},
    "local": {"color": "#2ca02c", "marker": "^", "label": "local, 4 workers, 5x"},
    "global_exact_uneven": {"color": "#17becf", "marker": "o", "linestyle": "-.",
                            "label": "global, exact, 2x, 90 % on one Envoy"},
    "global_leased_uneven": {"color": "#8c564b", "marker": "s", "linestyle": "-.",
                             "label": "global, leases, 2x, 90 % on one Envoy"},
    "global_exact_one_envoy": {"color": "#bcbd22", "marker": "o", "linestyle": "-.",
                               "label": "global, exact, 2x, all on one Envoy"},
    "global_leased_one_envoy": {"color": "#e377c2", "marker": "s", "linestyle": "-.",
                                "label": "global, leases, 2x, all on one Envoy"},
}


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    with open(argv[1]) as f:
        results = json.load(f)
    acc = results["accuracy"]
    rate, burst = acc["rate_per_s"], acc["burst"]

    fig, ax = plt.subplots(figsize=(9, 5.2), dpi=120)
    top = 100.0
    seconds = 0
    for run in acc["runs"]:
        # Each run against its own limit's rate: 100 % is the limit.
        own_rate = run.get("rate", rate)
        per_second = [100.0 * v / own_rate for v in run["admitted_per_second"]]
        xs = list(range(1, len(per_second) + 1))
        seconds = max(seconds, len(per_second))
        style = dict(STYLES.get(run["mode"], {"label": run["mode"]}))
        name = style.pop("label")
        # A slowed run (the bridge behind a delaying proxy): its mode's colour, dashed.
        delay = run.get("bridge_delay_ms", 0)
        if delay:
            name = "{}, bridge +{} ms".format(name, delay)
            style["linestyle"] = "--" if delay <= 10 else ":"
            style["alpha"] = 0.8
        verdict = "conformant" if run.get("violation") is None else "VIOLATION"
        label = "{}: sent {:,.0f}/s, {}".format(name, run["sent_rps"], verdict)
        ax.plot(xs, per_second, linewidth=1.6, markersize=4, label=label, **style)
        top = max(top, max(per_second, default=0))
    ax.axhline(100.0, color="black", linestyle="--", linewidth=1.2,
               label="the limit's rate (the first second also has the burst: {} at once at {:,}/s)".format(
                   burst + 1, rate))
    ax.set_xlim(0.5, seconds + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, top * 1.08)
    ax.set_xlabel("second of the run")
    ax.set_ylabel("admitted in that second, % of the limit's rate")
    ax.set_title(
        "GCRA on one key, 5x and 20x offered, and after idle, for {} s (weir-bench, {} UTC)".format(
            seconds, results["generated_utc"]
        ),
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(argv[2])


if __name__ == "__main__":
    main(sys.argv)
