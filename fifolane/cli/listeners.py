"""``fifolane listeners add|list|describe|remove`` and ``fifolane listen``.

Registrations go through :mod:`listeners.registry` (the same code path as the Python API).
Invalid expressions are refused with the expression and a caret under the error position,
exit code 2.
"""

from __future__ import annotations

import json
import math
import sys
from datetime import UTC, datetime, timedelta
from typing import Any, NoReturn

import click

from fifolane.cli.connect import check_reachable
from fifolane.errors import ExpressionError, ListenerError

#: The shortest --lease `listeners add` takes.
MIN_LEASE = timedelta(seconds=1)

__all__ = ["listen", "listeners"]


def _settings() -> Any:
    from fifolane.config import load_settings

    return load_settings()


def _fail(message: str, code: int = 2) -> NoReturn:
    click.echo(message, err=True)
    sys.exit(code)


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds")
    return value


def _expression_error(exc: ExpressionError, what: str) -> NoReturn:
    text = str(exc)  # compile errors already start with "invalid filter/converter": they know best
    known = text.startswith(("invalid filter", "invalid converter"))
    lines = [f"error: {text}" if known else f"error: invalid {what}: {text}"]
    if exc.expression:
        source = exc.expression
        if exc.position is None:
            lines.extend(f"  {line}" for line in source.splitlines())
        else:  # the line of the position, the caret under it (not under the whole text)
            at = min(max(exc.position, 0), len(source))
            start = source.rfind("\n", 0, at) + 1
            end = source.find("\n", at)
            row = source[start:] if end < 0 else source[start:end]
            if "\n" in source:
                lines.append(f"  (line {source.count(chr(10), 0, at) + 1})")
            lines.append(f"  {row}")
            lines.append("  " + "".join("\t" if c == "\t" else " " for c in row[:at - start]) + "^")
    _fail("\n".join(lines))


@click.group()
def listeners() -> None:
    """Register, list, describe and remove cluster listeners."""


@listeners.command("add")
@click.argument("name")
@click.option("--filter", "filter_", required=True, help="CEL filter, e.g. value.amount > 100")
@click.option("--convert", default=None, help="CEL converter yielding a map (the projection).")
@click.option("--kinds", default="created,modified,removed", show_default=True)
@click.option("--include-current-state", is_flag=True, help="First announce existing matches.")
@click.option("--output", default=None, help="Output topic (default: the configured one).")
@click.option("--lease", default=None, help="Expire unless renewed within this, e.g. 30s.")
@click.option("--type", "type_", default=None, help="Only entities of this type.")
@click.option("--replace", is_flag=True, help="Replace an existing listener of this name.")
def add(name: str, filter_: str, convert: str | None, kinds: str, include_current_state: bool,
        output: str | None, lease: str | None, type_: str | None, replace: bool) -> None:  # fmt: skip
    """Register listener NAME."""
    from listeners.model import ListenerSpec
    from listeners.registry import register

    try:
        spec = ListenerSpec(name=name, filter=filter_, convert=convert, kinds=kinds,  # type: ignore[arg-type]
                            include_current_state=include_current_state, output_topic=output,
                            type=type_, lease=lease)  # type: ignore[arg-type]  # fmt: skip
    except ExpressionError as exc:
        what = "converter" if convert is not None and exc.expression == convert else "filter"
        _expression_error(exc, what)
    except ListenerError as exc:
        _fail(f"error: {exc}")
    if spec.lease is not None and spec.lease < MIN_LEASE:
        _fail(f"error: --lease {lease} is shorter than {MIN_LEASE.total_seconds():.0f}s: `fifolane listen` renews a "
              "lease after a third of it, and a shorter one runs out before a worker has seen it")
    try:  # refused before anything is written, or Kafka is asked, if it can never work (listeners.validate)
        from listeners.validate import check_registration, load_catalog

        check_registration(spec, load_catalog(_settings()) if spec.type is not None else None)
    except ExpressionError as exc:
        _expression_error(exc, "converter" if convert is not None and exc.expression == convert else "filter")
    except ListenerError as exc:
        _fail(f"error: {exc}")
    check_reachable(_settings())
    try:
        done = register(_settings(), spec, replace=replace)
    except ExpressionError as exc:
        _expression_error(exc, "converter" if convert is not None and exc.expression == convert else "filter")
    except ListenerError as exc:
        _fail(f"error: {exc}")
    state = "registered" if done.created_at == spec.created_at else "already registered (same definition)"
    if done.created_at != spec.created_at and done.renewed_at is not None and done.renewed_at >= spec.created_at:
        state += "; its lease had run out: renewed"
    by = f" by {done.principal}" if done.principal else ""
    click.echo(f"listener {name!r} {state}{by}; output topic {done.topic(_settings())}")


def _state(spec: Any, statuses: list[Any], now: datetime) -> str:
    """The state column: active, expired, suspended on N worker(s), failing on N worker(s)
    (active, but its evaluations fail there: see `describe`)."""
    suspended = [s for s in statuses if s.state == "suspended"]
    if suspended:
        return f"suspended on {len(suspended)} worker(s)"
    if spec.is_expired(now):
        return "expired"
    failing = [s for s in statuses if s.state == "failing"]
    return f"failing on {len(failing)} worker(s)" if failing else "active"


def _suspensions(statuses: list[Any]) -> list[dict[str, str]]:
    return [{"worker": s.worker, "since": s.at.isoformat(), "reason": s.reason}
            for s in statuses if s.state == "suspended"]  # fmt: skip


def _failing(statuses: list[Any]) -> list[dict[str, Any]]:
    """Workers whose evaluations of the listener fail: the count, the last error and when."""
    return [{"worker": s.worker, "errors": s.errors, "last_error": s.reason, "at": s.at.isoformat()}
            for s in statuses if s.state == "failing"]  # fmt: skip


def _row(d: dict[str, Any]) -> str:
    exp = d["expires_at"] or "never"
    return (f"{d['name']:<24} {d['state']:<24} {d['filter']:<40} kinds={','.join(d['kinds'])} "
            f"expires={exp}")  # fmt: skip


def _invalid_row(name: str, error: str) -> str:
    return f"{name:<24} {'invalid':<24} {error}"


@listeners.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_(as_json: bool) -> None:
    """List registered listeners: state (active, expired, suspended on N workers, failing on
    N workers, invalid),
    filter, kinds and lease expiry. Invalid registrations are listed with their error."""
    from listeners.registry import read_registry

    check_reachable(_settings())
    state = read_registry(_settings())
    status = state.status
    now = datetime.now(UTC)
    for name in sorted(state.listeners.keys() | state.invalid.keys()):
        if name in state.invalid:
            error = state.invalid[name]
            click.echo(json.dumps({"name": name, "state": "invalid", "error": error}, sort_keys=True)
                       if as_json else _invalid_row(name, error))  # fmt: skip
            continue
        spec = state.listeners[name]
        d = spec.to_dict()
        d["expired"] = spec.is_expired(now)
        d["state"] = _state(spec, status.get(name, []), now)
        d["suspended"] = _suspensions(status.get(name, []))
        d["failing"] = _failing(status.get(name, []))
        click.echo(json.dumps(d, sort_keys=True) if as_json else _row(d))


@listeners.command("describe")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
def describe(name: str, as_json: bool) -> None:
    """Show one listener's registration, its state, every worker's suspension of it and the
    workers whose evaluations of it fail (error count and last error).

    Exit code 1 if the registration is invalid (its error is shown), 2 if there is none.
    """
    from listeners.registry import read_registry

    settings = _settings()
    check_reachable(settings)
    state = read_registry(settings)
    if name in state.invalid:
        d: dict[str, Any] = {"name": name, "state": "invalid", "error": state.invalid[name],
                             "fix": f"fifolane listeners remove {name}, then add it again"}  # fmt: skip
        click.echo(json.dumps(d, sort_keys=True) if as_json
                   else "\n".join(f"{k:<22} {d[k]}" for k in ("name", "state", "error", "fix")))  # fmt: skip
        sys.exit(1)
    spec = state.listeners.get(name)
    if spec is None:
        _fail(f"error: unknown listener {name!r}: see `fifolane listeners list`")
    statuses = state.status.get(name, [])
    now = datetime.now(UTC)
    d = spec.to_dict()
    d["output_topic"] = spec.topic(settings)
    d["expired"] = spec.is_expired(now)
    d["state"] = _state(spec, statuses, now)
    d["suspended"] = _suspensions(statuses)
    d["failing"] = _failing(statuses)
    if as_json:
        click.echo(json.dumps(d, sort_keys=True))
        return
    for k in sorted(d):
        if k not in ("suspended", "failing"):
            click.echo(f"{k:<22} {d[k]}")
    for s in d["suspended"]:
        click.echo(f"{'suspended':<22} worker={s['worker']} since={s['since']} reason: {s['reason']}")
    for f in d["failing"]:
        click.echo(f"{'failing':<22} worker={f['worker']} errors={f['errors']} last at {f['at']}: "
                   f"{f['last_error']}")  # fmt: skip


@listeners.command("remove")
@click.argument("name")
def remove_(name: str) -> None:
    """Remove listener NAME (workers stop delivering within about one checkpoint).

    Invalid registrations are removed the same way.
    """
    from listeners.registry import read_registry, remove

    settings = _settings()
    check_reachable(settings)
    error = read_registry(settings).invalid.get(name)
    if not remove(settings, name):
        _fail(f"error: unknown listener {name!r}")
    note = f" (it was an invalid registration: {error})" if error is not None else ""
    click.echo(f"listener {name!r} removed{note}")


@click.command()
@click.argument("name")
@click.option("--from-beginning", is_flag=True, help="Read the output topic from its start.")
@click.option("--max", "max_", type=click.IntRange(min=1), default=None, help="Stop after N.")
@click.option("--timeout", type=click.FloatRange(min=0), default=None, callback=lambda ctx, param, v: _finite(v),
              help="Stop after this many idle seconds.")
def listen(name: str, from_beginning: bool, max_: int | None, timeout: float | None) -> None:
    """Print listener NAME's notifications as JSON lines (duplicates dropped, lease renewed)."""
    from fifolane.access import KafkaAccess
    from listeners.client import ListenerClient
    from listeners.registry import get_listener

    settings = _settings()
    check_reachable(settings)
    try:
        spec = get_listener(settings, name)
        access = KafkaAccess(settings.kafka_config())
        topic = spec.topic(settings)
        if not access.topics([topic])[topic].allows("READ"):  # else: "does not exist", retried
            who = access.principal or "this client"
            _fail(f"error: {who} may not read listener {name!r}: it lacks READ on its output topic "
                  f"{topic!r}; an administrator can grant it with `fifolane acls apply --role "
                  f"listener-reader --principal {who} --listener {name} --output {topic}`")
        client = ListenerClient(settings, name, from_beginning=from_beginning, timeout=timeout, spec=spec)
    except ListenerError as exc:
        _fail(f"error: {exc}")
    n = 0
    with client:
        for note in client:
            click.echo(json.dumps(note, sort_keys=True))
            n += 1
            if max_ is not None and n >= max_:
                break
    for gap in client.gaps:
        click.echo(f"gap: {gap.missing} notification(s) missing on partition {gap.partition}",
                   err=True)  # fmt: skip
