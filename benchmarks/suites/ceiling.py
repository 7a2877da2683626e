"""Suite ``ceiling``: the plain confluent-kafka consume -> produce loop, vs raw consumption."""

from __future__ import annotations

import sys
import time
import uuid

from benchmarks.consume import raw_consume
from benchmarks.events import events, produce_avro
from benchmarks.harness import COMMIT_INTERVAL, Bench, Metric
from benchmarks.procs import Commits, running, watch_committed
from fifolane.config import Settings
from fifolane.topics import create_topic

__all__ = ["measure_ceiling", "run"]

PARTITIONS = 6


def measure_ceiling(bench: Bench, settings: Settings, total: int) -> Commits:
    """Run the passthrough loop over ``settings.input_topic`` (``total`` events) into a new topic."""
    out = f"{settings.input_topic}.passthrough.{uuid.uuid4().hex[:6]}"
    create_topic(settings, out, settings.partitions)
    group = f"bench-ceiling-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "benchmarks.passthrough", "ceiling", "--bootstrap", bench.bootstrap,
           "--input", settings.input_topic, "--output", out, "--group", group,
           "--commit-interval", str(COMMIT_INTERVAL)]
    bench.step("ceiling: passthrough loop", total)
    with running(cmd, bench.work / f"{group}.log") as proc:
        return watch_committed(bench.bootstrap, group, settings.input_topic, settings.partitions, total,
                               timeout=120 + total / 5000, alive=lambda: proc.poll() is None,
                               on_progress=bench.advance)


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
