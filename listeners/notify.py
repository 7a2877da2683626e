"""The notification record: JSON value per docs/formats.md, and a JSON encoder for the
values CEL and Avro produce (date, datetime, timedelta, Decimal, UUID, bytes)."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

__all__ = ["HEADER_LISTENER", "dumps", "notification"]

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


_ENCODER = json.JSONEncoder(default=_default, separators=(",", ":"), ensure_ascii=False)


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON; dates and times as ISO-8601, durations in seconds, bytes base64."""
    return _ENCODER.encode(obj).encode()


def notification(
    listener: str, kind: str, type_: str, key: str, value: Mapping[str, Any] | None,
    table_change: str | None, partition: int, offset: int | None, version: int, seq: int,
    ts: int, *, snapshot: bool = False,
) -> bytes:  # fmt: skip
    """The JSON value of one notification (``snapshot`` marks include-current-state ones)."""
    doc: dict[str, Any] = {
        "listener": listener,
        "kind": kind,
        "key": key,
        "type": type_,
        "value": value,
        "table_change": table_change,
        "partition": partition,
        "offset": offset,
        "version": version,
        "seq": seq,
        "ts": ts,
    }
    if snapshot:
        doc["snapshot"] = True
    return dumps(doc)
