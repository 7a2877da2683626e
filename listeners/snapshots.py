"""Include current state: announce the existing entities to a listener, in chunks.

Per listener and owned partition, the owner announces the committed entities in key order,
a chunk at every checkpoint (a safe point: nothing in flight, nothing staged). Live
notifications of that listener for keys *after* the cursor are held back (:meth:`holds`):
the chunk that reaches the key announces its then current state. So, per key, the consumer
sees the state as of its chunk, then every later change: nothing lost, nothing repeated at
the seam. Each chunk writes its progress (``<name>/snapshot/<partition>``,
:class:`listeners.registry.Progress`) to the registry in the same transaction as its
notifications; a new owner (after a move or a crash) resumes from the committed cursor.
A registration's snapshot is keyed by its ``created_at`` (its instance): a listener
registered again gets a new snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from listeners.model import ListenerSpec
from listeners.registry import Progress, progress_key
from services.worker.sink import Row

__all__ = ["Snapshots"]

log = logging.getLogger(__name__)

_Key = tuple[str, int]  # (listener, source partition)
_MISSING: Any = object()
#: ``announce(listener, partition, ekey, row) -> sent?``: one existing entity to a listener.
Announce = Callable[[str, int, bytes, Row], bool]
Produce = Callable[..., None]


class Snapshots:
    """Include-current-state progress of every listener on every owned partition."""

    def __init__(self, registry_topic: str, batch: int = 5000) -> None:
        self._topic = registry_topic
        self.batch = batch
        self._durable: dict[_Key, Progress] = {}  # committed progress, from the registry
        self._open: dict[_Key, Progress] = {}  # snapshots in progress on owned partitions
        #: The same, read only: true while any snapshot is in progress (no call to ask).
        self.in_progress: Mapping[_Key, Progress] = self._open
        self._undo: dict[_Key, Any] = {}  # cursors before the open transaction moved them
        self.sent = 0

    # -- what the registry says ----------------------------------------------------------------
    def durable(self, key: _Key, progress: Progress | None) -> None:
        """A committed progress record (None: its tombstone)."""
        if progress is None:
            self._durable.pop(key, None)
        else:
            self._durable[key] = progress

    # -- lifecycle -----------------------------------------------------------------------------
    def begin(self, spec: ListenerSpec, partition: int) -> None:
        """The listener is active on an owned partition: start or resume its snapshot."""
        if not spec.include_current_state or "created" not in spec.kinds:
            return
        instance = spec.created_at.isoformat()
        k = (spec.name, partition)
        d = self._durable.get(k)
        if d is not None and d.instance == instance:
            if not d.done:
                self._open[k] = d
        else:
            self._open[k] = Progress(spec.name, partition, instance)

    def end(self, name: str, owned: Iterable[int], *, forget: bool, produce: Produce) -> None:
        """The listener is no longer active here; ``forget``: removed or replaced, so its
        committed progress is cleaned up (tombstones, in the open transaction)."""
        for p in owned:
            k = (name, p)
            self._open.pop(k, None)
            self._undo.pop(k, None)
            if forget and k in self._durable:
                produce(self._topic, None, progress_key(name, p).encode(), 0)

    def release(self, partitions: set[int]) -> None:
        for k in [k for k in self._open if k[1] in partitions]:
            del self._open[k]
        for k in [k for k in self._undo if k[1] in partitions]:
            del self._undo[k]

    def holds(self, name: str, partition: int, ekey: bytes) -> bool:
        """Whether a live notification of ``ekey`` waits for the snapshot chunk that reaches
        the key (which announces the then current state)."""
        st = self._open.get((name, partition))
        return st is not None and (st.cursor is None or ekey > st.cursor)

    @property
    def pending(self) -> list[_Key]:
        return sorted(self._open)

    def __bool__(self) -> bool:
        return bool(self._open)

    # -- chunks --------------------------------------------------------------------------------
    def chunks(self, owned: set[int], rows: Callable[[int, bytes | None], Iterator[tuple[bytes, Row]]],
               type_of: Callable[[str], str | None], announce: Announce, produce: Produce) -> None:
        """One chunk of every snapshot in progress (at a safe point), progress written with it."""
        keys = [k for k in self._open if k[1] in owned]
        if not keys:
            return
        budget = max(200, self.batch // len(keys))
        for k in keys:
            self._chunk(k, budget, rows, type_of, announce, produce)

    def _chunk(self, k: _Key, budget: int, rows: Callable[[int, bytes | None], Iterator[tuple[bytes, Row]]],
               type_of: Callable[[str], str | None], announce: Announce, produce: Produce) -> None:
        name, p = k
        st = self._open.get(k)
        if st is None:
            return  # its listener was suspended by an earlier chunk (its output topic refused it)
        type_ = type_of(name)
        prefix = type_.encode() + b"/" if type_ else None
        cursor, sent, scanned, done = st.cursor, st.sent, 0, True
        for ekey, row in rows(p, cursor):
            if scanned >= budget:
                done = False
                break
            scanned += 1
            cursor = ekey
            if prefix is not None and not ekey.startswith(prefix):
                continue
            if announce(name, p, ekey, row):
                sent += 1
                self.sent += 1
            elif k not in self._open:
                return  # suspended by this very announcement (listeners.runtime.refused)
        progress = Progress(name, p, st.instance, cursor, done, sent)
        if k not in self._undo:
            self._undo[k] = st
        if done:
            del self._open[k]
            log.info("listener %r: current state of partition %d sent (%d)", name, p, sent)
        else:
            self._open[k] = progress
        produce(self._topic, progress.to_json(), progress_key(name, p).encode(), 0)

    # -- the transaction -----------------------------------------------------------------------
    def commit(self) -> None:
        self._undo.clear()

    def rollback(self) -> None:
        """The chunks of the aborted transaction were not sent: their cursors go back."""
        for k, before in self._undo.items():
            if before is _MISSING:
                self._open.pop(k, None)
            else:
                self._open[k] = before
        self._undo.clear()
