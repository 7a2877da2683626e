"""The table of one partition: every entity write goes through its :class:`TableApplier`.

An applier owns the rules of a write, each in one place:

- the stale check (:meth:`TableApplier.prior`): a write whose version is not newer than the
  entity's applied version (also a deleted one's) is dropped;
- the size check: a state record Kafka would refuse is not written (the caller
  dead-letters its input);
- staging the row in the partition's store (RocksDB gets it after the commit);
- the state-topic record: the value, or a tombstone whose headers keep the delete's version.
  A table-handler upsert's record is sent at once. Exactly-once (``hold``), a
  :meth:`TableApplier.write`'s (handlers' writes, deletes, move-outs) is sent once per
  consumed batch, by :meth:`TableApplier.send_unsent`, with the entity's latest row: an
  entity a batch writes many times (a flight's load, once per reservation) gets one record,
  as the store gets one row per commit. The worker sends them after each batch and before
  every commit (``Worker.checkpoint``); the transaction makes the batch's records visible
  together, so no reader sees a record ahead of the ones it depends on. At-least-once output
  is visible as it is sent, and a crash leaves a prefix of it: there each write's record is
  sent at once, in write order (held, a flight's load, sent at the first write of its batch,
  could arrive without the reservations it counts, which a restart then counted again);
- the change sink (cluster listeners);
- the entity directory claim when an entity appears in this partition or changes group, so
  the group it left hears of it (services/worker/directory.py).

The fast path (services/worker/fastpath.py) and the general path (runtime) differ only in
how they read an input record; both apply it here.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from fifolane.serde.state_records import state_headers
from services.worker.kafka import SEND_FAILED, TxnProducer
from services.worker.metrics import Stats
from services.worker.sink import ChangeSink
from services.worker.state import RAW_VERSION, ROW_VERSION, PartitionStore, Row

__all__ = ["APPLIED", "STALE", "TOO_LARGE", "Claim", "TableApplier"]

#: Outcomes of a write.
APPLIED, STALE, TOO_LARGE = 1, 0, 2

#: ``claim(partition, entity key, group, version, deleted)``: tell the directory where the
#: entity lives.
Claim = Callable[[int, bytes, str, int, bool], None]

_GLEN = struct.Struct(">H")
_DELETED = 1


class TableApplier:
    """Applies entity writes to one partition (see the module docstring)."""

    __slots__ = ("_absent", "_claim", "_db_get", "_group_index", "_headers", "_need_old", "_overlay", "_recent", "_out", "_sink",
                 "_topic", "_unpack", "_unsent", "_hold", "displaced", "partition", "room", "stats", "store")

    def __init__(self, store: PartitionStore, out: TxnProducer, *, state_topic: str, room: int,
                 stats: Stats, sink: ChangeSink | None = None, claim: Claim | None = None,
                 state_headers: bool = False, hold: bool = False) -> None:
        self.store = store
        self.partition = store.partition
        self.stats = stats
        #: bytes of key + value + headers a state record may have
        self.room = room
        self._out = out  # the producer of the open transaction
        self._topic = state_topic
        self._sink = sink
        self._claim = claim
        self._headers = state_headers
        self._overlay = store.overlay
        self._group_index = store.group_index
        self._recent = store.recent
        self._db_get = store.db.get
        self._absent = store.absent
        self._unpack = store.unpack
        self._unsent = store.unsent
        #: hold handler writes' records to the end of the batch (see the module docstring)
        self._hold = hold
        # The previous row itself (not only its version) is needed by a change sink and to
        # keep the group index.
        self._need_old = sink is not None or store.group_index
        #: the live row of another group that the last :meth:`write` replaced (None: none)
        self.displaced: Row | None = None

    # -- the stale check -----------------------------------------------------------------------
    def prior(self, ekey: bytes, version: int) -> Row | bytes | int | None:
        """:data:`STALE` if the entity's applied version is ``version`` or newer; else its
        latest row: None (unknown here), a :class:`Row`, or its packed bytes when nobody
        needs the row itself."""
        old = self._overlay.get(ekey) or self._recent.get(ekey)
        if old is not None:
            return STALE if version <= old.version else old
        if ekey in self._absent:
            return None
        generation = self.store.generation
        data = self._db_get(b"e:" + ekey)
        if data is None:
            if self._group_index:  # app handlers: the handler and the write look it up again
                self.store.note_absent(ekey, generation)
            return None
        stored = ROW_VERSION.unpack_from(data)[0]
        if stored == RAW_VERSION or self._need_old:  # a raw row is read on first use
            row = self._unpack(data)
            if row is None:
                return None
            return STALE if version <= row.version else row
        return STALE if version <= stored else data

    def latest(self, ekey: bytes) -> Row | None:
        """The entity's latest row, staged writes first (deleted rows keep their version)."""
        return self.store.get(ekey)

    # -- writes --------------------------------------------------------------------------------
    def upsert(self, ekey: bytes, type_name: bytes, group: str, gbytes: bytes, version: int,
               value: bytes, record: dict[str, Any] | None, offset: int | None, ts: int) -> int:
        """Apply an upsert of ``ekey`` to ``value`` (the encoded entity, written as is)."""
        old = self.prior(ekey, version)
        if old is STALE:
            return STALE
        if len(ekey) + len(value) + (len(gbytes) + len(type_name) if self._headers else 0) > self.room:
            return TOO_LARGE
        new = Row(version, False, group, value)
        unsent = self._unsent
        if unsent and ekey in unsent:
            del unsent[ekey]  # this newer record goes out now
            self.stats.state_coalesced += 1
        # not STALE (an int) here, so a Row unless unknown (None) or packed (bytes)
        old_row: Row | None = None if old is None or type(old) is bytes else old  # type: ignore[assignment]
        if self._group_index:
            self.store.put(ekey, new, old_row)
        else:
            self._overlay[ekey] = new  # what put() does without the group index
        if self._claim is not None and (
                (old_row.deleted or old_row.group != group) if old_row is not None
                else old is None or _moved(old, gbytes)):  # type: ignore[arg-type]
            self._claim(self.partition, ekey, group, version, False)
        headers = state_headers(type_name, gbytes, version) if self._headers else None
        try:  # the client's own produce; if it cannot, the one that waits for room, maps errors
            if headers is None:
                self._out.send(self._topic, value, ekey, self.partition)  # headers=None costs 0.4 us
            else:
                self._out.send(self._topic, value, ekey, self.partition, headers=headers)
        except SEND_FAILED as exc:
            self._out.produce(self._topic, value, ekey, self.partition, headers, full=type(exc) is BufferError)
        if self._sink is not None:
            self._sink.on_change(self.partition, offset, ts, ekey, old_row, new, record)
        return APPLIED

    def write(self, ekey: bytes, new: Row, record: dict[str, Any] | None, offset: int | None,
              ts: int, *, moved_to: str | None = None, same_version: bool = False,
              deleted_there: bool = False) -> int:
        """Apply a write of a whole row: a delete (``new.deleted``) or a handler's write.
        ``moved_to``: a move-out (services/worker/directory.py), already decided by its own
        rule (which also settles equal versions), so not checked here; ``deleted_there``: the
        winner in ``moved_to`` is a deletion (listeners hear a plain removal, no move).
        ``same_version``: the write may have the applied version (a stage handler moving its
        entity on)."""
        self.displaced = None
        old = self.prior(ekey, new.version + same_version) if moved_to is None else self.latest(ekey)
        if old is STALE:
            return STALE
        if new.value is not None and len(ekey) + len(new.value) + (
                len(new.group.encode(errors="replace")) + ekey.find(b"/") if self._headers else 0) > self.room:
            return TOO_LARGE
        old_row = self._unpack(old) if type(old) is bytes else old
        assert old_row is None or isinstance(old_row, Row)
        self.displaced = old_row if (old_row is not None and not old_row.deleted and old_row.group != new.group
                                     and moved_to is None) else None
        self.store.put(ekey, new, old_row)
        # Claimed unless the entity was live here in this group: where it appears, changes
        # group, or is deleted while not live here (it may be live in another partition, which
        # must hear of it; a tombstone here may be an earlier move-out's).
        if self._claim is not None and moved_to is None and (
                old_row is None or old_row.deleted or old_row.group != new.group):
            self._claim(self.partition, ekey, new.group, new.version, new.deleted)
        if self._hold:
            unsent = self._unsent
            if ekey in unsent:
                self.stats.state_coalesced += 1  # its earlier record in this batch is not sent
            else:
                unsent[ekey] = None  # sent by send_unsent, with the row the entity has then
        else:
            self._send(ekey, new)
        if self._sink is not None:
            self._sink.on_change(self.partition, offset, ts, ekey, old_row, new, record,
                                 None if deleted_there else moved_to)
        return APPLIED

    def send_unsent(self) -> None:
        """Send the state records of the writes since the last call: one per entity, its
        latest row (the value, or a tombstone with the delete's version in its headers)."""
        unsent = self._unsent
        if not unsent:
            return
        overlay, send = self._overlay, self._send
        for ekey in unsent:
            row = overlay.get(ekey)
            if row is not None:  # (else not staged any more: rolled back)
                send(ekey, row)
        unsent.clear()

    def _send(self, ekey: bytes, row: Row) -> None:
        """Produce the state record of a row: its value, or a tombstone whose headers keep
        the delete's version (upserts get headers only with ``state_headers``)."""
        out, topic, p = self._out, self._topic, self.partition
        if row.deleted or self._headers:
            headers = state_headers(ekey[: ekey.find(b"/")], row.group.encode(), row.version)
            out.produce(topic, row.value, ekey, p, headers)
        else:
            try:  # as in upsert: the client's own produce first
                out.send(topic, row.value, ekey, p)
            except SEND_FAILED as exc:
                out.produce(topic, row.value, ekey, p, None, full=type(exc) is BufferError)


def _moved(packed: bytes, gbytes: bytes) -> bool:
    """Whether a packed row is deleted or of another group than ``gbytes``."""
    if packed[8] & _DELETED:
        return True
    glen = _GLEN.unpack_from(packed, 9)[0]
    return packed[11 : 11 + glen] != gbytes
