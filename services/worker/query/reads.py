"""Reads of a view: one entity, a page of a group, and their JSON.

Each function runs inside :meth:`services.worker.query.views.Views.read` (the store cannot
close meanwhile) and returns plain data. Entity reads are point reads of the view's RocksDB
snapshot. Scans need an iterator, and rocksdict (0.3.29) gives no iterator over a snapshot
(``Snapshot.iter()`` reads the live database), so a scan takes a live iterator, which RocksDB
pins at its creation, and uses it only when the store's sequence number shows that nothing
was written since the view's snapshot (:func:`live_iterator`); otherwise the caller waits for
the next view.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import uuid
from typing import Any, NamedTuple

from services.worker.query.views import View
from services.worker.state import Row

__all__ = ["GroupPage", "Stale", "json_default", "live_iterator", "row_at", "scan_group"]

_MISSING = "key not found"  # rocksdict's message for a Snapshot[key] miss (a bare Exception)


class Stale(Exception):  # noqa: N818 - a signal between the reader and its caller, not an error
    """The store was written after the view's snapshot: read the next view."""


def row_at(view: View, ekey: bytes) -> Row | None:
    """The entity's row in the view (a deleted one too: it keeps its version)."""
    try:
        data = view.snap[b"e:" + ekey]
    except Exception as exc:  # rocksdict raises a bare Exception for a missing key
        if str(exc) != _MISSING:
            raise
        return None
    if data is None:
        return None
    assert view.unpack is not None
    row: Row | None = view.unpack(data)
    return row


def live_iterator(view: View) -> Any:
    """A RocksDB iterator that reads exactly the view's state (:class:`Stale` if the store
    was written since the view's snapshot)."""
    db = view.db
    if db is None or db.latest_sequence_number() != view.seq:
        raise Stale
    it = db.iter()
    if db.latest_sequence_number() != view.seq:
        raise Stale  # written while the iterator was made: it may be after that write
    return it


class GroupPage(NamedTuple):
    """Live entities of a group, in key order, and where the next page starts (or None)."""

    rows: list[tuple[bytes, Row]]
    next_after: bytes | None


def scan_group(view: View, group: str, *, start: bytes = b"", end: bytes | None = None,
               after: bytes | None = None, limit: int = 1000, indexed: bool = True) -> GroupPage:
    """A page of the group's live entities with keys (``<type>/<key>``) in ``[start, end)``
    and after ``after``. With ``indexed`` through the group index; without it (a store of a
    table-only worker keeps none) by a scan of the whole partition."""
    rows: list[tuple[bytes, Row]] = []
    it = live_iterator(view)
    prefix = (b"i:" + group.encode() + b"\x00") if indexed else b"e:"
    begin = max(start, after + b"\x00") if after is not None else start
    it.seek(prefix + begin)
    last: bytes | None = None
    while it.valid():
        k = it.key()
        if not k.startswith(prefix):
            break
        ekey = k[len(prefix):]
        if end is not None and ekey >= end:
            break
        if indexed:
            row = row_at(view, ekey)
        else:
            assert view.unpack is not None
            row = view.unpack(it.value())
        if row is not None and not row.deleted and row.group == group:
            if len(rows) == limit:
                return GroupPage(rows, last)
            rows.append((ekey, row))
            last = ekey
        it.next()
    return GroupPage(rows, None)


def json_default(value: Any) -> Any:
    """What the JSON encoder calls for a value it cannot write, found in a decoded Avro value:
    bytes as base64, decimals and UUIDs as strings, times as ISO 8601 (docs/formats.md,
    "Query API"). Decoded records are otherwise JSON data already (str keys, lists)."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON data")
