"""Taking a consumed batch: well-formed table upserts go straight to their partition's table.

The common case, a well-formed upsert for the built-in table handler whose group has nothing
queued, is read here with the codec's field scanner (key, group and version, no decode)
and applied by the partition's :class:`services.worker.table.TableApplier`, without building
an Event. Everything else (errors, deletes, bad records, control records, app handlers,
busy groups, records of the directory topic) goes to the general path, which applies it
through the same applier. So the two paths differ only in how they read a record
(tests/unit/test_worker_ingest.py checks that both give the same records, state and counts).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from fifolane.serde import Decoded
from services.worker.checkpoint import Checkpoint
from services.worker.directory import CONTROL_HEADER
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
                 refuse: Refuse, other_topics: bool, parking: Parking | None = None) -> None:
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
        self._other_topics = other_topics  # the consumer reads the directory topic too
        self._parking = parking  # parked groups' events go to the general path (held there)

    def take(self, msgs: list[Record]) -> None:
        """Take a consumed batch (this loop is the worker's hot path)."""
        ckpt = self._ckpt
        if ckpt.bisecting or not self._types:
            for msg in msgs:
                self._general(msg, None)
            return
        tables, table_types, busy = self._tables, self._types, self._busy
        parked = self._parking.groups if self._parking is not None else {}
        skipping = ckpt.skipping(self._input)  # replayed records to skip: the general path's
        general, decode, input_topic = self._general, self._decode, self._input
        other_topics = self._other_topics
        scan = self._scan
        sink = self._sink
        if scan is not None and sink is not None and sink.needs_records(table_types):
            scan = None  # a listener will read these records: decode once, here
        nexts: dict[int, int] = {}
        last: Record | None = None
        consumed = processed = superseded = 0
        try:
            for msg in msgs:
                if msg.error() is not None or (other_topics and msg.topic() != input_topic):
                    general(msg, None)
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
                                 f"{len(value) + len(fast[0]) + len(key)} bytes, over the {table.room} "
                                 "bytes the state topic takes")
        finally:
            if consumed:
                assert last is not None
                ckpt.consumed_batch(input_topic, nexts, consumed,
                                    (input_topic, last.partition(), last.offset()))
            stats = self._stats
            stats.consumed += consumed
            stats.processed += processed
            stats.state_writes += processed
            stats.superseded += superseded


def _is_control(headers: Sequence[tuple[str, Any]]) -> bool:  # a value may be null (Any: see ingest)
    for name, _ in headers:  # noqa: SIM110 - a plain loop is cheaper on the hot path
        if name == CONTROL_HEADER:
            return True
    return False
