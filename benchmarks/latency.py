"""End-to-end latency: producer timestamp -> output record visible to a read_committed consumer.

A paced producer sends new entities (version 1, so none is superseded) at ``rate`` per
second to a running system; a read_committed consumer on each of the system's output
topics (fifolane: the state topic and the listener notifications) notes when each becomes
visible. Both run in this process, so one clock times both ends.

Two floors of the first version of this probe are gone (benchmarks/README.md, "Latency"):

- the probe's idempotent producer needs a producer id before its first delivery, and
  librdkafka asks for one on a 500 ms timer after the producer is created: every event sent
  in the first half second waited for it, so p99 came out near 492 ms for any system. The
  producer is now warmed up first (``warm`` unmeasured events, flushed and seen on every
  output) and the clock starts after that;
- ``consume(500, timeout=0.05)`` returns only when 500 records arrived or the 50 ms ran out,
  which added 0-50 ms to what it saw. The reader now blocks in ``poll`` (returns on the first
  record) and drains what else is queued without waiting.

A third: the onset of the load. A system that was idle and then gets the paced load
sometimes takes a few hundred ms to settle in its first second (fifolane's first commits
flushed for 80-130 ms instead of ~10; Kafka Streams likewise). Within a 10 s probe that
is 2-5% of the events: it set the p99 of some runs and not of others. The steady-state
percentiles therefore start after ``lead_in`` seconds of the paced load; the events of
the lead-in are timed too and reported on their own (``onset``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

__all__ = ["cdf_points", "measure_latency", "measure_outputs", "percentiles"]

#: (id, key, value) of one probe event.
Record = tuple[str, bytes, bytes]
#: Names the probe event an output record belongs to (None: not a probe event).
Ident = Callable[[Any], "str | None"]
#: The probe producer's linger.ms: librdkafka's default. At 1 ms the probe alone sent
#: 1,600-2,200 produce requests/s at ~7,000 events/s (librdkafka sends one partition per
#: request), about 8x the worker's, to the 2-core broker it measures; every system's commits
#: queued behind them (benchmarks/README.md, "The probe's own requests").
PROBE_LINGER_MS = 5.0
#: Percentile grid kept for the CDF plots: every 0.5%, then every 0.1% above 99%.
CDF_GRID = tuple([p / 2 for p in range(0, 199)] + [99 + p / 10 for p in range(0, 11)])


def percentiles(values: Sequence[float], points: tuple[float, ...] = (50, 99)) -> dict[str, float]:
    """Nearest-rank percentiles, e.g. ``{"p50": ..., "p99": ...}``."""
    if not values:
        return {f"p{p:g}": float("nan") for p in points}
    ordered = sorted(values)
    return {f"p{p:g}": ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]
            for p in points}


def cdf_points(values: Sequence[float]) -> list[tuple[float, float]]:
    """(percentile, latency ms) on :data:`CDF_GRID`: enough to draw the CDF, small to store."""
    if not values:
        return []
    ordered = sorted(values)
    n = len(ordered)
    return [(p, round(ordered[min(n - 1, max(0, round(p / 100 * n) - 1))], 2)) for p in CDF_GRID]


def _assign_at_end(consumer: Consumer, topics: Sequence[str]) -> None:
    meta = consumer.list_topics(timeout=10)
    starts = []
    for topic in topics:
        for p in sorted(meta.topics[topic].partitions):
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            starts.append(TopicPartition(topic, p, high))
    consumer.assign(starts)


def timed(i: int, *, lead_in: int, sample_every: int) -> bool:
    """Whether the ``i``-th paced record (after the warm-up) is timed by
    :func:`measure_outputs`: every ``sample_every``-th of the lead-in (the onset) and of the
    rest. A probe can make only those records visible on an output that selects (a
    listener's notifications) and send fillers in between."""
    return (i if i < lead_in else i - lead_in) % sample_every == 0


def measure_outputs(bootstrap: str, input_topic: str, outputs: dict[str, tuple[str, Ident]],
                    records: Sequence[Record], *, rate: float, warm: int = 20, sample_every: int = 1,
                    lead_in: int = 0, timeout: float = 60.0) -> dict[str, dict[str, Any]]:
    """Send ``records`` at ``rate``/s; per output name, when each became visible there.

    ``outputs``: name -> (topic, ident). The first ``warm`` records are sent and awaited on
    every output before the clock starts (not measured). The next ``lead_in`` records start
    the paced load: they are the onset. Of the onset and of the rest, every
    ``sample_every``-th record is timed (:func:`timed`); the others need not show on every
    output. Returns per output: sent, seen, p50/p90/p99/max (ms) and ``cdf``
    (:func:`cdf_points`) of the timed rest, and ``onset`` (sent, seen, p50/p99/max).
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-latency",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.wait.max.ms": 5, "fetch.min.bytes": 1})
    by_topic = {topic: (name, ident) for name, (topic, ident) in outputs.items()}
    _assign_at_end(consumer, list(by_topic))
    seen: dict[str, dict[str, float]] = {name: {} for name in outputs}
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            first = consumer.poll(0.05)  # returns at the first record: no batching delay
            if first is None:
                continue
            now = time.time()
            for msg in [first, *consumer.consume(1000, timeout=0)]:
                if msg.error() is not None:
                    continue
                name, ident = by_topic[msg.topic() or ""]
                rid = ident(msg)
                if rid is not None and rid not in seen[name]:
                    seen[name][rid] = now

    reader = threading.Thread(target=read, name="latency-reader", daemon=True)
    reader.start()
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": PROBE_LINGER_MS, "queue.buffering.max.messages": 1_000_000})

    def send(rid_key_value: Record) -> None:
        _rid, key, value = rid_key_value
        while True:
            try:
                producer.produce(input_topic, value, key)
                return
            except BufferError:
                producer.poll(0.01)

    def wait_seen(ids: list[str], limit: float) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and not all(
                all(r in seen[name] for r in ids) for name in outputs):
            time.sleep(0.02)  # waiting on the reader thread under a deadline

    # Warm-up: the producer id, the connections and the system's first records after idle.
    warm_ids = [r[0] for r in records[:warm]]
    for rec in records[:warm]:
        send(rec)
    producer.flush(30)
    wait_seen(warm_ids, min(timeout, 30.0))
    paced = records[warm:]
    sent: dict[str, float] = {}
    onset: dict[str, float] = {}
    t0 = time.monotonic()
    i, n = 0, len(paced)
    while i < n:
        pause = t0 + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)  # pacing: send what is due, then sleep to the next one
        due = min(n, int((time.monotonic() - t0) * rate) + 1)
        while i < due:
            if timed(i, lead_in=lead_in, sample_every=sample_every):
                (onset if i < lead_in else sent)[paced[i][0]] = time.time()
            send(paced[i])
            i += 1
        producer.poll(0)
    producer.flush(30)
    wait_seen([*onset, *sent], timeout)
    done.set()
    reader.join(5)
    consumer.close()
    result = {}
    for name in outputs:
        lat = [(seen[name][r] - t) * 1000 for r, t in sent.items() if r in seen[name]]
        first = [(seen[name][r] - t) * 1000 for r, t in onset.items() if r in seen[name]]
        result[name] = {"sent": len(sent), "seen": len(lat), "rate": rate, "events": n - min(n, lead_in),
                        **percentiles(lat, (50, 90, 99)), "max": max(lat) if lat else float("nan"),
                        "cdf": cdf_points(lat),
                        "onset": {"sent": len(onset), "seen": len(first), **percentiles(first, (50, 99)),
                                  "max": max(first) if first else float("nan")}}
    return result


def measure_latency(bootstrap: str, input_topic: str, output_topic: str, partitions: int,
                    records: list[tuple[str, bytes, bytes]], ident: Ident,
                    *, rate: float, timeout: float = 60.0) -> dict[str, Any]:
    """One output topic: :func:`measure_outputs` without the CDF (``partitions`` is unused:
    the output's partitions are looked up)."""
    del partitions
    out = measure_outputs(bootstrap, input_topic, {"out": (output_topic, ident)}, records,
                          rate=rate, timeout=timeout)["out"]
    out.pop("cdf")
    out.pop("onset")
    return out
