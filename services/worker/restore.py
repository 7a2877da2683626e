"""Restore a partition's RocksDB from the compacted state topic before processing it."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from services.worker.metrics import Stats
from services.worker.state import PartitionStore, Row, StoreManager

__all__ = ["restore_partition"]

log = logging.getLogger(__name__)


def _row_from(msg: Any) -> Row | None:
    version = group = None
    for name, value in msg.headers() or ():
        if name == "fifolane.version":
            version = value
        elif name == "fifolane.group":
            group = value
    if version is None or group is None:
        return None  # not written by a fifolane worker; nothing to remember
    data = msg.value()
    return Row(int(version), data is None, group.decode(), data)


def restore_partition(kafka_conf: dict[str, Any], topic: str, partition: int, stores: StoreManager,
                      stats: Stats, batch: int = 20_000,
                      wait_open_txn_s: float = 30.0) -> PartitionStore:
    """Bring the local store of ``partition`` up to the committed end of its changelog.

    Replays from the offset stored with the local state (0 for a new store). A store whose
    offset lies before the log start (data deleted by retention) is wiped and rebuilt.
    Only committed records are read, so no half-written transaction reaches the table.
    """
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
        # ``high`` counts records of transactions still open (say, of a worker that was
        # killed): keep reading until the position passes it, so a transaction that the
        # coordinator still commits is not missed. Bounded by the transaction timeout.
        deadline = time.monotonic() + wait_open_txn_s
        at_end = False
        while not at_end:
            rows: list[tuple[bytes, Row]] = []
            msgs: list[Any] = consumer.consume(batch, timeout=0.5)
            eof = False
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof = True
                        continue
                    raise RuntimeError(f"restore of {topic}[{partition}] failed: {err}")
                next_offset = msg.offset() + 1
                row = _row_from(msg)
                if row is not None:
                    rows.append((msg.key(), row))
            if eof or len(msgs) < batch:
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
