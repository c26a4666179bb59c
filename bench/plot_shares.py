#!/usr/bin/env python3
"""Draws weir-bench's fair-shares picture: what the heavy user, the user who turns heavy
at the switch and each light user (the mean of the eight others) were admitted per
second, one panel per limiter.

usage: plot_shares.py FEATURES_JSON OUT_PNG

FEATURES_JSON is `docs/bench/features.json` as `weir-bench features` writes it.
weir-bench runs this with `.tools/venv/bin/python` after installing matplotlib there.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    with open(argv[1]) as f:
        doc = json.load(f)
    rows = doc["results"].get("shares", [])
    if not rows:
        sys.exit("no shares in " + argv[1])
    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 4), dpi=120, sharey=True)
    if len(rows) == 1:
        axes = [axes]
    for ax, row in zip(axes, rows):
        seconds = [s[0] for s in row["series"]]
        ax.step(seconds, [s[1] for s in row["series"]], where="post", label="heavy user", color="#d62728")
        ax.step(seconds, [s[2] for s in row["series"]], where="post", label="u1 (heavy from the switch)", color="#1f77b4")
        ax.step(seconds, [s[3] for s in row["series"]], where="post", label="each light user (mean)", color="#2ca02c")
        ax.axvline(row["switch"], color="#7f7f7f", linestyle=":", linewidth=1)
        ax.axhline(100, color="#7f7f7f", linestyle="--", linewidth=1)
        ax.set_title(row["limiter"], fontsize=10)
        ax.set_xlabel("second of the run")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("admitted in the second")
    axes[0].legend(fontsize=8, loc="center left")
    fig.suptitle("One organisation's 100/s: a heavy user and nine light ones (the dotted line: the switch)")
    fig.tight_layout()
    fig.savefig(argv[2])


if __name__ == "__main__":
    main(sys.argv)
