"""Read a topic from the beginning to its current end."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from fifolane.config import Settings
from fifolane.errors import FifolaneError

__all__ = ["read_to_end"]


def read_to_end(source: Settings | Mapping[str, Any], topic: str, *, isolation: str = "read_committed",
                timeout: float = 60.0, wait_open_transactions: bool = False) -> list[Any]:
    """Every record of ``topic`` up to its end offsets as of the call, per partition in order.

    Assigns all partitions (no consumer group, no commits). With ``read_committed`` the end
    is the last stable offset; ``wait_open_transactions`` waits (within ``timeout``) until
    transactions open at the call are decided, so their records are included if committed.
    A topic created a moment ago (unknown to the broker asked, on several brokers) is waited for.
    """
    conf = source.kafka_config() if isinstance(source, Settings) else dict(source)
    conf.update({
        "group.id": f"fifolane-reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "enable.partition.eof": True, "isolation.level": isolation,
    })
    consumer = Consumer(conf)
    deadline = time.monotonic() + timeout
    topic_deadline = time.monotonic() + min(timeout, 15.0)
    try:
        while True:
            meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
            if meta is not None and meta.error is None and meta.partitions:
                break
            if time.monotonic() > topic_deadline:
                raise FifolaneError(f"topic {topic!r} does not exist: {meta.error if meta else 'missing'}")
            time.sleep(0.1)  # metadata propagation after a create; bounded by the deadline
        ends: dict[int, int] = {}
        for p in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if high > low:
                ends[p] = high
        if not ends:
            return []
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        out: list[Any] = []
        pending = set(ends)
        while pending:
            if time.monotonic() > deadline:
                raise FifolaneError(f"reading {topic!r}: partitions {sorted(pending)} not at their end after {timeout}s")
            batch: list[Any] = consumer.consume(10_000, timeout=0.2)
            for msg in batch:
                err = msg.error()
                p = msg.partition() or 0
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise FifolaneError(f"reading {topic!r}: {err}")
                    # At the last stable offset. It may sit before the measured end (open
                    # transactions) or past it (control records).
                    if not wait_open_transactions or (msg.offset() or 0) >= ends[p]:
                        pending.discard(p)
                    continue
                out.append(msg)
                if (msg.offset() or 0) + 1 >= ends[p]:
                    pending.discard(p)
        return out
    finally:
        consumer.close()
