"""The raw read rate of a topic: how fast a bare confluent-kafka consumer drains it."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, KafkaError, TopicPartition

from fifolane.config import Settings

__all__ = ["raw_consume"]


def raw_consume(settings: Settings, topic: str, partitions: int, batch: int = 1000) -> dict[str, float]:
    """Read every partition of ``topic`` to its end, one after another, as the worker's
    restore does (same isolation and fetch sizes), touching key, value and headers.

    Returns records, seconds (sum over partitions, from assign to end) and records/s.
    """
    conf = settings.kafka_config(**{
        "group.id": f"bench-raw-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True,
        "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20,
    })
    total, seconds = 0, 0.0
    for p in range(partitions):
        consumer = Consumer(conf)
        try:
            tp = TopicPartition(topic, p)
            low, high = consumer.get_watermark_offsets(tp, timeout=30)
            if high <= low:
                continue
            t0 = time.perf_counter()
            consumer.assign([TopicPartition(topic, p, low)])
            at_end = False
            while not at_end:
                for msg in consumer.consume(batch, timeout=0.1):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            at_end = True
                        continue
                    msg.key(), msg.value(), msg.headers()
                    total += 1
                    if (msg.offset() or 0) + 1 >= high:
                        at_end = True
            seconds += time.perf_counter() - t0
        finally:
            consumer.close()
    return {"records": total, "seconds": seconds, "records_per_s": total / seconds if seconds else 0.0}
