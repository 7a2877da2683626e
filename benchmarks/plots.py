"""PNG plots of the results (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

__all__ = ["bar_plot", "latency_cdf_plot", "plots_from_results", "slow_plot"]


def bar_plot(path: Path, title: str, values: dict[str, float], ylabel: str) -> None:
    """One bar per label, the value printed on top."""
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = list(values)
    bars = ax.bar(labels, [values[k] for k in labels], color="#4477aa")
    ax.bar_label(bars, labels=[f"{values[k]:,.0f}" for k in labels], fontsize=8)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def reads_plot(path: Path, by_load: dict[float, tuple[float, float, float]], max_rate: float) -> None:
    """Key reads/s (bars) and their p50/p99 latency (lines) at each write load."""
    shares = sorted(by_load)
    labels = [f"{s:.0%} ({s * max_rate:,.0f}/s)" for s in shares]
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(labels, [by_load[s][0] for s in shares], color="#4477aa", label="reads/s")
    ax.bar_label(bars, labels=[f"{by_load[s][0]:,.0f}" for s in shares], fontsize=8)
    ax.axhline(5000, color="#999999", linestyle=":", linewidth=1)
    ax.set_xlabel("write load (share of the worker's maximum write rate)")
    ax.set_ylabel("key reads/s (32 in flight)")
    lat = ax.twinx()
    lat.plot(labels, [by_load[s][1] for s in shares], "o-", color="#228833", label="p50 ms")
    lat.plot(labels, [by_load[s][2] for s in shares], "s--", color="#cc3311", label="p99 ms")
    lat.set_ylabel("latency (ms)")
    lat.legend(loc="upper right", fontsize=8)
    ax.set_title("Query API key reads under write load (one worker, 2 cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def slow_plot(path: Path, seconds: dict[int, float], serial: float, reference: dict[str, float],
              sleep_total: float) -> None:
    """Time to process the events vs concurrency, with the serial baseline and PC's numbers."""
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = sorted(seconds)
    ax.plot(xs, [seconds[x] for x in xs], "o-", label="fifolane (exactly-once)")
    ax.axhline(serial, color="#cc6677", ls="--", label=f"partition-serial loop ({serial:.1f} s)")
    for (name, s), style in zip(reference.items(), (":", "-."), strict=False):
        ax.axhline(s, color="grey", ls=style, label=f"Parallel Consumer README: {name} ({s} s)")
    ax.axhline(sleep_total / max(xs), color="#999933", ls=(0, (1, 3)),
               label=f"ideal at concurrency {max(xs)} ({sleep_total / max(xs):.2f} s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("concurrency (groups in flight)")
    ax.set_ylabel("seconds for all events")
    ax.set_title("Slow handlers (0-5 ms), 1 partition, 1,000 groups")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def latency_cdf_plot(path: Path, raw: dict[str, Any]) -> None:
    """One panel per system: the latency CDF per load (line style) and output (colour)."""
    systems = [k for k, v in raw.items() if "loads" in v]
    cols = 2
    rows = max(1, (len(systems) + cols - 1) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.2 * rows), squeeze=False)
    styles = ["-", "--", ":", "-."]
    colours = {"state": "#4477aa", "notifications": "#ee6677", "output": "#228833"}
    for ax, key in zip(axes.flat, systems, strict=False):
        data = raw[key]
        for style, (load, outs) in zip(styles, data["loads"].items(), strict=False):
            for out, lat in outs.items():
                pts = lat.get("cdf") or []
                if not pts:
                    continue
                ax.plot([p[1] for p in pts], [p[0] for p in pts], style, color=colours.get(out, "grey"),
                        label=f"{out}, {load} load ({lat['rate']:,.0f}/s): p50 {lat['p50']:.0f}, "
                              f"p99 {lat['p99']:.0f} ms")
        ax.set_xscale("log")
        ax.set_ylim(0, 100)
        ax.set_title(f"{key.replace('_', ' ')} (max {data['max_rate']:,.0f} events/s)", fontsize=9)
        ax.set_xlabel("produce -> visible (read_committed), ms", fontsize=8)
        ax.set_ylabel("percentile", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    for ax in list(axes.flat)[len(systems):]:
        ax.set_visible(False)
    fig.suptitle("End-to-end latency CDF at 10% and 50% of each system's maximum rate", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plots_from_results(results_dir: Path, results: dict[str, dict[str, Any]]) -> list[Path]:
    """The throughput bar charts of whatever suites ran (slow draws its own)."""
    made = []
    stateful = results.get("stateful")
    if stateful:
        raw = stateful["raw"]
        rates = {"ceiling loop": raw["ceiling"]["events_per_s"]}
        for key, label in (("fifolane_ALO", "fifolane ALO"), ("fifolane_EOS", "fifolane EOS"),
                           ("fifolane_EOS_nodir", "fifolane EOS\n(no dir.)"),
                           ("quix_ALO", "Quix ALO"), ("quix_EOS", "Quix EOS"),
                           ("kstreams_ALO", "KStreams ALO"), ("kstreams_EOS", "KStreams EOS"),
                           ("kstreams1w_ALO", "KStreams 1w ALO"), ("kstreams1w_EOS", "KStreams 1w EOS")):
            if key in raw:
                rates[label] = raw[key]["throughput"]["events_per_s"]
        path = results_dir / "stateful.png"
        bar_plot(path, "Stateful throughput (1 broker)", rates, "events/s")
        made.append(path)
    listeners = results.get("listeners")
    if listeners and "skipped" not in listeners["raw"] and any(
            "throughput" in v for v in listeners["raw"].values()):
        rates = {k: v["throughput"]["events_per_s"] for k, v in listeners["raw"].items()
                 if "throughput" in v}
        path = results_dir / "listeners.png"
        bar_plot(path, "Worker throughput by registered listeners", rates, "events/s")
        made.append(path)
    lat = results.get("latency")
    if lat and any("loads" in v for v in lat["raw"].values()):
        path = results_dir / "latency.png"
        latency_cdf_plot(path, lat["raw"])
        made.append(path)
    app = results.get("app")
    if app:
        rates = {label: app["raw"][k]["throughput"]["events_per_s"] for k, label in
                 (("ceiling", "plain loop"), ("fifolane_EOS", "fifolane EOS"), ("quix_EOS", "Quix EOS"))
                 if "throughput" in app["raw"].get(k, {})}
        if rates:
            path = results_dir / "app.png"
            bar_plot(path, "Flights app (3 reads, 2 writes per event), exactly-once", rates, "events/s")
            made.append(path)
    restore = results.get("restore")
    if restore:
        raw = restore["raw"]
        rates = {"bare consume": raw["bare_consume"]["records_per_s"],
                 "worker restore": raw["restored"] / raw["restore_seconds"] if raw["restore_seconds"] else 0.0}
        path = results_dir / "restore.png"
        bar_plot(path, "Changelog restore vs bare read", rates, "entities/s")
        made.append(path)
    return made
