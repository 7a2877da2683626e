"""End-to-end latency: producer timestamp -> output record visible to a read_committed consumer.

A paced producer sends ``count`` new entities (version 1, so none is superseded) at
``rate`` per second to a running system; a read_committed consumer on the system's output
topic (fifolane: the state topic) notes when each becomes visible. Both run in this
process, so one clock times both ends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

__all__ = ["measure_latency", "percentiles"]


def percentiles(values: list[float], points: tuple[float, ...] = (50, 99)) -> dict[str, float]:
    """Nearest-rank percentiles, e.g. ``{"p50": ..., "p99": ...}``."""
    if not values:
        return {f"p{p:g}": float("nan") for p in points}
    ordered = sorted(values)
    return {f"p{p:g}": ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]
            for p in points}


def measure_latency(bootstrap: str, input_topic: str, output_topic: str, partitions: int,
                    records: list[tuple[str, bytes, bytes]], ident: Callable[[Any], str | None],
                    *, rate: float, timeout: float = 60.0) -> dict[str, Any]:
    """Send ``records`` (id, key, value) at ``rate``/s; ``ident(msg)`` names an output's id.

    Returns the latencies' p50/p99/max in milliseconds and how many were seen.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-latency",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 5, "fetch.min.bytes": 1})
    starts = []
    for p in range(partitions):
        _low, high = consumer.get_watermark_offsets(TopicPartition(output_topic, p), timeout=10)
        starts.append(TopicPartition(output_topic, p, high))
    consumer.assign(starts)
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            for msg in consumer.consume(500, timeout=0.05):
                if msg.error() is not None:
                    continue
                rid = ident(msg)
                if rid is not None and rid not in seen:
                    seen[rid] = time.time()

    reader = threading.Thread(target=read, name="latency-reader", daemon=True)
    reader.start()
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 0})
    t0 = time.monotonic()
    for i, (rid, key, value) in enumerate(records):
        pause = t0 + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing
        sent[rid] = time.time()
        producer.produce(input_topic, value, key)
        producer.poll(0)
    producer.flush(30)
    deadline = time.monotonic() + timeout
    while len(seen) < len(records) and time.monotonic() < deadline:
        time.sleep(0.05)  # wait for the last records under a deadline
    done.set()
    reader.join(5)
    consumer.close()
    lat = [(seen[r] - sent[r]) * 1000 for r in list(seen) if r in sent]
    return {"sent": len(records), "seen": len(lat), "rate": rate, **percentiles(lat),
            "max": max(lat) if lat else float("nan")}
