"""What the query endpoint reads: committed snapshots of the stores, each with its position.

A *view* of a partition is a RocksDB snapshot of committed state paired with the state-topic
position it reflects: every committed state record below ``position`` is in it, none at or
above it. Readers only ever read views, so a read sees one commit's state, never a write of
an open transaction (those live in the store's overlay) and never a half-restored store (a
restoring partition has no view). docs/formats.md, "Query API", defines the position.

A published view may also be marked *stale* (:meth:`Views.mark_stale`): the store holds
commits the view does not, and their position could not be learned for a while (the state
topic's offsets cannot be read: services/worker/query/positions.py). A stale owner view is
not answered from (its answer would miss those commits: "not found" for an entity the
store has); the endpoint answers ``unavailable`` until a newer view is published.

Threads: the poll thread publishes (after a commit, at activation), reader threads read,
and a store is closed only after :meth:`Views.withdraw` has waited for the reads of its
partition in flight (a live snapshot keeps RocksDB's lock, and the next open of the store
would fail).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

__all__ = ["View", "Views"]

T = TypeVar("T")


class View(NamedTuple):
    """A committed snapshot of one partition's store and the position it reflects."""

    snap: Any  # rocksdict Snapshot (or the live Rdict of a store nobody writes meanwhile)
    position: int
    #: state-topic records committed but not in this view yet (standbys; 0 for an owner)
    lag: int = 0
    #: the store's RocksDB sequence number when the snapshot was taken, and the store: a
    #: scan reads a live iterator, which is this view only while the sequence is unchanged
    #: (rocksdict's Snapshot.iter does not read the snapshot: see reads.live_iterator)
    seq: int = -1
    db: Any = None
    #: a stored row's bytes -> Row (PartitionStore.unpack: raw rows need the value reader)
    unpack: Callable[[bytes], Any] | None = None
    #: whether ``snap`` is a standby's (stale reads only)
    standby: bool = False


def view_of(store: Any, position: int, lag: int = 0, *, standby: bool = False) -> View:
    """A view of a :class:`services.worker.state.PartitionStore` as it is now (call on the
    thread that writes the store, between its writes)."""
    db = store.db
    return View(db.snapshot(), position, lag, db.latest_sequence_number(), db, store.unpack, standby)


class Views:
    """Published views by partition, and the reads in flight on each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._views: dict[int, View] = {}
        self._reading: dict[int, int] = {}
        self._stale: dict[int, str] = {}  # partition -> why its view is behind its store

    def publish(self, partition: int, view: View) -> None:
        with self._lock:
            self._views[partition] = view
            self._stale.pop(partition, None)

    def mark_stale(self, partition: int, why: str) -> None:
        """The partition's store holds commits its view does not, and their position is not
        known (``why``): its view is not answered from until the next :meth:`publish`."""
        with self._lock:
            if partition in self._views:
                self._stale[partition] = why

    def stale(self, partition: int) -> str | None:
        """Why the partition's view is stale (None: it is not)."""
        return self._stale.get(partition)

    def position(self, partition: int) -> int | None:
        view = self._views.get(partition)
        return None if view is None else view.position

    def has(self, partition: int) -> bool:
        return partition in self._views

    def get(self, partition: int) -> View | None:
        return self._views.get(partition)

    def partitions(self) -> list[int]:
        with self._lock:
            return sorted(self._views)

    def read(self, partition: int, fn: Callable[[View], T]) -> T | None:
        """``fn(view)`` on the partition's view (None: no view). ``fn`` must not keep the
        snapshot or an iterator of it: it returns plain data."""
        with self._lock:
            view = self._views.get(partition)
            if view is None:
                return None
            self._reading[partition] = self._reading.get(partition, 0) + 1
        try:
            return fn(view)
        finally:
            del view
            with self._lock:
                self._reading[partition] -= 1

    def withdraw(self, partition: int, timeout: float = 10.0) -> None:
        """Stop publishing the partition and wait for its reads in flight (microseconds:
        a read is one lookup, or one page of a scan)."""
        with self._lock:
            self._views.pop(partition, None)
            self._stale.pop(partition, None)
        deadline = time.monotonic() + timeout
        while self._reading.get(partition, 0) > 0 and time.monotonic() < deadline:
            time.sleep(0.0002)
