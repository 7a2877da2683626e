"""Suite ``app``: a user's handler, the flights app (examples/flights.py), vs Quix Streams.

The demo's booking stream (:func:`fifolane.demo.stream.generate`: 300 flights, then
reservations with superseded and out-of-order versions, cancellations and 3% deletes) is
pre-produced once as Avro (fifolane) and once as JSON (Quix). Then, in interleaved rounds:

- the plain consume -> produce loop over the Avro input (the ceiling, no decoding or state);
- the fifolane worker running ``--app examples.flights:app`` (inline handler: 3 state reads
  and up to 2 writes per reservation), exactly-once, no listeners;
- the same app in Quix Streams (``benchmarks/quix_flights.py``), exactly-once.

Both apps' final flight loads are checked against :func:`examples.flights.reference`, so
the two really do the same job. Then one more fifolane run under py-spy (not timed against
the others) says where the worker's time goes: ``raw/app-profile.txt`` and the top frames
in the result.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from benchmarks.booking import APP, FLIGHTS, avro_items, json_items, stream
from benchmarks.events import produce_raw
from benchmarks.harness import Bench, Metric
from benchmarks.profiling import spy_worker
from benchmarks.quix import quix_python
from benchmarks.systems import (
    CEILING_REPEAT,
    measure_ceiling,
    median_run,
    repeated_input,
    run_quix,
    run_worker,
)
from fifolane.config import Settings
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.topics import create_topic

__all__ = ["run"]

PARTITIONS = 6


def _final_loads(bootstrap: str, topic: str, decode: Any) -> dict[str, tuple[int, int]]:
    """flight -> (seats_sold, rejected_seats) from the last ``flight_load/<flight>`` record."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-check-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "enable.partition.eof": True})
    meta = consumer.list_topics(topic, timeout=10)
    parts = sorted(meta.topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    loads: dict[str, tuple[int, int]] = {}
    ended: set[int] = set()
    deadline = time.monotonic() + 120
    while len(ended) < len(parts) and time.monotonic() < deadline:
        for msg in consumer.consume(1000, timeout=0.5):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    ended.add(msg.partition() or 0)
                continue
            key = (msg.key() or b"").decode()
            if key.startswith("flight_load/") and msg.value() is not None:
                rec = decode(msg.value())
                loads[key.split("/", 1)[1]] = (rec["seats_sold"], rec["rejected_seats"])
    consumer.close()
    return loads


def _profile(bench: Bench, base: Settings, n: int) -> dict[str, Any]:
    """One fifolane run of the app with py-spy attached (:func:`benchmarks.profiling.spy_worker`)."""
    return spy_worker(bench, base, n, "exactly-once", app=APP, out=bench.results_dir / "raw" / "app-profile.txt")


def run(bench: Bench) -> None:
    """Pre-produce; rounds of plain loop, fifolane flights EOS, Quix flights EOS; check; profile."""
    from examples.flights import reference

    started = time.monotonic()
    n = bench.size(200_000, 30_000)
    reps = bench.size(3, 1)
    evs = stream(n)
    total = len(evs)
    base = bench.topic_set("app", PARTITIONS)
    json_topic = f"{base.input_topic}.json"
    create_topic(base, json_topic, PARTITIONS)
    bench.step(f"app: pre-producing {total:,} booking events (Avro and JSON)", 2 * total)
    produce_raw(base, base.input_topic, avro_items(base, evs), on_progress=bench.advance)
    produce_raw(base, json_topic, json_items(evs), on_progress=lambda c: bench.advance(total + c))
    env = quix_python()
    notes = [f"The demo's booking stream: {FLIGHTS} flights, then {n:,} reservation events "
             "(superseded and late versions, cancellations, 3% deletes), keyed by flight; "
             "6 partitions, exactly-once, 0.25 s commit interval, no listeners.",
             f"After one untimed warm-up pass of the plain loop, {reps} interleaved round(s) of plain "
             "loop, fifolane (--app examples.flights:app), Quix Streams (benchmarks/quix_flights.py); "
             "medians shown, raw/*/reps_events_per_s every run.",
             f"The plain loop drains the same input repeated {CEILING_REPEAT} times (its own topic): "
             "over the input alone its timed window was one or two commit intervals.",
             "Both apps' final flight loads are compared with examples.flights.reference "
             "(raw/check)."]
    if env.python is None:
        notes.append(f"Quix Streams not measured: {env.error}")
    runs: dict[str, list[dict[str, Any]]] = {"ceiling": [], "fifolane_EOS": [], "quix_EOS": []}
    bench.step("app: warm-up pass (not timed)")
    measure_ceiling(bench, base, total)
    ceiling = repeated_input(bench, base, total)
    last: dict[str, dict[str, Any]] = {}
    for _r in range(reps):
        runs["ceiling"].append({"throughput": measure_ceiling(bench, ceiling, total * CEILING_REPEAT).to_dict()})
        last["fifolane_EOS"] = run_worker(bench, base, total, "exactly-once", label="app", app=APP)
        runs["fifolane_EOS"].append(last["fifolane_EOS"])
        if env.python is not None:
            try:
                last["quix_EOS"] = run_quix(bench, str(env.python), base, json_topic, total, "exactly-once",
                                            label="app", script="benchmarks/quix_flights.py")
                runs["quix_EOS"].append(last["quix_EOS"])
            except RuntimeError as exc:
                notes.append(f"Quix Streams failed: {str(exc).splitlines()[0]}")
    raw: dict[str, Any] = {k: median_run(v) for k, v in runs.items() if v}
    bench.step("app: checking both apps' flight loads against examples.flights.reference")
    expected = {k.split("/", 1)[1]: (v["seats_sold"], v["rejected_seats"])
                for k, v in reference(evs).items() if k.startswith("flight_load/")}
    codec = make_codec(base, SchemaCatalog.load(base.schemas_dir))
    check: dict[str, Any] = {"flights": len(expected)}
    if "fifolane_EOS" in last:
        got = _final_loads(bench.bootstrap, last["fifolane_EOS"]["state_topic"], lambda v: codec.decode(v).record)
        check["fifolane_matches_reference"] = got == expected
    if "quix_EOS" in last:
        got = _final_loads(bench.bootstrap, last["quix_EOS"]["output_topic"], lambda v: json.loads(v)["value"])
        check["quix_matches_reference"] = got == expected
    raw["check"] = check
    bench.step("app: fifolane under py-spy (where the time goes)")
    try:
        raw["profile"] = _profile(bench, base, total)
    except RuntimeError as exc:
        raw["profile"] = {"error": str(exc)[-2000:]}
    bench.write_result("app", _metrics(raw), started=started, raw=raw, notes=notes, settings={
        "events": total, "flights": FLIGHTS, "partitions": PARTITIONS, "guarantee": "exactly-once",
        "app": APP, "quix_app": "benchmarks/quix_flights.py", "rounds": reps, "concurrency": 16,
    })


def _metrics(raw: dict[str, Any]) -> list[Metric]:
    def rate(key: str) -> float | None:
        run = raw.get(key)
        return None if run is None or "throughput" not in run else float(run["throughput"]["events_per_s"])

    ceiling, mine, quix = rate("ceiling"), rate("fifolane_EOS"), rate("quix_EOS")
    check = raw.get("check", {})
    return [
        Metric("app", "fifolane flights app EOS vs Quix EOS", mine, "events/s", "Quix flights app EOS", quix,
               ">= 3x", None if not (mine and quix) else mine / quix >= 3,
               note=f"outputs match the reference: fifolane {check.get('fifolane_matches_reference')}, "
                    f"Quix {check.get('quix_matches_reference')}"),
        Metric("app", "fifolane flights app EOS vs plain loop", mine, "events/s", "plain loop", ceiling),
        Metric("app", "Quix flights app EOS vs plain loop", quix, "events/s", "plain loop", ceiling),
    ]
