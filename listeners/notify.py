"""The notification record: JSON value per docs/formats.md, and a JSON encoder for the
values CEL and Avro produce (date, datetime, timedelta, Decimal, UUID, bytes).

JSON has no NaN or Infinity, so the encoder refuses them (:class:`NonFiniteError`): a
converter's projection holding one is an evaluation error of its listener
(:meth:`listeners.notifier.Notifier.encode`); an entity sent as it is (no converter) has such
a double written as null (:func:`encode_finite`)."""

from __future__ import annotations

import base64
import json
import math
import uuid
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from json.encoder import c_make_encoder  # type: ignore[attr-defined]
from typing import Any

__all__ = [
    "HEADER_LISTENER",
    "NonFiniteError",
    "assemble",
    "change_parts",
    "dumps",
    "encode_finite",
    "encode_value",
    "listener_prefix",
    "notification",
    "too_large",
]

#: Header carrying the listener name, so readers of a shared output topic can skip the JSON.
HEADER_LISTENER = "fifolane.listener"


def _default(o: Any) -> Any:
    if isinstance(o, datetime | date | time):
        return o.isoformat()
    if isinstance(o, timedelta):
        return o.total_seconds()
    if isinstance(o, Decimal):
        return str(o)
    if isinstance(o, uuid.UUID):
        return str(o)
    if isinstance(o, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(o)).decode()
    if isinstance(o, Mapping):
        return dict(o)
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


_ENCODER = json.JSONEncoder(default=_default, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class NonFiniteError(ValueError):
    """A projection holds a NaN or an infinite double, which JSON cannot carry."""


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON; dates and times as ISO-8601, durations in seconds, bytes base64."""
    return _ENCODER.encode(obj).encode()


_encode = _ENCODER.encode


def listener_prefix(listener: str, registration: str | None = None) -> str:
    """The constant start of every notification of ``listener`` (computed once per listener):
    its name and, if given, its registration (the ``created_at`` of the registration that
    produced it: a new registration is a new stream)."""
    reg = "" if registration is None else ',"registration":' + _encode(registration)
    return '{"listener":' + _encode(listener) + reg + ',"kind":"'


_str = json.encoder.encode_basestring  # the C encoder for str, as with ensure_ascii=False
_TABLE_CHANGE = {None: "null", "created": '"created"', "modified": '"modified"',
                 "removed": '"removed"'}  # fmt: skip


def change_parts(
    type_: str, key: str, table_change: str | None, partition: int, offset: int | None,
    version: int, ts: int, snapshot: bool = False, moved_to: str | None = None,
) -> tuple[str, str, str]:  # fmt: skip
    """The parts of a notification shared by every listener a change is sent to.

    ``head`` goes between the kind and the value, ``tail`` between the value and the
    sequence number, ``end`` after it. See :func:`assemble`.
    """
    # Once per change (per listener only the value differs); the numbers are ints (Kafka's,
    # and versions checked on intake), written as they print.
    tc = _TABLE_CHANGE.get(table_change) or _encode(table_change)
    type_json = _TYPES.get(type_) or _type_json(type_)
    head = f'","key":{_str(key)}{type_json}'
    tail = (f',"table_change":{tc},"partition":{partition},"offset":'
            f'{"null" if offset is None else offset},"version":{version},"seq":')  # fmt: skip
    if moved_to is None:
        return head, tail, f',"ts":{ts},"snapshot":true}}' if snapshot else f',"ts":{ts}}}'
    snap = ',"snapshot":true' if snapshot else ""  # removed: the entity moved to another group
    return head, tail, f',"ts":{ts}{snap},"moved_to":{_str(moved_to)}}}'


#: Entity type name -> ``,"type":<name>,"value":`` (at most _TYPES_MAX: names come from data).
_TYPES: dict[str, str] = {}
_TYPES_MAX = 10_000


def _type_json(type_: str) -> str:
    text = f',"type":{_str(type_)},"value":'
    if len(_TYPES) < _TYPES_MAX:
        _TYPES[type_] = text
    return text


#: The C encoder the standard library builds for ``_ENCODER.encode`` (same settings, so the
#: same text), kept instead of built per call; without the circular-reference check (values
#: are decoded records and CEL results: trees). None where the C accelerator is missing.
_C_ENCODE = (c_make_encoder(None, _default, _str, None, ":", ",", False, False, False)
             if c_make_encoder is not None else None)


def encode_value(value: Mapping[str, Any] | None) -> str:
    """The JSON text of a projection (once per projection, shared by its notifications):
    ``_ENCODER.encode(value)``, a dict (the common case: a decoded record, a converter's
    projection) written by the standard library's C encoder without the Python wrapper.

    Raises :class:`NonFiniteError` (naming where) if it holds a NaN or an infinite double."""
    try:
        if type(value) is dict and _C_ENCODE is not None:
            return "".join(_C_ENCODE(value, 0))
        return _encode(value)
    except ValueError as exc:
        found = _non_finite(value, "")
        if found is None:
            raise
        raise NonFiniteError(f"{found[0]} is {found[1]}, which JSON cannot carry") from exc


def _non_finite(value: Any, path: str) -> tuple[str, float] | None:
    """Where ``value`` holds a NaN or an infinite double (``["a"]["b"][2]``) and which; None
    if nowhere."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path or "the projection", value)
    if isinstance(value, Mapping):
        items: Any = ((f"[{json.dumps(str(k), ensure_ascii=False)}]", v) for k, v in value.items())
    elif isinstance(value, list | tuple | set | frozenset):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for step, v in items:
        found = _non_finite(v, path + step)
        if found is not None:
            return found
    return None


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_finite(v) for v in value]
    return value


def encode_finite(value: Mapping[str, Any] | None) -> str:
    """:func:`encode_value` with every NaN and infinite double written as null (for an entity
    sent as it is: the data is what it is, and the change must still be notified)."""
    return _encode(_finite(value))


def assemble(prefix: str, kind: str, parts: tuple[str, str, str], value_json: str,
             seq: int) -> bytes:  # fmt: skip
    """One notification from precomputed pieces: the same bytes as :func:`notification`.

    ``kind`` is one of created/modified/removed (plain words: no escaping needed).
    """
    head, tail, end = parts
    return f"{prefix}{kind}{head}{value_json}{tail}{seq}{end}".encode()


def notification(
    listener: str, kind: str, type_: str, key: str, value: Mapping[str, Any] | None,
    table_change: str | None, partition: int, offset: int | None, version: int, seq: int,
    ts: int, *, snapshot: bool = False, registration: str | None = None,
    moved_to: str | None = None,
) -> bytes:  # fmt: skip
    """The JSON value of one notification (``snapshot`` marks include-current-state ones).

    Keys, in order: listener, registration (if given), kind, key, type, value, table_change,
    partition, offset, version, seq, ts and, for include-current-state ones,
    ``"snapshot": true``, for an entity that moved to another group ``moved_to``.
    """
    parts = change_parts(type_, key, table_change, partition, offset, version, ts, snapshot, moved_to)
    return assemble(listener_prefix(listener, registration), kind, parts, encode_value(value), seq)


def too_large(prefix: str, kind: str, parts: tuple[str, str, str], seq: int, size: int) -> bytes:
    """The small notification that stands for one over its output topic's limit: the same
    fields with a null ``value``, plus ``"error": "too-large"`` and the ``size`` it had."""
    head, tail, end = parts
    end = end[:-1] + f',"error":"too-large","size":{int(size)}}}'
    return f"{prefix}{kind}{head}null{tail}{int(seq)}{end}".encode()
