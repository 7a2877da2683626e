"""Build history records from Kafka messages (anything with ``value()``, ``offset()``, ...).

Effect records are JSON objects with at least ``group`` and ``seq`` (and ``worker``,
``start``, ``end`` for exclusivity checks), as ``tests/apps/fault_app.py`` writes them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Protocol

from fifolane.serde.state_records import StateRecordReader
from fifolane.testing.model import Effect, Notification, TableEntry

__all__ = ["effects_from", "notifications_from", "table_from"]


class _Message(Protocol):
    def value(self) -> bytes | None: ...
    def key(self) -> bytes | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def headers(self) -> list[tuple[str, bytes]] | None: ...


def _or_minus_one(n: int | None) -> int:
    return -1 if n is None else n


def effects_from(messages: Iterable[_Message]) -> list[Effect]:
    """Effects in read order from JSON effect records."""
    out = []
    for m in messages:
        body = json.loads(m.value() or b"null")
        out.append(Effect(str(body["group"]), int(body["seq"]), str(body.get("worker", "")),
                          float(body.get("start", 0.0)), float(body.get("end", 0.0)),
                          _or_minus_one(m.partition()), _or_minus_one(m.offset())))
    return out


def table_from(messages: Iterable[_Message], codec: Any) -> dict[str, TableEntry]:
    """The committed state topic as a table, values decoded: per key, the record with the
    highest version, a live one before a tombstone of the same version (an entity that
    changed group has a tombstone in its old partition and its value in the new one;
    within a partition the last record is the highest). docs/formats.md, "Group changes".

    Versions come from the tombstones' headers and the upserts' values (or their headers,
    if written with them): :mod:`fifolane.serde.state_records`.
    """
    read = StateRecordReader(codec).read
    table: dict[str, TableEntry] = {}
    for m in messages:
        key = (m.key() or b"").decode()
        raw = m.value()
        found = read(raw, m.headers())
        if found is None:
            raise ValueError(f"state record {key!r} at offset {m.offset()} has no version in its "
                             "headers or value: not written by a fifolane worker")
        entry = TableEntry(found.version, None if raw is None else codec.decode(raw).record)
        cur = table.get(key)
        if cur is None or (entry.version, entry.present) >= (cur.version, cur.present):
            table[key] = entry
    return table


def notifications_from(messages: Iterable[_Message]) -> list[Notification]:
    """Notifications in read order from their JSON values (docs/formats.md)."""
    out = []
    for m in messages:
        body = json.loads(m.value() or b"null")
        out.append(Notification(str(body["listener"]), int(body["partition"]), int(body["seq"]),
                                str(body["key"]), str(body["kind"]), int(body.get("version", -1)),
                                body.get("value"), _or_minus_one(m.offset()), body.get("registration")))
    return out
