"""A three-stage flights pipeline (NEW -> CONFIRMED -> TICKETED) against real Kafka, with
slow stages (0-5 ms), under a SIGKILL, checked as a history (#17.2): per group, each stage
handles its events in arrival order and never two at once; every reservation passes every
stage exactly once (committed); the final table equals the sequential reference."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka_fixtures import consume_all, wait_until
from worker_support import CATALOG, WorkerProcess, read_table, reservation

from fifolane.config import Settings
from fifolane.serde import make_codec
from fifolane.topics import create_topic

pytestmark = pytest.mark.integration

GROUPS, ENTITIES = 12, 360


def _worker(settings: Settings, wid: str, tmp: Path, effects: str) -> WorkerProcess:
    proc = WorkerProcess(settings, wid, tmp, app="apps.stages_app:app",
                         extra=["--concurrency", "16", "--group-id", f"fifolane-stages-{settings.input_topic}"])
    base = proc.env
    proc.env = lambda: {**base(), "FAULT_EFFECT_TOPIC": effects, "FAULT_WORKER": wid}  # type: ignore[method-assign]
    return proc


def test_three_stages_under_a_kill(settings: Settings, topics: Any, tmp_path: Path) -> None:
    effects_topic = f"{settings.input_topic}.effects"
    create_topic(settings, effects_topic, settings.partitions, {})
    codec = make_codec(settings, CATALOG)
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all", "linger.ms": 5}))
    seq: dict[str, int] = defaultdict(int)
    order: dict[str, list[str]] = defaultdict(list)  # group -> keys in arrival order
    workers = [_worker(settings, f"s{i}", tmp_path, effects_topic) for i in range(2)]
    for w in workers:
        w.start()

    def send(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            rid, group = f"R{i}", f"F{i % GROUPS}"
            producer.produce(settings.input_topic, codec.encode("reservation", reservation(rid, group, 1)),
                             group.encode(), headers=[("test.seq", str(seq[group]).encode())])
            seq[group] += 1
            order[group].append(rid)
        assert producer.flush(30) == 0

    def effects() -> list[dict[str, Any]]:
        return [json.loads(m.value()) for m in consume_all(settings, effects_topic)]

    try:
        send(0, ENTITIES // 2)
        wait_until(lambda: len(effects()) >= 100, timeout=90, message=lambda: workers[1].log_tail())
        workers[1].kill()  # SIGKILL with stage calls in flight
        send(ENTITIES // 2, ENTITIES)
        workers[1].start()
        wait_until(lambda: len({(e["key"], e["stage"]) for e in effects()}) >= 2 * ENTITIES, timeout=180,
                   interval=0.5, message=lambda: f"{len(effects())} effects\n{workers[0].log_tail()}")
    finally:
        for w in workers:
            if w.alive():
                w.kill()
    got = effects()
    # every reservation passed every stage exactly once (committed)
    per = defaultdict(int)
    for e in got:
        per[(e["key"], e["stage"])] += 1
    assert {k: n for k, n in per.items() if n != 1} == {}
    assert len(per) == 2 * ENTITIES
    # per group and stage: arrival order, and never two at once
    for group, keys in order.items():
        for stage in ("NEW", "CONFIRMED"):
            calls = [e for e in got if e["group"] == group and e["stage"] == stage]
            assert [e["key"] for e in calls] == keys, (group, stage)
            spans = sorted((e["start"], e["end"]) for e in calls)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), (group, stage)
    # the final table is the sequential reference: every reservation TICKETED
    table = read_table(settings)
    assert {k: (v, r["state"]) for k, (v, r) in table.items() if r is not None} == \
        {f"reservation/R{i}": (1, "TICKETED") for i in range(ENTITIES)}
