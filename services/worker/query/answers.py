"""What the endpoint answers (docs/formats.md, "Query API"), without HTTP.

:class:`Answers` turns a request's parameters into ``(status, body)``; the HTTP layer
(services/worker/query/server.py) only parses, waits and writes. Where the worker stands
comes from a :class:`Local` (the query service; unit tests pass a fake):

- a partition with a published view and active on this worker is answered from the view,
  unless the view is stale (its store holds commits whose position is not known:
  services/worker/query/positions.py): then ``unavailable``, never an answer that misses them;
- one this worker restores answers ``restoring`` with the restore's progress;
- with ``stale=true`` a standby's view answers, with its lag;
- any other partition answers ``moved`` with the owner the routing names (``unavailable``
  while nobody owns it).

Two answers are not final: ``behind`` (the view is older than ``min_position``) and
``busy`` (a scan found the store written after its view); the HTTP layer asks again until
its deadline.
"""

from __future__ import annotations

import struct
from typing import Any, Protocol

from fifolane.partitioner import partition_for
from fifolane.query import (
    BAD_REQUEST,
    MOVED,
    NOT_FOUND,
    OK,
    RESTORING,
    UNAVAILABLE,
    entity_key,
)
from services.worker.query.members import MemberInfo, Routing
from services.worker.query.reads import Stale, row_at, scan_group
from services.worker.query.views import View, Views
from services.worker.state import Row

__all__ = ["BEHIND", "BUSY", "Answer", "Answers", "Local"]

BEHIND = "behind"  # not final: the view is older than min_position
BUSY = "busy"  # not final: the store moved past the view during a scan

Answer = tuple[str, dict[str, Any]]

_PARTITION = struct.Struct(">i")  # a directory row's value (services/worker/directory.py)
MAX_LIMIT = 10_000


class Local(Protocol):
    """This worker, as the answers see it."""

    me: MemberInfo
    views: Views  # owned partitions
    standby_views: Views
    directory_views: Views
    directory: bool  # whether entities are found through the entity directory
    group_index: bool

    def routing(self) -> Routing: ...
    def active(self, partition: int) -> bool: ...
    def restoring(self, partition: int) -> tuple[int, int] | None: ...
    def decode(self, value: bytes) -> dict[str, Any]: ...
    def types(self) -> list[str]: ...


def _member(m: MemberInfo | None) -> dict[str, Any] | None:
    return None if m is None else {"worker": m.worker, "url": m.url}


def bad(message: str) -> Answer:
    return BAD_REQUEST, {"status": BAD_REQUEST, "error": message}


def _prefix_end(prefix: bytes) -> bytes | None:
    """The first key after every key that starts with ``prefix`` (None: no such key)."""
    b = bytearray(prefix)
    while b and b[-1] == 0xFF:
        b.pop()
    if not b:
        return None
    b[-1] += 1
    return bytes(b)


class Answers:
    """Answers of one worker's endpoint (see the module docstring)."""

    def __init__(self, local: Local) -> None:
        self.local = local

    # -- routing -----------------------------------------------------------------------------
    def _where(self, p: int, routing: Routing, extra: dict[str, Any]) -> Answer:
        """The answer for a partition this worker cannot read: restoring, moved, unavailable."""
        why = self.local.views.stale(p)
        if why is not None and self.local.active(p):
            return UNAVAILABLE, {"status": UNAVAILABLE, "partition": p, "owner": _member(self.local.me),
                                 "error": f"this worker owns partition {p} but cannot read it up to date now: "
                                          f"{why}; retry", **extra}
        progress = self.local.restoring(p)
        if progress is not None:
            done, total = progress
            return RESTORING, {"status": RESTORING, "partition": p, "owner": _member(self.local.me),
                               "progress": {"done": done, "total": total}, **extra}
        owner = routing.owner(p)
        if owner is not None and owner.url is None and owner.worker != self.local.me.worker:
            return UNAVAILABLE, {"status": UNAVAILABLE, "partition": p, "owner": _member(owner), "error": (
                f"worker {owner.worker} owns partition {p} but publishes no query address (started without "
                "--query-port?)"), **extra}
        if owner is None or owner.worker == self.local.me.worker or owner.url is None:
            return UNAVAILABLE, {"status": UNAVAILABLE, "partition": p, "owner": _member(owner),
                                 "error": "no worker serves this partition now (a rebalance?)", **extra}
        return MOVED, {"status": MOVED, "partition": p, "owner": _member(owner), **extra}

    def _view(self, p: int, stale: bool) -> tuple[Views, View] | None:
        local = self.local
        view = local.views.get(p)
        if view is not None and local.active(p) and local.views.stale(p) is None:
            return local.views, view
        if stale:
            view = local.standby_views.get(p)
            if view is not None:
                return local.standby_views, view
        return None

    def _partition_of_group(self, group: str, partition: int | None, routing: Routing) -> int | Answer:
        n = routing.input_partitions
        if partition is not None:
            if n and not 0 <= partition < n:
                return bad(f"partition {partition} does not exist (the input topic has {n})")
            return partition
        if not n:
            return UNAVAILABLE, {"status": UNAVAILABLE, "error": "routing not known yet: retry"}
        return partition_for(group.encode(), n)

    def _located(self, ekey: bytes, routing: Routing) -> int | Answer:
        """The input partition of an entity, through the entity directory."""
        local = self.local
        if not local.directory:
            return 0  # one input partition: nothing to look up
        n = routing.directory_partitions
        if not n:
            return UNAVAILABLE, {"status": UNAVAILABLE, "error": "routing not known yet: retry"}
        d = partition_for(ekey, n)
        extra = {"directory_partition": d}
        found = local.directory_views.read(d, lambda v: v.snap.get(b"e:" + ekey))
        if found is None:
            if not local.directory_views.has(d):
                owner = routing.directory_owner(d)
                if owner is not None and owner.url is None and owner.worker != local.me.worker:
                    return UNAVAILABLE, {"status": UNAVAILABLE, "owner": _member(owner), **extra,
                                         "error": f"worker {owner.worker} owns entity directory partition "
                                                  f"{d} but serves no queries (no --query-port)"}
                if owner is None or owner.url is None or owner.worker == local.me.worker:
                    return UNAVAILABLE, {"status": UNAVAILABLE, "error": "nobody serves the entity "
                                         "directory partition now (a rebalance?)", **extra}
                return MOVED, {"status": MOVED, "partition": None, "owner": _member(owner), **extra}
            return NOT_FOUND, {"status": NOT_FOUND, "partition": None, "position": None, **extra}
        row = Row.unpack(found)
        return _PARTITION.unpack(row.value)[0] if row.value else 0

    # -- entities ----------------------------------------------------------------------------
    def entity(self, type_name: str, key: str, *, group: str | None = None, partition: int | None = None,
               min_position: int | None = None, stale: bool = False) -> Answer:
        if type_name not in self.local.types():
            return bad(f"unknown entity type {type_name!r}; known: {', '.join(sorted(self.local.types()))}")
        ekey = entity_key(type_name, key)
        routing = self.local.routing()
        where: int | Answer
        if group is not None or partition is not None:
            where = self._partition_of_group(group or "", partition, routing)
        else:
            where = self._located(ekey, routing)
        if not isinstance(where, int):
            status, located = where
            return status, {**located, "type": type_name, "key": key}
        p = where
        head = {"type": type_name, "key": key, "partition": p}
        found = self._view(p, stale)
        if found is None:
            return self._where(p, routing, head)
        views, view = found
        if min_position is not None and view.position < min_position:
            return BEHIND, {**head, "position": view.position, "min_position": min_position}
        got = views.read(p, lambda v: (row_at(v, ekey), v.position, v.lag, v.standby))
        if got is None:
            return self._where(p, routing, head)  # given up meanwhile
        row, position, lag, standby = got
        body: dict[str, Any] = {**head, "position": position, "owner": _member(routing.owner(p)
                                                                            if standby else self.local.me)}
        if standby:
            body.update(stale=True, lag=lag, served_by=_member(self.local.me))
        if row is None:
            return NOT_FOUND, {"status": NOT_FOUND, **body}
        if row.deleted:
            return NOT_FOUND, {"status": NOT_FOUND, **body, "version": row.version, "deleted": True,
                               "group": row.group}
        assert row.value is not None
        return OK, {"status": OK, **body, "group": row.group, "version": row.version,
                    "value": self.local.decode(row.value)}

    # -- groups ------------------------------------------------------------------------------
    def group(self, group: str, *, type_name: str | None = None, prefix: str | None = None,
              start: str | None = None, end: str | None = None, after: str | None = None,
              limit: int = 1000, partition: int | None = None, min_position: int | None = None,
              stale: bool = False) -> Answer:
        if not 1 <= limit <= MAX_LIMIT:
            return bad(f"limit must be 1..{MAX_LIMIT}, got {limit}")
        if type_name is None and (prefix is not None or start is not None or end is not None):
            return bad("prefix, start and end are keys of one entity type: pass type too")
        if type_name is not None and type_name not in self.local.types():
            return bad(f"unknown entity type {type_name!r}; known: {', '.join(sorted(self.local.types()))}")
        routing = self.local.routing()
        where = self._partition_of_group(group, partition, routing)
        if not isinstance(where, int):
            status, body = where
            return status, {**body, "group": group}
        p = where
        lo, hi = b"", None
        if type_name is not None:
            base = type_name.encode() + b"/"
            lo, hi = base, _prefix_end(base)
            if prefix is not None:
                lo, hi = base + prefix.encode(), _prefix_end(base + prefix.encode())
            if start is not None:
                lo = max(lo, base + start.encode())
            if end is not None:
                e = base + end.encode()
                hi = e if hi is None else min(hi, e)
        head = {"group": group, "partition": p}
        found = self._view(p, stale)
        if found is None:
            return self._where(p, routing, head)
        views, view = found
        if min_position is not None and view.position < min_position:
            return BEHIND, {**head, "position": view.position, "min_position": min_position}
        index = self.local.group_index

        def page(v: View) -> tuple[Any, int, int, bool]:
            return (scan_group(v, group, start=lo, end=hi, after=None if after is None else after.encode(),
                               limit=limit, indexed=index), v.position, v.lag, v.standby)
        try:
            got = views.read(p, page)
        except Stale:
            return BUSY, head
        if got is None:
            return self._where(p, routing, head)
        result, position, lag, standby = got
        entities = []
        for ekey, row in result.rows:
            t, _, k = ekey.decode().partition("/")
            assert row.value is not None
            entities.append({"type": t, "key": k, "version": row.version,
                             "value": self.local.decode(row.value)})
        answer = {"status": OK, **head, "position": position,
                  "owner": _member(routing.owner(p) if standby else self.local.me), "entities": entities,
                  "next": None if result.next_after is None else result.next_after.decode()}
        if standby:
            answer.update(stale=True, lag=lag, served_by=_member(self.local.me))
        return OK, answer

