"""Taking a consumed batch: well-formed table upserts go straight to their partition's table.

The common case, a well-formed upsert for the built-in table handler whose group has nothing
queued, is read here with the codec's field scanner (key, group and version, no decode)
and applied by the partition's :class:`services.worker.table.TableApplier`, without building
an Event. The entity directory's claims (records of the directory topic, half the records of
a stream of new entities) go straight to their partition's
:class:`services.worker.directory.DirectoryApplier`, also in a worker of app handlers.
Everything else (errors, deletes, bad records, control records, app handlers, busy groups)
goes to the general path, which applies it through the same applier. So the two paths differ
only in how they read a record (tests/unit/test_worker_ingest.py checks that both give the
same records, state and counts).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from fifolane.serde import Decoded
from services.worker.checkpoint import Checkpoint
from services.worker.directory import CONTROL_HEADER, DirectoryApplier
from services.worker.kafka import Record
from services.worker.metrics import Stats
from services.worker.parking import Parking
from services.worker.sink import ChangeSink
from services.worker.state import MAX_GROUP_BYTES, MAX_VERSION, MIN_VERSION
from services.worker.table import APPLIED, STALE, TableApplier

__all__ = ["FastPath", "TableType"]

#: Per entity type taken by the fast path: (entity-key prefix, type name bytes, key field,
#: group field, version field).
TableType = tuple[bytes, bytes, str, str, str]
#: The general path: a record, and its decoded value if the fast path decoded it already.
General = Callable[[Record, "Decoded | None"], None]
#: A record whose state record Kafka would refuse: dead-letter it (msg, reason, error).
Refuse = Callable[[Record, str, str], None]


class FastPath:
    """Takes consumed batches for one worker (see the module docstring)."""

    def __init__(self, *, input_topic: str, tables: Mapping[int, TableApplier],
                 table_types: dict[str, TableType], codec: Any, busy: Collection[str],
                 ckpt: Checkpoint, stats: Stats, sink: ChangeSink | None, general: General,
                 refuse: Refuse, directory_topic: str | None = None,
                 directories: Mapping[int, DirectoryApplier] | None = None,
                 parking: Parking | None = None) -> None:
        self._input = input_topic
        self._tables = tables
        self._types = table_types
        self._decode = codec.decoder()
        # Reads key, group and version of those types' upserts without decoding the record.
        self._scan = codec.scanner(table_types) if table_types else None
        self._busy = busy  # groups with queued events: theirs must queue behind them
        self._ckpt = ckpt
        self._stats = stats
        self._sink = sink
        self._general = general
        self._refuse = refuse
        # The consumer reads the directory topic too: its claims are applied here, by the
        # directory partition's applier (any other record of it by the general path).
        self._dir_topic = directory_topic
        self._directories: Mapping[int, DirectoryApplier] = directories if directories is not None else {}
        self._dir_taken = 0  # directory records taken in this batch (see _claim)
        self._parking = parking  # parked groups' events go to the general path (held there)

    def take(self, msgs: list[Record]) -> None:
        """Take a consumed batch (this loop is the worker's hot path)."""
        ckpt = self._ckpt
        if ckpt.bisecting or not self._types:
            if ckpt.bisecting or self._dir_topic is None:
                for msg in msgs:
                    self._general(msg, None)
            else:  # app handlers only: the directory's records are still taken here
                self._take_other(msgs)
            return
        tables, table_types, busy = self._tables, self._types, self._busy
        parked = self._parking.groups if self._parking is not None else {}
        skipping = ckpt.skipping(self._input)  # replayed records to skip: the general path's
        general, decode, input_topic = self._general, self._decode, self._input
        dir_topic = self._dir_topic
        dir_nexts: dict[int, int] = {}
        dir_last: Record | None = None
        scan = self._scan
        sink = self._sink
        if scan is not None and sink is not None and sink.needs_records(table_types):
            scan = None  # a listener will read these records: decode once, here
        nexts: dict[int, int] = {}
        last: Record | None = None
        consumed = processed = superseded = 0
        try:
            for msg in msgs:
                if msg.error() is not None:
                    general(msg, None)
                    continue
                if dir_topic is not None and msg.topic() != input_topic:
                    if self._claim(msg, dir_nexts):
                        dir_last = msg
                    continue
                p = msg.partition()
                table = tables.get(p)
                if table is None:
                    continue  # not ours (any more), or not restored yet: replayed once it is
                if skipping and p in skipping:
                    general(msg, None)
                    continue
                headers = msg.headers()
                if headers is not None and _is_control(headers):
                    general(msg, None)  # the worker's own records (move-outs) or bad ones
                    continue
                value = msg.value()
                scanned = scan(value) if scan is not None else None
                if scanned is not None:
                    et, (key, group, version) = scanned
                    decoded = record = None
                    fast = table_types.get(et.name)
                    if fast is None:
                        general(msg, None)
                        continue
                else:
                    try:
                        decoded = decode(value)
                    except Exception:  # noqa: BLE001 - the general path names the reason
                        general(msg, None)
                        continue
                    et, record, is_delete = decoded
                    fast = None if is_delete else table_types.get(et.name)
                    if fast is None:
                        general(msg, decoded)
                        continue
                    key, group, version = record.get(fast[2]), record.get(fast[3]), record.get(fast[4])
                mkey = msg.key()
                if (type(key) is not str or not key or type(group) is not str or not group
                        or type(version) is not int or mkey is None or mkey != group.encode()
                        or group in busy or (parked and group in parked) or len(mkey) > MAX_GROUP_BYTES
                        or not MIN_VERSION <= version <= MAX_VERSION):
                    general(msg, decoded)
                    continue
                offset = msg.offset()
                nexts[p] = offset + 1
                last = msg
                consumed += 1
                assert value is not None  # it scanned or decoded
                outcome = table.upsert(fast[0] + key.encode(), fast[1], group, mkey, version, value,
                                       record, offset, msg.timestamp()[1] if sink is not None else 0)
                if outcome == APPLIED:
                    processed += 1
                elif outcome == STALE:
                    superseded += 1
                else:
                    self._refuse(msg, "too-large", f"the state record of {et.name} {key} would be "
                                 f"{len(value) + len(fast[0]) + len(key)} bytes (and its headers), over "
                                 f"the {table.room} bytes the state topic takes")
        finally:
            self._claimed(dir_nexts, dir_last)
            if consumed:
                assert last is not None
                ckpt.consumed_batch(input_topic, nexts, consumed,
                                    (input_topic, last.partition(), last.offset()))
            stats = self._stats
            stats.consumed += consumed
            stats.processed += processed
            stats.state_writes += processed
            stats.superseded += superseded

    def _take_other(self, msgs: list[Record]) -> None:
        """A batch without fast-path records: the directory's claims, the rest general."""
        dir_topic, general = self._dir_topic, self._general
        dir_nexts: dict[int, int] = {}
        dir_last: Record | None = None
        try:
            for msg in msgs:
                if msg.error() is None and msg.topic() == dir_topic:
                    if self._claim(msg, dir_nexts):
                        dir_last = msg
                else:
                    general(msg, None)
        finally:
            self._claimed(dir_nexts, dir_last)

    def _claim(self, msg: Record, nexts: dict[int, int]) -> bool:
        """Apply a directory record (a claim) if its partition is ours (True then), counted
        by :meth:`_claimed`; any other record goes to the general path."""
        directory = self._directories.get(msg.partition()) if msg.topic() == self._dir_topic else None
        if directory is None:
            self._general(msg, None)  # not ours (any more), or not restored yet
            return False
        nexts[msg.partition()] = msg.offset() + 1
        self._dir_taken += 1
        directory.apply(msg.key(), msg.value())
        return True

    def _claimed(self, nexts: dict[int, int], last: Record | None) -> None:
        """Tell the checkpoint which directory records were taken (by :meth:`_claim`)."""
        if last is not None and self._dir_topic is not None:
            self._ckpt.consumed_batch(self._dir_topic, nexts, self._dir_taken,
                                      (self._dir_topic, last.partition(), last.offset()))
        self._dir_taken = 0


def _is_control(headers: Sequence[tuple[str, Any]]) -> bool:  # a value may be null (Any: see ingest)
    for name, _ in headers:  # noqa: SIM110 - a plain loop is cheaper on the hot path
        if name == CONTROL_HEADER:
            return True
    return False
