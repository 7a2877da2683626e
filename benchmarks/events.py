"""Benchmark events: reservations keyed by flight number, pre-produced once per suite.

Event ``i`` of ``n`` is entity ``R<i mod entities>`` at version ``i // entities + 1``, so
versions of an entity increase in topic order and every event changes the table. Each
entity belongs to one of ``groups`` flights for its whole life (the FIFO group).
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from confluent_kafka import Producer

from fifolane.config import Settings
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.topics import create_topic

__all__ = [
    "Event", "events", "produce_avro", "produce_json", "produce_raw", "produce_state", "sleep_for",
]

#: (group, entity key, version, record)
Event = tuple[str, str, int, dict[str, Any]]
_STATES = ("NEW", "CONFIRMED", "REJECTED")


def events(n: int, groups: int = 1000, entities: int | None = None, prefix: str = "R") -> Iterator[Event]:
    """``n`` reservation events over ``groups`` flights and ``entities`` reservations."""
    entities = entities or max(1, n // 2)
    for i in range(n):
        e = i % entities
        rid = f"{prefix}{e}"
        flight = f"F{zlib.crc32(rid.encode()) % groups}"
        version = i // entities + 1
        yield flight, rid, version, {
            "reservation_id": rid, "flight_number": flight, "customer_id": f"c{e % 977}",
            "seats": 1 + e % 4, "amount": float(50 + e % 900), "state": _STATES[i % 3],
            "version": version,
        }


def sleep_for(value: bytes, max_ms: float = 5.0) -> float:
    """A deterministic handler delay in [0, max_ms] ms derived from the event bytes, so the
    serial baseline and fifolane sleep exactly the same total."""
    return (zlib.crc32(value) % 10_001) / 10_000 * max_ms / 1000


def _producer(settings: Settings) -> Producer:
    return Producer(settings.kafka_config(**{
        "enable.idempotence": True, "acks": "all", "linger.ms": 20,
        "batch.num.messages": 10_000, "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1 << 20, "compression.type": "none",
    }))


def ready_producer(settings: Settings, topic: str) -> Producer:
    """A benchmark producer with its start-up done: connected, the topic's metadata known
    and the idempotent producer id acquired (one record to ``<topic>.warmup``), so that a
    timed burst measures the system under test, not the producer's first round trips
    (about 0.5 s here)."""
    create_topic(settings, f"{topic}.warmup", 1)
    producer = _producer(settings)
    producer.list_topics(topic, timeout=30)
    producer.produce(f"{topic}.warmup", b"")
    if producer.flush(30):
        raise RuntimeError(f"the benchmark producer could not reach {topic}.warmup")
    return producer


def produce_raw(settings: Settings, topic: str, items: Iterator[tuple[bytes, bytes | None, Any]],
                on_progress: Callable[[int], None] | None = None, producer: Producer | None = None) -> int:
    """Produce ``(key, value, (partition, headers) or None)`` items; returns how many
    (``producer``: one from :func:`ready_producer`, else a new one)."""
    producer = _producer(settings) if producer is None else producer
    n = 0
    last = time.monotonic()
    for key, value, extra in items:
        partition, headers = extra if extra is not None else (-1, None)
        while True:
            try:
                if headers is not None:
                    producer.produce(topic, value, key, partition, headers=headers)
                else:
                    producer.produce(topic, value, key, partition)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        if n % 5000 == 0:
            producer.poll(0)
            if on_progress is not None and time.monotonic() - last > 0.2:
                on_progress(n)
                last = time.monotonic()
    left = producer.flush(120)
    if left:
        raise RuntimeError(f"{left} benchmark records were not delivered to {topic}")
    if on_progress is not None:
        on_progress(n)
    return n


def produce_avro(settings: Settings, evs: Iterator[Event], topic: str | None = None,
                 on_progress: Callable[[int], None] | None = None) -> int:
    """Avro single-object values keyed by flight number (the fifolane input format)."""
    codec = make_codec(settings, SchemaCatalog.load(settings.schemas_dir))
    items = ((g.encode(), codec.encode("reservation", rec), None) for g, _k, _v, rec in evs)
    return produce_raw(settings, topic or settings.input_topic, items, on_progress)


def produce_json(settings: Settings, evs: Iterator[Event], topic: str,
                 on_progress: Callable[[int], None] | None = None) -> int:
    """The same events as JSON (the Quix Streams input)."""
    items = ((g.encode(), json.dumps(rec, separators=(",", ":")).encode(), None) for g, _k, _v, rec in evs)
    return produce_raw(settings, topic, items, on_progress)


def produce_state(settings: Settings, evs: Iterator[Event], partitions: int,
                  on_progress: Callable[[int], None] | None = None) -> int:
    """Entities written straight to the state topic as a worker would (restore input):
    upserts without headers (docs/formats.md), so a restore reads version and group from
    the values.

    Partition = the group's hash as the default partitioner would place the input record;
    any fixed mapping will do for a restore, which reads every partition it is assigned.
    """
    codec = make_codec(settings, SchemaCatalog.load(settings.schemas_dir))

    def items() -> Iterator[tuple[bytes, bytes | None, Any]]:
        for g, k, _v, rec in evs:
            yield f"reservation/{k}".encode(), codec.encode("reservation", rec), \
                (zlib.crc32(g.encode()) % partitions, None)

    return produce_raw(settings, settings.state_topic, items(), on_progress)
