"""The worker's hot path: well-formed table upserts applied straight from a consumed batch.

Called by the worker's poll loop (``Worker._ingest_batch``); kept apart to keep the worker
module readable. Everything it does not take goes to ``Worker._ingest``, the general path,
which does the same for these records, only slower (tests/unit/test_worker_ingest.py
checks that both give the same records, state, counters and offsets).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fifolane.serde.state_records import state_headers
from services.worker.app import Event
from services.worker.state import RAW_VERSION, ROW_VERSION, Row

if TYPE_CHECKING:
    from services.worker.runtime import Worker

__all__ = ["ingest_batch"]


def ingest_batch(w: Worker, msgs: list[Any]) -> None:
    """Take a consumed batch.

    The common case, a well-formed upsert for the built-in table handler whose group has
    nothing queued, is applied right here, without building an Event (this loop is the
    worker's hot path: about half of its CPU time per event). Anything else (errors,
    deletes, bad records, app handlers, busy groups) goes through ``Worker._ingest``, which
    does exactly the same for this case, only slower.
    """
    assigned, next_offsets, txn_start = w._assigned, w._next_offsets, w._txn_start
    decode = w.codec.decode
    table_types = w._table_types
    scan = w._scan
    listeners = w.listeners
    wants_records = getattr(listeners, "wants_records", None)
    if scan is not None and wants_records is not None and wants_records(table_types):
        scan = None  # a listener will read these records: decode once, here
    queued_groups = w.sched.queues
    # per partition: its overlay, RocksDB getter and store (None: keeps a group index,
    # so writes go through PartitionStore.put)
    parts = {p: (st.overlay, st.db.get, None if st.group_index else st.overlay, st.unpack)
             for p, st in w.stores.stores.items()}
    stores = w.stores.stores
    producer = w.producer
    assert producer is not None
    produce = producer.produce
    state_topic = w._state_topic
    with_headers = w.settings.state_headers
    stats = w.stats
    row_version = ROW_VERSION.unpack_from
    # The previous row itself (not just its version) is needed by change sinks and by
    # stores that keep a group index.
    need_old = listeners is not None or not all(part[2] is not None for part in parts.values())
    consumed = processed = superseded = 0
    try:
        for msg in msgs:
            if msg.error() is not None:
                w._ingest(msg)
                continue
            p = msg.partition()
            if p not in assigned:
                continue
            value = msg.value()
            # The record itself is not needed (change sinks decode it if they must):
            # read just the key, group and version if the codec can (scan), else decode.
            scanned = scan(value) if scan is not None else None
            if scanned is not None:
                et, (key, group, version) = scanned
                decoded = record = None
                fast = table_types.get(et.name)
                if fast is None:
                    w._ingest(msg)
                    continue
            else:
                try:
                    decoded = decode(value)
                except Exception:  # noqa: BLE001 - the general path names the reason
                    w._ingest(msg)
                    continue
                et, record, is_delete = decoded
                fast = None if is_delete else table_types.get(et.name)
                if fast is None:
                    w._ingest(msg, decoded)
                    continue
                key, group, version = record.get(fast[2]), record.get(fast[3]), record.get(fast[4])
            prefix, type_header = fast[0], fast[1]
            mkey = msg.key()
            if (type(key) is not str or not key or type(group) is not str or not group
                    or type(version) is not int or mkey is None or mkey != group.encode()
                    or group in queued_groups):
                w._ingest(msg, decoded)
                continue
            # -- bookkeeping, as in _ingest
            if not w._txn_open:
                w._begin()
            offset = msg.offset()
            next_offsets[p] = offset + 1
            if p not in txn_start:
                txn_start[p] = offset
            consumed += 1
            # -- the table handler, as in _apply_table / _write
            ekey = prefix + key.encode()
            overlay, db_get, plain, unpack = parts[p]
            old = overlay.get(ekey)  # inlined PartitionStore.get
            if old is not None:
                if version <= old.version:
                    superseded += 1
                    continue
            else:
                data = db_get(b"e:" + ekey)
                if data is not None:
                    stored = row_version(data)[0]
                    if stored == RAW_VERSION or need_old:  # a raw row is read on first use
                        old = unpack(data)
                        stored = old.version if old is not None else None
                    if stored is not None and version <= stored:
                        superseded += 1
                        continue
            new = Row(version, False, group, value)
            if plain is not None:
                plain[ekey] = new  # PartitionStore.put without a group index
            else:
                stores[p].put(ekey, new, old)
            # An upsert's group and version are in its value: headers only if asked for
            # (even ``headers=None`` costs 0.4 us in produce()).
            try:
                if with_headers:
                    produce(state_topic, value, ekey, p, headers=state_headers(type_header, mkey, version))
                else:
                    produce(state_topic, value, ekey, p)
            except BufferError:
                w._produce(state_topic, value, ekey, p,
                              state_headers(type_header, mkey, version) if with_headers else None)
            processed += 1
            if listeners is not None:
                event = Event(et.name, key, group, version, "upsert", record, p, offset,
                              msg.timestamp()[1], value, msg.headers() or [])
                listeners.on_change(w, event, ekey, old, new, record)
    finally:
        stats.consumed += consumed
        stats.processed += processed
        stats.state_writes += processed
        stats.superseded += superseded
