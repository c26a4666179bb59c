#!/usr/bin/env python3
"""Draws weir-bench's concurrency picture: each limiter's limit, the requests at the
service and the P99 latency of answered requests over time, as the clients double
past the service's knee.

usage: plot_concurrency.py CONCURRENCY_JSON OUT_PNG

CONCURRENCY_JSON is `docs/bench/concurrency.json` as `weir-bench concurrency` writes it.
weir-bench runs this with `.tools/venv/bin/python` after installing matplotlib there.
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {
    "no limiter": "#7f7f7f",
    "Envoy adaptive_concurrency": "#1f77b4",
    "weir adaptive": "#d62728",
    "weir fixed at the knee": "#2ca02c",
}


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    with open(argv[1]) as f:
        doc = json.load(f)
    r = doc["results"]
    knee, phase = r["knee"], r["phase_seconds"]
    fig, (ax_limit, ax_flight, ax_p99) = plt.subplots(
        3, 1, figsize=(12, 9), dpi=120, sharex=True
    )
    for run in r["runs"]:
        name = run["limiter"]
        color = COLORS.get(name)
        samples = run["samples"]
        limits = [(s["t"], s["limit"]) for s in samples if s["limit"] is not None]
        if limits and name != "weir fixed at the knee":
            ax_limit.step([t for t, _ in limits], [l for _, l in limits], where="post",
                          color=color, label=name, linewidth=1.6)
        ax_flight.plot([s["t"] for s in samples], [s["upstream_in_flight"] for s in samples],
                       color=color, label=name, linewidth=1.2)
        windows = [w for w in run["windows"] if w["ok_per_s"] > 0]
        ax_p99.plot([w["t"] for w in windows], [w["p99_ms"] for w in windows],
                    color=color, label=name, linewidth=1.2, marker=".", markersize=3)
    rounds = r.get("rounds", 1)
    clients = [phase_clients * knee for phase_clients in (1, 2, 4)] * rounds
    for ax in (ax_limit, ax_flight, ax_p99):
        for i in range(1, len(clients)):
            # A round's end dashed, a phase's dotted.
            style = "--" if i % 3 == 0 else ":"
            ax.axvline(i * phase, color="black", linewidth=0.8, linestyle=style)
        ax.grid(True, alpha=0.3)
    for ax in (ax_limit, ax_flight):
        ax.axhline(knee, color="#2ca02c", linestyle="--", linewidth=1.0,
                   label="the knee ({} at once)".format(knee))
    ax_p99.axhline(r["service_ms"], color="black", linestyle="--", linewidth=1.0,
                   label="service time ({} ms)".format(r["service_ms"]))
    ax_limit.set_ylabel("limit")
    ax_flight.set_ylabel("requests at the service")
    ax_p99.set_ylabel("P99 latency, ms (500 ms windows)")
    ax_p99.set_ylim(bottom=0)
    ax_p99.set_xlabel("seconds; clients: " + " → ".join(str(c) for c in clients))
    ax_limit.set_title(
        "Concurrency limits, service of {} × {} ms, clients doubling past the knee, {} rounds "
        "(weir-bench, {} UTC)".format(knee, r["service_ms"], rounds, doc["generated_utc"]),
        fontsize=10,
    )
    for ax in (ax_limit, ax_flight, ax_p99):
        ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(argv[2])


if __name__ == "__main__":
    main(sys.argv)
