"""Read a topic from the beginning to its current end (committed records only)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from fifolane.config import Settings
from fifolane.errors import FifolaneError

__all__ = ["read_to_end"]


def read_to_end(settings: Settings, topic: str, timeout: float = 60.0) -> list[Any]:
    """Every committed record of ``topic`` up to the end offsets as of the call, per partition in order."""
    consumer = Consumer(settings.kafka_config(**{
        "group.id": f"fifolane-reader-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "enable.partition.eof": True, "isolation.level": "read_committed",
    }))
    try:
        meta = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            raise FifolaneError(f"topic {topic!r} does not exist")
        ends = {}
        for p in meta.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if high > low:
                ends[p] = high
        if not ends:
            return []
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        out: list[Any] = []
        pending = set(ends)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            batch: list[Any] = consumer.consume(10_000, timeout=0.5)
            for msg in batch:
                err = msg.error()
                p = msg.partition()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(p)  # at the last stable offset: nothing more committed
                        continue
                    raise FifolaneError(f"reading {topic}: {err}")
                out.append(msg)
                if msg.offset() + 1 >= ends[p]:
                    pending.discard(p)
        if pending:
            raise FifolaneError(f"reading {topic}: partitions {sorted(pending)} not at their end after {timeout}s")
        return out
    finally:
        consumer.close()
