"""Benchmark: ``views build`` (Spark) vs a plain confluent-kafka Python loop.

Both compute the per-flight seats from the same compacted, transactional state topic: Spark
runs the whole views job (read, latest per key, Avro decode, four views, Parquet); the Python
loop reads every committed record, keeps the latest per key, decodes with fastavro and sums
CONFIRMED seats per flight. The results are checked equal.

    python benchmarks/spark_views.py --entities 1000000 [--bootstrap HOST:PORT] [--master URL]

Without ``--bootstrap`` (or FIFOLANE_TEST_BOOTSTRAP) a one-node local Kafka is started under
``.fifolane/bench-kafka-spark-views`` (its own home: other benchmarks use theirs) and stopped at the end. ``FIFOLANE_BENCH_QUICK=1`` runs 20,000.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import uuid
import zlib
from collections import defaultdict
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fifolane.config import PROJECT_ROOT, Settings  # noqa: E402
from fifolane.serde import SchemaCatalog, SingleObjectCodec  # noqa: E402
from fifolane.serde.state_records import state_headers  # noqa: E402
from fifolane.topics import ensure_topics  # noqa: E402

STATES = ("NEW", "CONFIRMED", "REJECTED", "CANCELLED")


def populate(settings: Settings, catalog: SchemaCatalog, entities: int, seed: int = 7) -> dict[str, int]:
    """Write ``entities`` live entities (1 flight per 1,000 reservations), 10% with a second
    version, 1% deleted, in transactions of 20,000 records."""
    rng = random.Random(seed)
    codec = SingleObjectCodec(catalog)
    n_flights = max(10, entities // 1000)
    n_res = entities - n_flights
    producer = Producer(settings.kafka_config(**{
        "transactional.id": f"bench-{uuid.uuid4().hex}", "linger.ms": 50,
        "batch.size": 1_000_000, "compression.type": "lz4",
    }))
    producer.init_transactions(60)
    partitions = settings.partitions
    sent = 0

    def send(type_name: str, key: str, group: str, version: int, value: bytes | None) -> None:
        nonlocal sent
        if sent % 20_000 == 0:
            if sent:
                producer.commit_transaction(120)
            producer.begin_transaction()
        # as a worker writes them: headers on tombstones only (docs/formats.md)
        headers = None if value is not None else state_headers(type_name.encode(), group.encode(), version)
        while True:
            try:
                producer.produce(settings.state_topic, key=f"{type_name}/{key}", value=value,
                                 partition=zlib.crc32(group.encode()) % partitions, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        sent += 1

    day0 = date(2026, 12, 1)
    airports = ["AMS", "LIS", "OPO", "CDG", "FRA", "MAD", "BCN", "LHR"]
    for i in range(n_flights):
        number = f"FL{i:05d}"
        origin, destination = rng.sample(airports, 2)
        record = {"flight_number": number, "origin": origin, "destination": destination,
                  "departure": day0 + timedelta(days=i % 60), "capacity": 10_000, "version": 1}
        send("flight", number, number, 1, codec.encode("flight", record))
    for i in range(n_res):
        number = f"FL{rng.randrange(n_flights):05d}"
        rid = f"R{i:08d}"
        record = {"reservation_id": rid, "flight_number": number, "customer_id": f"C{i % 5000}",
                  "seats": rng.randint(1, 4), "amount": round(rng.uniform(50, 500), 2),
                  "state": rng.choice(STATES), "version": 1}
        send("reservation", rid, number, 1, codec.encode("reservation", record))
        if rng.random() < 0.10:
            record = {**record, "state": rng.choice(STATES), "version": 2}
            send("reservation", rid, number, 2, codec.encode("reservation", record))
        if rng.random() < 0.01:
            send("reservation", rid, number, 3, None)
    producer.commit_transaction(120)
    producer.flush(60)
    return {"flights": n_flights, "reservations": n_res, "records": sent}


def python_loop(settings: Settings, catalog: SchemaCatalog) -> dict[str, tuple[int, int]]:
    """Per flight: (seats sold, seats remaining), from a plain consumer loop."""
    codec = SingleObjectCodec(catalog)
    consumer = Consumer(settings.kafka_config(**{
        "group.id": f"bench-{uuid.uuid4().hex}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True,
        "fetch.max.bytes": 52_428_800, "queued.max.messages.kbytes": 262_144,
    }))
    topic = settings.state_topic
    parts = list(consumer.list_topics(topic, timeout=30).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    latest: dict[bytes, bytes | None] = {}
    pending = set(parts)
    while pending:
        for msg in consumer.consume(10_000, timeout=1.0):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise RuntimeError(err)
            latest[msg.key() or b""] = msg.value()
    consumer.close()
    sold: dict[str, int] = defaultdict(int)
    capacity: dict[str, int] = {}
    for key, value in latest.items():
        if value is None:
            continue
        decoded = codec.decode(value)
        record = decoded.record
        if key.startswith(b"flight/"):
            capacity[record["flight_number"]] = record["capacity"]
        elif record["state"] == "CONFIRMED":
            sold[record["flight_number"]] += record["seats"]
    return {f: (sold.get(f, 0), cap - sold.get(f, 0)) for f, cap in capacity.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    quick = os.environ.get("FIFOLANE_BENCH_QUICK") == "1"
    parser.add_argument("--entities", type=int, default=20_000 if quick else 1_000_000)
    parser.add_argument("--bootstrap", default=os.environ.get("FIFOLANE_TEST_BOOTSTRAP"))
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each side (best is reported)")
    parser.add_argument("--result", type=Path, default=ROOT / "benchmarks" / "results" / "spark_views.json")
    args = parser.parse_args()

    cluster = None
    bootstrap = args.bootstrap
    if not bootstrap:
        from fifolane.cluster import LocalCluster

        cluster = LocalCluster(PROJECT_ROOT / ".fifolane" / "bench-kafka-spark-views", libs=PROJECT_ROOT / ".fifolane" / "kafka" / "libs")
        bootstrap = cluster.up(timeout=180, fresh=True).bootstrap_servers
    try:
        suffix = uuid.uuid4().hex[:8]
        settings = Settings(bootstrap_servers=bootstrap, partitions=args.partitions,
                            input_topic=f"bench.events.{suffix}", state_topic=f"bench.state.{suffix}",
                            registry_topic=f"bench.listeners.{suffix}", dlq_topic=f"bench.dlq.{suffix}",
                            listener_output_topic=f"bench.notifications.{suffix}",
                            directory_topic=f"bench.directory.{suffix}", parked_topic=f"bench.parked.{suffix}")
        ensure_topics(settings)
        catalog = SchemaCatalog.load()
        result: dict[str, Any] = {"entities": args.entities, "partitions": args.partitions,
                                  "cpus": os.cpu_count(), "master": args.master}
        t = time.perf_counter()
        result["written"] = populate(settings, catalog, args.entities)
        result["produce_s"] = round(time.perf_counter() - t, 2)
        print(json.dumps(result), flush=True)

        loops = []
        for _ in range(args.runs):
            t = time.perf_counter()
            expected = python_loop(settings, catalog)
            loops.append(round(time.perf_counter() - t, 2))
        result["python_loop_s"] = loops
        result["python_loop_best_s"] = min(loops)
        print(f"python loop: {loops} s", flush=True)

        from spark.job import build_views
        from spark.output import read_view
        from spark.session import get_session

        t = time.perf_counter()
        spark = get_session(args.master, "fifolane-bench")
        result["spark_session_s"] = round(time.perf_counter() - t, 2)
        with tempfile.TemporaryDirectory() as tmp:
            runs: list[dict[str, Any]] = []
            for i in range(args.runs):
                t = time.perf_counter()
                report = build_views(spark, settings, catalog, Path(tmp) / "views")
                runs.append({"s": round(time.perf_counter() - t, 2), "steps_s": report.seconds,
                             "loadavg_1m": round(os.getloadavg()[0], 1)})
                print(f"spark build {i + 1}: {runs[-1]}", flush=True)
            result["spark_builds"] = runs
            # cold = first build in a fresh JVM (what one CLI run pays after the session start);
            # warm = best later build (JIT-compiled, Kafka log in the page cache).
            result["spark_build_cold_s"] = runs[0]["s"]
            result["spark_build_warm_s"] = min(r["s"] for r in runs[1:]) if len(runs) > 1 else runs[0]["s"]
            got = {r["flight_number"]: (r["seats_sold"], r["seats_remaining"])
                   for r in read_view(spark, "seats_per_flight", Path(tmp) / "views").collect()}
        result["results_equal"] = got == expected
        print(json.dumps(result, indent=2))
        args.result.parent.mkdir(parents=True, exist_ok=True)
        args.result.write_text(json.dumps(result, indent=2) + "\n")
        if not result["results_equal"]:
            raise SystemExit("Spark and the Python loop disagree")
    finally:
        if cluster is not None:
            cluster.down()


if __name__ == "__main__":
    main()
