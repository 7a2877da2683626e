"""``fifolane topics create|describe``: the topic roles of docs/formats.md."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from fifolane.cli.connect import check_reachable
from fifolane.config import load_settings
from fifolane.topics import (
    DEFAULT_HISTORY_WINDOW_MS,
    broker_count,
    describe_topics,
    ensure_topics,
    role_names,
)

__all__ = ["topics"]


@click.group()
def topics() -> None:
    """Create and inspect the input, state, registry, dead-letter and listener-output topics."""


@topics.command()
@click.option("--partitions", type=click.IntRange(min=1), default=None,
              help="Input partitions (default: the existing input topic's, else FIFOLANE_PARTITIONS).")
@click.option("--replication-factor", type=click.IntRange(min=-1), default=None,
              help="Default: FIFOLANE_REPLICATION_FACTOR, else -1 = the brokers' default.replication.factor.")
@click.option("--history-window", "history_window_ms", type=click.IntRange(min=0),
              default=DEFAULT_HISTORY_WINDOW_MS, show_default=True,
              help="State topic min.compaction.lag.ms: how far back 'as of' views can reach.")
@click.option("--timeout", type=float, default=30.0, show_default=True)
def create(partitions: int | None, replication_factor: int | None, history_window_ms: int, timeout: float) -> None:
    """Create the missing role topics; refuse existing ones with a wrong config (idempotent).

    An existing input topic keeps its partition count, and the other topics follow it: a
    count other than the configured one (--partitions, else FIFOLANE_PARTITIONS) is warned
    about, since it is often a topic the brokers created on their own (a `fifolane produce`
    before `topics create`, on brokers with auto.create.topics.enable) with 1 partition.
    """
    if replication_factor == 0:
        raise click.BadParameter("must be >= 1, or -1 for the brokers' default", param_hint="--replication-factor")
    settings = load_settings()
    check_reachable(settings)
    states = ensure_topics(
        settings, partitions, replication_factor, history_window_ms=history_window_ms, timeout=timeout
    )
    asked = settings.replication_factor if replication_factor is None else replication_factor
    origin = " (the brokers' default.replication.factor)" if asked == -1 else ""
    for role, state in states.items():
        verb = "created" if state.created else "exists "
        why = origin if state.created else ""
        click.echo(f"{verb} {role:<16} {state.name} ({state.partitions} partitions, "
                   f"replication {state.replication_factor}{why})")
    made = states["input"]
    configured = partitions or settings.partitions
    if not made.created and made.partitions != configured:
        followed = sorted(s.name for s in states.values() if s.created and s.partitions == made.partitions)
        click.echo(
            f"warning: the input topic {made.name} exists with {made.partitions} partition(s), not the "
            f"configured {configured} (FIFOLANE_PARTITIONS)"
            + (f", and {', '.join(followed)} were created with {made.partitions} to match it" if followed else "")
            + f". A topic made by the brokers' automatic topic creation (a `fifolane produce` before "
            f"`topics create`) has 1 partition: if it holds nothing you need, delete the topics and run "
            f"`fifolane topics create` again. If {made.partitions} is what you want, say so with "
            f"--partitions {made.partitions} (or FIFOLANE_PARTITIONS={made.partitions}).", err=True,
        )
    members = states.get("members")
    segment = members.config.get("segment.ms", "") if members is not None else ""
    if members is not None and not members.created and (not segment.isdigit() or int(segment) > 86_400_000):
        rolls = f"rolls its segments every {int(segment) / 86_400_000:g} day(s)" if segment.isdigit() \
            else "has no segment.ms"
        click.echo(
            f"warning: the members topic {members.name} {rolls}: the workers' heartbeats (one a second each) "
            f"are compacted only in rolled segments, so it grows until then; fix: kafka-configs.sh --alter "
            f"--entity-type topics --entity-name {members.name} --add-config segment.ms=3600000", err=True,
        )
    brokers = broker_count(settings, timeout=timeout)
    thin = sorted(s.name for s in states.values() if s.replication_factor < min(brokers, 3))
    if thin:
        click.echo(
            f"warning: {', '.join(thin)} have fewer replicas than the {brokers} brokers allow: losing "
            f"one broker makes their partitions unavailable; recreate them with a higher "
            f"--replication-factor (or -1 for the brokers' default)", err=True,
        )


@topics.command()
@click.option("--timeout", type=float, default=30.0, show_default=True)
def describe(timeout: float) -> None:
    """Show each role's topic: name, partitions, replication and key configs."""
    settings = load_settings()
    check_reachable(settings)
    table = Table(title=f"fifolane topics on {settings.resolved_bootstrap()}")
    for column in ("role", "topic", "partitions", "replication", "cleanup.policy",
                   "min.compaction.lag.ms", "delete.retention.ms", "min.insync.replicas"):
        table.add_column(column, overflow="fold")
    missing = False
    names = role_names(settings)
    for role, state in describe_topics(settings, timeout=timeout).items():
        if state is None:
            missing = True
            table.add_row(role, names[role], "[red]missing[/red]", "", "", "", "", "")
            continue
        cfg = state.config
        table.add_row(role, state.name, str(state.partitions), str(state.replication_factor),
                      cfg.get("cleanup.policy", ""), cfg.get("min.compaction.lag.ms", ""),
                      cfg.get("delete.retention.ms", ""), cfg.get("min.insync.replicas", ""))
    Console().print(table)
    if missing:
        click.echo("some topics are missing: run `fifolane topics create`", err=True)
