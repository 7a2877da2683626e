"""Restore a partition's RocksDB from the compacted state topic before processing it."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from fifolane.serde.state_records import StateRecordReader
from services.worker.metrics import Stats
from services.worker.state import PartitionStore, RestoredRow, StoreManager

__all__ = ["restore_partition"]

log = logging.getLogger(__name__)


def restore_partition(kafka_conf: dict[str, Any], topic: str, partition: int, stores: StoreManager,
                      stats: Stats, codec: Any, batch: int = 20_000,
                      wait_open_txn_s: float = 30.0) -> PartitionStore:
    """Bring the local store of ``partition`` up to the committed end of its changelog.

    Replays from the offset stored with the local state (0 for a new store). A store whose
    offset lies before the log start (data deleted by retention) is wiped and rebuilt.
    Only committed records are read, so no half-written transaction reaches the table.
    Versions and groups come from the tombstones' headers and the upserts' values
    (``codec``), see :mod:`fifolane.serde.state_records`.
    """
    read = StateRecordReader(codec).read
    store = stores.open(partition)
    conf = {
        **kafka_conf,
        "group.id": f"fifolane-restore-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "fetch.max.bytes": 64 << 20,
        "max.partition.fetch.bytes": 16 << 20,
        # At the end of a transactional changelog (its last offsets are commit markers, never
        # delivered) the end-of-partition event comes with an empty fetch: do not let the
        # broker hold that one for the default 500 ms.
        "fetch.wait.max.ms": 20,
    }
    consumer = Consumer(conf)
    try:
        tp = TopicPartition(topic, partition)
        low, high = consumer.get_watermark_offsets(tp, timeout=30)
        start = store.changelog_offset
        if start < low:
            log.info("partition %d: local state predates the changelog start, rebuilding", partition)
            store = stores.wipe(partition)
            start = low
        if start >= high:
            return store
        todo = high - start
        stats.restoring += 1
        stats.restore_total += todo
        t0 = last_log = time.monotonic()
        done = 0
        consumer.assign([TopicPartition(topic, partition, start)])
        next_offset = start
        fresh = start == low and store.is_empty()
        # Without a group index the group of an upsert is not needed now: keep values raw.
        raw = not store.group_index and store.read_value is not None
        # ``high`` counts records of transactions still open (say, of a worker that was
        # killed): keep reading until the position passes it, so a transaction that the
        # coordinator still commits is not missed. Bounded by the transaction timeout.
        deadline = time.monotonic() + wait_open_txn_s
        at_end = False
        while not at_end:
            rows: list[RestoredRow] = []
            append = rows.append
            # consume() returns when it has that many records or at the timeout: do not ask
            # for more than are left (a transactional changelog has fewer, since commit
            # markers take offsets too; then the timeout ends the last batch).
            msgs: list[Any] = consumer.consume(max(1, min(batch, high - next_offset)), timeout=0.1)
            eof = False
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof = True
                        continue
                    raise RuntimeError(f"restore of {topic}[{partition}] failed: {err}")
                next_offset = msg.offset() + 1
                value = msg.value()
                if raw and value is not None:
                    append((msg.key(), None, False, "", value))  # read on first use
                    continue
                state = read(value, msg.headers())
                if state is not None:  # else not written by a fifolane worker: nothing to keep
                    append((msg.key(), state.version, state.deleted, state.group, None if state.deleted else value))
            if next_offset >= high:
                at_end = True  # the last record is in: no need to wait for the end-of-partition event
            elif eof or len(msgs) < batch:
                pos = consumer.position([tp])[0].offset
                if pos >= 0:
                    next_offset = max(next_offset, pos)
                at_end = next_offset >= high or time.monotonic() > deadline
            if rows or at_end:
                store.restore_batch(rows, next_offset, fresh=fresh)
                done += len(rows)
                stats.restored_records += len(rows)
            now = time.monotonic()
            if now - last_log > 2:
                log.info("restoring %s[%d]: %d/%d records", topic, partition, next_offset - start, todo)
                last_log = now
        took = time.monotonic() - t0
        log.info("restored %s[%d]: %d records in %.2fs", topic, partition, done, took)
        stats.restoring -= 1
        return store
    finally:
        consumer.close()
