"""CPU per event of a worker's general path, without a broker (a diagnostic, not a target).

    .venv/bin/python -m benchmarks.app_cpu [--events 100000] [--runs 3] [--app examples.flights:app]

The app suite's fifolane rate is bound by the worker's poll thread (benchmarks/README.md,
"The flights app"). This runs the same worker and app in-process on the fake Kafka clients
of the unit tests (tests/unit/fake_kafka.py: batches handed out, produced records counted)
over the app suite's booking stream (:mod:`benchmarks.booking`), so a change to the
general path can be measured in seconds, without the broker's noise: the poll thread's CPU
per event (``time.thread_time``), the best and the median of ``--runs`` fresh workers. For
where the time goes, run it under ``py-spy record``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any, Literal, cast

from confluent_kafka import TopicPartition

from benchmarks.booking import APP, avro_items, stream
from fifolane.config import Settings
from fifolane.serde import SchemaCatalog
from services.worker.app import load_app
from services.worker.options import WorkerOptions
from services.worker.runtime import Worker, settle_gc

__all__ = ["main", "measure"]

PARTITIONS = 6
BATCH = 1000  # what the worker asks consume() for


def _fakes() -> Any:
    """tests/unit/fake_kafka.py (the unit tests' fake clients), imported from the checkout."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))
    import fake_kafka

    return fake_kafka


Guarantee = Literal["exactly-once", "at-least-once"]


def measure(events: int, app: str = APP, guarantee: Guarantee = "exactly-once") -> dict[str, Any]:
    """One fresh worker over ``events`` booking events: its counts and CPU per event."""
    fk = _fakes()
    home = Path(tempfile.mkdtemp(prefix="fifolane-app-cpu-"))
    settings = Settings(home=home / "home", input_topic="in", state_topic="state", dlq_topic="dlq",
                        directory_topic="dir")
    offsets = [0] * PARTITIONS
    msgs = []
    for key, value, _ in avro_items(settings, stream(events)):
        p = zlib.crc32(key) % PARTITIONS
        msgs.append(fk.FakeMsg(p, offsets[p], key, value))
        offsets[p] += 1
    clients = fk.FakeClients({("in", p): 0 for p in range(PARTITIONS)})
    producer = clients.fake_producer
    produced = [0]

    def produce(topic: str, value: Any = None, key: Any = None, partition: int = -1, headers: Any = None,
                *, full: bool = False) -> None:
        produced[0] += 1  # counted, not kept (a list of every record would be measured too)

    producer.produce = produce
    producer.send = produce
    worker = Worker(settings, load_app(app), WorkerOptions(worker_id="w1", state_dir=home / "state",
                                                           guarantee=guarantee),
                    catalog=SchemaCatalog.load(), clients=clients)
    worker.connect()
    clients.fake_consumer.callbacks["on_assign"](None, [TopicPartition("in", p) for p in range(PARTITIONS)])
    deadline = time.monotonic() + 60
    while worker.assigned_partitions != list(range(PARTITIONS)) and time.monotonic() < deadline:
        worker.poll_once()
    clients.fake_consumer.batches = [msgs[i:i + BATCH] for i in range(0, len(msgs), BATCH)]
    settle_gc()  # as Worker.run() does
    cpu, wall = time.thread_time(), time.perf_counter()
    while clients.fake_consumer.batches:
        worker.poll_once()
    worker.checkpoint(drain=True)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    stats = worker.stats
    worker.close()
    gc.unfreeze()
    return {"events": len(msgs), "cpu_us_per_event": cpu / len(msgs) * 1e6,
            "wall_us_per_event": wall / len(msgs) * 1e6, "produced": produced[0],
            **{k: getattr(stats, k) for k in ("consumed", "processed", "superseded", "dead_lettered",
                                               "state_writes", "state_coalesced")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.app_cpu", description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000, help="booking events after the flights")
    ap.add_argument("--runs", type=int, default=3, help="fresh workers, one after another")
    ap.add_argument("--app", default=APP)
    ap.add_argument("--guarantee", choices=["exactly-once", "at-least-once"], default="exactly-once")
    a = ap.parse_args(argv)
    cpu = []
    for i in range(a.runs):
        r = measure(a.events, a.app, cast(Guarantee, a.guarantee))
        cpu.append(r["cpu_us_per_event"])
        print(f"run {i + 1}: {r['events']:,} events, {r['cpu_us_per_event']:.1f} us CPU per event "
              f"({r['wall_us_per_event']:.1f} us wall); processed {r['processed']:,}, superseded "
              f"{r['superseded']:,}, dead-lettered {r['dead_lettered']:,}, records produced {r['produced']:,} "
              f"(state writes {r['state_writes']:,}, {r['state_coalesced']:,} of them coalesced)",
              flush=True)
    print(f"best {min(cpu):.1f} us, median {statistics.median(cpu):.1f} us CPU per event")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
