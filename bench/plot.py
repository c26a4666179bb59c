#!/usr/bin/env python3
"""Draws weir-bench's accuracy picture: admitted requests per second against the limit.

usage: plot.py RESULTS_JSON OUT_PNG

RESULTS_JSON is `docs/bench/results.json` as weir-bench writes it; the picture has one
line per mode of the accuracy run (admitted in each second, by send time), the limit,
and the offered rate in the title. weir-bench runs this with `.tools/venv/bin/python`
after installing matplotlib there.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

STYLES = {
    "global_exact": {"color": "#1f77b4", "marker": "o", "label": "global, exact (lease 1)"},
    "global_leased": {"color": "#ff7f0e", "marker": "s", "label": "global, leases"},
    "local": {"color": "#2ca02c", "marker": "^", "label": "local, 4 workers"},
}


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    with open(argv[1]) as f:
        results = json.load(f)
    acc = results["accuracy"]
    rate, burst = acc["rate_per_s"], acc["burst"]

    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=120)
    top, bottom = rate, rate
    seconds = 0
    for run in acc["runs"]:
        per_second = run["admitted_per_second"]
        xs = list(range(1, len(per_second) + 1))
        seconds = max(seconds, len(per_second))
        style = dict(STYLES.get(run["mode"], {"label": run["mode"]}))
        label = "{}: sent {:,.0f}/s, over {:.2f} %, under {:.2f} %".format(
            style.pop("label"), run["sent_rps"], run["over_pct"], run["under_pct"]
        )
        ax.plot(xs, per_second, linewidth=1.6, markersize=4, label=label, **style)
        top = max(top, max(per_second, default=0))
        bottom = min(bottom, min(per_second, default=rate))
    ax.axhline(rate, color="black", linestyle="--", linewidth=1.2,
               label="limit: {:,}/s (+ burst: {} at once, so up to {:,} in the first second)".format(
                   rate, burst + 1, rate + burst + 1))
    ax.set_xlim(0.5, seconds + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    # Zoomed on the limit (a few per cent matter here); the axis does not start at 0.
    ax.set_ylim(min(bottom, rate) * 0.8, top * 1.08)
    ax.set_xlabel("second of the run")
    ax.set_ylabel("requests admitted in that second")
    ax.set_title(
        "GCRA {:,}/s on one key, {:,.0f}/s offered for {} s (weir-bench, {} UTC)".format(
            rate, acc["offered_rps"], seconds, results["generated_utc"]
        ),
        fontsize=10,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(argv[2])


if __name__ == "__main__":
    main(sys.argv)
