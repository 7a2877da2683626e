"""``fifolane get`` and ``fifolane scan``: read the live state from the workers.

Both find the workers' query endpoints in the members topic (or take ``--url``) and use
:class:`fifolane.client.StateClient` (routing, retries on moved/restoring).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from fifolane.errors import ConfigError

__all__ = ["get", "scan"]


def _common(fn: Callable[..., Any]) -> Callable[..., Any]:
    opts = [
        click.option("--json", "as_json", is_flag=True, help="Print the answer as JSON."),
        click.option("--url", "urls", multiple=True, metavar="URL",
                     help="A worker's query address (default: every address in the members topic)."),
        click.option("--group-id", default=None,
                     help="The workers' consumer group (when several groups read the input topic)."),
        click.option("--stale", is_flag=True, help="Accept an answer from a standby (its lag is shown)."),
        click.option("--min-position", type=click.IntRange(min=0), default=None,
                     help="Wait until the partition's committed position reaches this."),
        click.option("--token-file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
                     default=None, help="The endpoint's bearer token (--query-token-file of the workers)."),
        click.option("--ca-file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
                     default=None, help="CA certificate to verify the endpoint's TLS certificate."),
        click.option("--timeout", type=float, default=30.0, show_default=True, callback=_positive,
                     help="Seconds to keep retrying moved / restoring answers."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _positive(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise click.BadParameter(f"{value} is not a number of seconds above 0")
    return value


def _not_empty(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value:
        what = {"key": "an entity key", "type_name": "an entity type"}.get(param.name or "", "a FIFO group value")
        raise click.BadParameter(f"give {what}: it must not be empty")
    return value


def _client(urls: tuple[str, ...], group_id: str | None, token_file: Path | None,
            ca_file: Path | None, timeout: float) -> Any:
    from fifolane.cli.connect import check_reachable, logged
    from fifolane.client import StateClient, member_urls, read_token
    from fifolane.config import load_settings

    found = list(urls)
    if not found:
        settings = load_settings()
        # Kafka down is said as such (not "no worker publishes"), at once and in one line
        topics = check_reachable(settings)
        if settings.members_topic in topics:
            found = member_urls(logged(settings), group_id, strict=True)
        if not found:
            raise ConfigError(f"no worker publishes a query address for input topic {settings.input_topic!r} "
                              f"in {settings.members_topic!r}: start the workers with --query-port, or pass --url")
    return StateClient(found, token=read_token(token_file), verify=str(ca_file) if ca_file else True,
                       timeout=timeout)


#: how long an owner that publishes no query address is waited for before saying so (a
#: worker publishes its address before it joins the group: longer means it has none)
_NO_ADDRESS_S = 3.0


def _no_address(exc: Exception) -> str | None:
    """Why an answer is final although ``unavailable``: the partition's owner is a live member
    of the group that publishes no query address (None: another reason, worth retrying)."""
    from fifolane.query import UNAVAILABLE, QueryError

    if not isinstance(exc, QueryError) or exc.status != UNAVAILABLE:
        return None
    owner, p, d = exc.answer.get("owner"), exc.answer.get("partition"), exc.answer.get("directory_partition")
    if not isinstance(owner, dict) or owner.get("url") is not None or not owner.get("worker"):
        return None
    if p is None and d is not None:  # the entity directory's partition, where a key's group is found
        return (f"worker {owner['worker']} owns entity directory partition {d} but serves no queries: it was "
                "started without --query-port (restart it with --query-port, or pass the entity's --group)")
    return (f"worker {owner['worker']} owns partition {p} but serves no queries: it was started without "
            "--query-port (restart it with --query-port to read its partitions)")


def _get(client: Any, timeout: float, *args: Any, **kw: Any) -> Any:
    """``client.get``, told apart early when the owner serves no queries at all (else it
    would be retried for the whole ``timeout`` as a rebalance)."""
    from fifolane.query import QueryError

    first = min(timeout, _NO_ADDRESS_S)
    for again, limit in enumerate((first, timeout - first)):  # a short try, then the rest of the time
        client.timeout = limit
        try:
            return client.get(*args, **kw)
        except QueryError as exc:
            why = _no_address(exc)
            if why is not None:
                raise QueryError(why, status=exc.status, answer=exc.answer) from None
            if again or timeout <= first or exc.status not in ("unavailable", "restoring"):
                raise
    raise AssertionError("unreachable: the second try returns or raises")


@click.command()
@click.argument("type_name", metavar="TYPE", callback=_not_empty)
@click.argument("key", callback=_not_empty)
@click.option("--group", default=None, callback=_not_empty,
              help="The entity's FIFO group, if known (skips the directory look-up).")
@_common
def get(type_name: str, key: str, group: str | None, as_json: bool, urls: tuple[str, ...],
        group_id: str | None, stale: bool, min_position: int | None, token_file: Path | None,
        ca_file: Path | None, timeout: float) -> None:
    """Print the committed state of entity TYPE KEY (exit 1 if there is none)."""
    with _client(urls, group_id, token_file, ca_file, timeout) as client:
        e = _get(client, timeout, type_name, key, group=group, min_position=min_position,
                 wait_ms=10_000 if min_position is not None else None, stale=stale)
    if e is None:
        if as_json:  # where it looked, and a deleted entity's last version and group
            found = client.not_found or {}
            extra = {k: found[k] for k in ("group", "version", "deleted", "partition", "position", "owner")
                     if k in found}
            click.echo(json.dumps({"status": "not_found", "type": type_name, "key": key, **extra}))
        else:
            click.echo(f"{type_name} {key}: not found", err=True)
        sys.exit(1)
    if as_json:
        click.echo(json.dumps(_as_json(e)))
        return
    owner = e.owner.worker if e.owner else "?"
    where = f"group {e.group}, partition {e.partition}, position {e.position}, owner {owner}"
    if e.stale:
        where += f", STALE (standby, {e.lag} records behind)"
    click.echo(f"{e.type} {e.key} version {e.version} ({where})")
    click.echo(json.dumps(e.value, indent=2, sort_keys=True))


@click.command()
@click.option("--group", "group", required=True, callback=_not_empty, help="The FIFO group to read.")
@click.option("--type", "type_name", default=None, help="Only entities of this type.")
@click.option("--prefix", default=None, help="Only keys starting with this (needs --type).")
@click.option("--start", default=None, help="Only keys >= this (needs --type).")
@click.option("--end", default=None, help="Only keys < this (needs --type).")
@_common
def scan(group: str, type_name: str | None, prefix: str | None, start: str | None, end: str | None,
         as_json: bool, urls: tuple[str, ...], group_id: str | None, stale: bool, min_position: int | None,
         token_file: Path | None, ca_file: Path | None, timeout: float) -> None:
    """Print every live entity of a FIFO group (--json: one JSON object a line)."""
    n = 0
    with _client(urls, group_id, token_file, ca_file, timeout) as client:
        for e in client.scan(group, type_name=type_name, prefix=prefix, start=start, end=end,
                             min_position=min_position, stale=stale):
            n += 1
            if as_json:
                click.echo(json.dumps(_as_json(e)))
            else:
                click.echo(f"{e.type} {e.key} version {e.version}: {json.dumps(e.value, sort_keys=True)}")
    if not as_json:
        click.echo(f"{n} entities in group {group}", err=True)


def _as_json(e: Any) -> dict[str, Any]:
    owner = None if e.owner is None else {"worker": e.owner.worker, "url": e.owner.url}
    out = {"type": e.type, "key": e.key, "group": e.group, "version": e.version, "value": e.value,
           "partition": e.partition, "position": e.position, "owner": owner}
    if e.stale:
        out.update(stale=True, lag=e.lag)
    return out
