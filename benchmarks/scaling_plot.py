"""``scaling.png``: the multi-worker run's throughput and CPU per event vs worker processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

__all__ = ["scaling_plot"]


def scaling_plot(path: Path, rows: list[dict[str, Any]]) -> None:
    """Left: events/s per worker count, one line per partition count, with the model's
    prediction (dashed). Right: worker and broker CPU microseconds per event."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    colours = ["#4477aa", "#cc6677", "#228833", "#aa3377"]
    for colour, partitions in zip(colours, sorted({r["partitions"] for r in rows}), strict=False):
        mine = sorted((r for r in rows if r["partitions"] == partitions), key=lambda r: r["workers"])
        xs = [r["workers"] for r in mine]
        left.plot(xs, [r["events_per_s"] for r in mine], "o-", color=colour,
                  label=f"measured, {partitions} partitions")
        right.plot(xs, [r["worker_us_per_event"] for r in mine], "o-", color=colour,
                   label=f"worker, {partitions} partitions")
        if all(r.get("broker_us_per_event") is not None for r in mine):
            right.plot(xs, [r["broker_us_per_event"] for r in mine], "s:", color=colour,
                       label=f"3 brokers, {partitions} partitions")
    idle = {r["workers"]: r["predicted_2_cores"] for r in rows if r.get("predicted_2_cores")}
    if idle:
        xs = sorted(idle)
        left.plot(xs, [idle[x] for x in xs], "k--", label="model, 2 idle cores")
        got = [(r["workers"], r["predicted_got_cores"]) for r in rows if r.get("predicted_got_cores")]
        left.scatter([w for w, _ in got], [v for _, v in got], marker="x", color="grey",
                     label="model, cores the run got")
    workers = sorted({r["workers"] for r in rows})
    for ax, ylabel, title in ((left, "events/s (exactly-once)", "Throughput, 3 brokers on the same 2 cores"),
                              (right, "CPU microseconds per event", "CPU per event")):
        ax.set_xlabel("worker processes")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.set_xticks(workers)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
