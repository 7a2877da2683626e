"""``fifolane groups parked|show|release``: the parked groups of ``--on-failure park``.

A group is parked when one of its events keeps failing; its later events are held, durably,
until it is released (services/worker/parking.py, docs/formats.md "Parked groups").
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

__all__ = ["groups"]


def _settings() -> tuple[Any, set[str]]:
    """The settings once Kafka answered (else one clear error; their clients log each line
    once), and the topics it has."""
    from fifolane.cli.connect import check_reachable, logged
    from fifolane.config import load_settings

    settings = load_settings()
    topics = check_reachable(settings)
    return logged(settings), topics


def _parked(settings: Any, topics: set[str]) -> dict[str, Any]:
    from confluent_kafka import KafkaException

    from fifolane.errors import ConfigError
    from services.worker.parking import read_parked

    if settings.parked_topic not in topics:
        return {}  # no worker ever parked a group (asking for it by name could create it)
    try:
        return read_parked(settings.kafka_config(), settings.parked_topic)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else exc
        raise ConfigError(f"cannot read the parked groups in {settings.parked_topic!r} on "
                          f"{settings.resolved_bootstrap()}: {getattr(err, 'str', lambda: str(err))()}; "
                          "is Kafka down or restarting? Try again when it is up") from None


def _summary(p: Any) -> dict[str, Any]:
    return {"group": p.group, "partition": p.partition, "reason": p.reason, "error": p.error,
            "held": len(p.held), "first_offset": p.first_offset, "parked_at": p.parked_at,
            "releasing": p.releasing}


@click.group()
def groups() -> None:
    """Inspect and release parked groups (workers run with --on-failure park)."""


@groups.command("parked")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def parked(as_json: bool) -> None:
    """List the parked groups: reason, first error and held events."""
    found = _parked(*_settings())
    if as_json:
        for name in sorted(found):
            click.echo(json.dumps(_summary(found[name]), sort_keys=True))
        return
    if not found:
        click.echo("no parked groups")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="parked groups")
    for column in ("group", "partition", "held", "parked at", "releasing", "first error"):
        table.add_column(column, overflow="fold")
    for name in sorted(found):
        p = found[name]
        table.add_row(p.group, str(p.partition), str(len(p.held)), p.parked_at, str(p.releasing), p.error[:200])
    Console().print(table)


@groups.command("show")
@click.argument("group")
@click.option("--json", "as_json", is_flag=True)
def show(group: str, as_json: bool) -> None:
    """Show one parked group and its held events, in the order they will be replayed."""
    found = _parked(*_settings()).get(group)
    if found is None:
        click.echo(f"error: group {group!r} is not parked", err=True)
        sys.exit(2)
    d = _summary(found)
    d["events"] = [{"seq": h.seq, "offset": h.offset, "partition": h.partition, "bytes": len(h.value or b"")}
                   for h in found.held]
    if as_json:
        click.echo(json.dumps(d, sort_keys=True))
        return
    for k in ("group", "partition", "reason", "error", "held", "first_offset", "parked_at", "releasing"):
        click.echo(f"{k:<14} {d[k]}")
    for e in d["events"]:
        click.echo(f"  held #{e['seq']}: input offset {e['offset']} ({e['bytes']} bytes)")


@groups.command("release")
@click.argument("group")
@click.option("--skip-head", is_flag=True,
              help="Dead-letter the event that parked the group instead of retrying it.")
def release(group: str, skip_head: bool) -> None:
    """Release a parked group: retry its head (or dead-letter it), then replay the held
    events in order. The worker that owns the group does it, in the group's order."""
    from confluent_kafka import Producer

    from services.worker.parking import release_record

    settings, topics = _settings()
    found = _parked(settings, topics).get(group)
    if found is None:
        click.echo(f"error: group {group!r} is not parked: see `fifolane groups parked`", err=True)
        sys.exit(2)
    value, headers = release_record(skip_head)
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all"}))
    errors: list[str] = []
    producer.produce(settings.input_topic, value, group.encode(), found.partition, headers=headers,
                     on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
    if producer.flush(60) or errors:
        click.echo(f"error: the release of {group!r} was not delivered: {errors or 'timed out'}", err=True)
        sys.exit(1)
    head = "dead-letters the head, then replays" if skip_head else "retries the head, then replays"
    click.echo(f"release of {group!r} requested: its worker {head} {len(found.held)} held event(s) in "
               f"order; follow it with `fifolane groups show {group}`")
