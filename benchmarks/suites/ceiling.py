"""Suite ``ceiling``: the plain confluent-kafka consume -> produce loop, vs raw consumption."""

from __future__ import annotations

import time

from benchmarks.consume import raw_consume
from benchmarks.events import events, produce_avro
from benchmarks.harness import COMMIT_INTERVAL, Bench, Metric
from benchmarks.systems import measure_ceiling

__all__ = ["run"]

PARTITIONS = 6


def run(bench: Bench) -> None:
    """Pre-produce N events, then time the passthrough loop and a bare consumer over them."""
    started = time.monotonic()
    n = bench.size(500_000, 200_000)  # quick: still several commits at ~200k events/s
    settings = bench.topic_set("ceiling", PARTITIONS)
    bench.step(f"ceiling: pre-producing {n:,} events", n)
    produce_avro(settings, events(n), on_progress=bench.advance)
    commits = measure_ceiling(bench, settings, n)
    bench.step("ceiling: bare consumer", n)
    raw = raw_consume(settings, settings.input_topic, PARTITIONS)
    metrics = [
        Metric("ceiling", "passthrough loop", commits.rate, "events/s", "bare consume",
               raw["records_per_s"], note="consume -> produce -> commit, no decoding or state"),
    ]
    bench.write_result(
        "ceiling", metrics, started=started,
        settings={"events": n, "partitions": PARTITIONS, "commit_interval_s": COMMIT_INTERVAL,
                  "consume_batch": 1000, "producer": "idempotent, acks=all, linger.ms=20 (the worker's batching)"},
        raw={"passthrough": commits.to_dict(), "bare_consume": raw},
        notes=["Timed from the first offset commit to the commit covering the last event; "
               "start-up and group join are excluded.",
               "The bare consumer reads partitions one after another (as a restore does)."],
    )
