"""``fifolane plan``: the cluster a target load needs, from the capacity model.

    fifolane plan --events-per-second 1000000 --listeners 10000 [--handler-ms 2] [...]

Prints the worker processes, partitions, brokers and Spark cores, the limits at that load
and which one binds first (:mod:`fifolane.capacity`, costs from
``benchmarks/results/capacity.json`` or ``--costs FILE``; docs/capacity.md explains them).
Exit status 1 when the load cannot be met on any number of workers (a limit that does not
scale is saturated), 2 for impossible input.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import click

from fifolane.capacity import HANDLERS, Load, Plan, load_costs, plan

__all__ = ["plan_command", "render"]

_FIX = {
    "worker CPU": "add worker processes (up to one per partition)",
    "handler concurrency": "raise --concurrency or add worker processes",
    "hot-group latency": "split the hottest group (a finer group key) or make its handler faster",
    "per-partition order": "more partitions (a new input topic) or a faster handler",
    "broker network": "add brokers or faster broker networks",
    "broker CPU": "add brokers or broker cores",
}


def _n(value: float, digits: int = 0) -> str:
    return "unbounded" if math.isinf(value) else f"{value:,.{digits}f}"


def render(p: Plan, costs_source: str) -> str:
    """The plan as text (what ``fifolane plan`` prints)."""
    ld = p.load
    measured = ""
    if costs_source:
        measured = f"costs: {costs_source}"
    parts = ", ".join(f"{k} {v:.2f}" for k, v in p.breakdown.items() if v)
    lines = [
        f"target: {_n(ld.events_per_s)} events/s, {ld.listeners:,} listeners, {ld.handler} handler "
        f"({ld.handler_ms:g} ms wait per event), {ld.groups:,} groups (hottest {ld.skew:g}x average), "
        f"{ld.live_entities:,} entities",
        measured,
        "",
        f"worker CPU per event   {p.worker_cpu_us:,.2f} us ({parts})",
        f"one worker process     {_n(p.process_rate)} events/s at 100% (one core, {ld.concurrency} groups in flight)",
        f"worker processes       {p.workers:,} ({p.worker_cores:,.1f} cores busy; planned at "
        f"{ld.headroom:.0%} of capacity)",
        f"partitions             {p.partitions:,} per partitioned topic ({p.partitions / p.workers:.1f} per "
        f"worker: room to add workers without re-partitioning)",
        f"brokers                {p.brokers:,} ("
        + ", ".join(f"{k} {v}" for k, v in p.broker_reasons.items()) + ")",
        f"  broker traffic       {p.bytes_per_event:,.0f} bytes written per event; cluster-wide in "
        f"{p.network_in_mb_s:,.1f} MB/s, out {p.network_out_mb_s:,.1f} MB/s (replication factor {ld.replication})",
        f"Spark cores            {p.spark_cores:,} (a views build over {p.spark_rows:,} rows within "
        f"{ld.views_within_s:g} s)",
        f"restore after a move   {p.restore_s:,.1f} s per worker (its share of the entities)",
        f"hottest group          {p.hot_group_rate:,.1f} events/s, mean latency "
        f"{_n(p.hot_group_latency_ms, 2)} ms",
        "",
        "limits at this load (utilisation on the planned cluster):",
    ]
    for lim in sorted(p.limits, key=lambda x: -x.utilisation):
        how = "scales out" if lim.scales else "fixed"
        lines.append(f"  {lim.name:<20} {lim.utilisation:>8.1%}  {how:<10}  {lim.detail}")
    first = p.binding
    lines += ["", f"binds first: {first.name} at {first.utilisation:.1%} -> {_FIX[first.name]}",
              f"with more workers and brokers (same partitions) the load can grow to "
              f"{_n(p.ceiling_events_per_s)} events/s before "
              f"{max((x for x in p.limits if not x.scales), key=lambda x: x.utilisation).name} binds"]
    return "\n".join(line for line in lines if line is not None)


def _as_json(p: Plan, costs_source: str) -> dict[str, Any]:
    data = dataclasses.asdict(p)
    data["binding"] = p.binding.name
    data["feasible"] = p.feasible
    data["costs"] = costs_source
    out: dict[str, Any] = json.loads(json.dumps(data, default=str).replace("Infinity", "null"))
    return out


@click.command("plan")
@click.option("--events-per-second", "events_per_s", type=float, required=True, help="Target input events/s.")
@click.option("--listeners", type=int, required=True, help="Registered listeners.")
@click.option("--handler-ms", type=float, default=0.0, show_default=True,
              help="Wall time a handler waits per event (I/O), on top of its CPU.")
@click.option("--handler", type=click.Choice(HANDLERS), default="table", show_default=True,
              help="table: the built-in table handler; app: an app like examples.flights.")
@click.option("--groups", type=int, default=100_000, show_default=True, help="FIFO groups.")
@click.option("--skew", type=float, default=10.0, show_default=True,
              help="The hottest group's rate over the average group's.")
@click.option("--entities", type=int, default=None, help="Live entities [default: 100 per group].")
@click.option("--filter-share", type=float, default=0.0, show_default=True,
              help="Share of listeners whose CEL filter the equality index cannot serve.")
@click.option("--prefix-share", type=float, default=0.0, show_default=True,
              help="Share of listeners with a startsWith (prefix) filter.")
@click.option("--converter-share", type=float, default=0.0, show_default=True,
              help="Share of notifications that run a converter.")
@click.option("--notifications-per-event", type=float, default=1.0, show_default=True)
@click.option("--dead-letter-share", type=float, default=0.001, show_default=True)
@click.option("--creates-per-event", type=float, default=0.1, show_default=True,
              help="Entities new to a partition per event (directory claims).")
@click.option("--concurrency", type=int, default=16, show_default=True, help="Worker --concurrency.")
@click.option("--headroom", type=float, default=0.7, show_default=True,
              help="Plan every resource to this share of its measured capacity.")
@click.option("--growth", type=float, default=2.0, show_default=True, help="Partitions per worker.")
@click.option("--replication", type=int, default=3, show_default=True)
@click.option("--broker-mb-s", type=float, default=125.0, show_default=True,
              help="Network per broker and direction, MB/s.")
@click.option("--broker-cores", type=int, default=8, show_default=True)
@click.option("--replicas-per-broker", type=int, default=4000, show_default=True)
@click.option("--views-within", "views_within_s", type=float, default=600.0, show_default=True,
              help="Seconds a full views build may take.")
@click.option("--costs", "costs_file", type=click.Path(path_type=Path), default=None,
              help="Measured costs [default: benchmarks/results/capacity.json].")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_command(costs_file: Path | None, as_json: bool, **options: Any) -> None:
    """Size partitions, worker processes, brokers and Spark cores for a target load."""
    load = Load(**options)  # ConfigError (exit 2) for impossible input
    costs = load_costs(costs_file)
    p = plan(load, costs)
    at = costs.measured.get("at", "unknown time")
    source = f"{costs_file or 'benchmarks/results/capacity.json'} (measured {at})"
    click.echo(json.dumps(_as_json(p, source), indent=2) if as_json else render(p, source))
    if not p.feasible:
        worst = p.binding
        click.echo(f"error: this load cannot be met: {worst.name} at {worst.utilisation:.0%} "
                   f"({worst.detail}); {_FIX[worst.name]}", err=True)
        sys.exit(1)  # not ctx.exit: the console script's main() runs click with standalone_mode off
