"""Parked groups end to end (#17.1), with worker processes under SIGKILL and partition moves:
a group whose event keeps failing is parked and stays parked across restarts and moves;
the other groups are never held up; after ``fifolane groups release`` the parked group's
events are applied in their original order, exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka_fixtures import consume_all, wait_until
from worker_support import CATALOG, WorkerProcess, reservation

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.serde import make_codec
from fifolane.topics import create_topic

pytestmark = pytest.mark.integration

GROUPS, PER_GROUP = 8, 30
POISONED = "F3"


def _worker(settings: Settings, wid: str, tmp: Path, effects: str, heal: Path) -> WorkerProcess:
    proc = WorkerProcess(settings, wid, tmp, app="apps.park_app:app",
                         extra=["--on-failure", "park", "--retries", "1",
                                "--group-id", f"fifolane-park-{settings.input_topic}"])
    base = proc.env
    proc.env = lambda: {**base(), "FAULT_EFFECT_TOPIC": effects, "FAULT_WORKER": wid,  # type: ignore[method-assign]
                        "PARK_HEAL_FILE": str(heal)}
    return proc


def _cli(settings: Settings, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = WorkerProcess(settings, "cli", tmp).env()
    return subprocess.run([sys.executable, "-m", "fifolane.cli", *args], env=env, cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_parked_group_survives_kills_and_moves_then_replays_in_order(settings: Settings, topics: Any,
                                                                    tmp_path: Path) -> None:
    effects_topic = f"{settings.input_topic}.effects"
    create_topic(settings, effects_topic, settings.partitions, {})
    heal = tmp_path / "healed"
    codec = make_codec(settings, CATALOG)
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all"}))
    seq: dict[str, int] = defaultdict(int)

    def send(lo: int, hi: int) -> None:
        for i in range(lo, hi):
            for g in range(GROUPS):
                group = f"F{g}"
                customer = "poison" if group == POISONED and i == 5 else "c"
                rec = reservation(f"R{g}-{i}", group, 1, customer=customer)
                producer.produce(settings.input_topic, codec.encode("reservation", rec), group.encode(),
                                 headers=[("test.seq", str(seq[group]).encode())])
                seq[group] += 1
        assert producer.flush(30) == 0

    def effects() -> list[dict[str, Any]]:
        return [json.loads(m.value()) for m in consume_all(settings, effects_topic)]

    def done(group: str) -> list[int]:
        return [e["seq"] for e in effects() if e["group"] == group]

    workers = [_worker(settings, f"p{i}", tmp_path, effects_topic, heal) for i in range(2)]
    for w in workers:
        w.start()
    try:
        send(0, PER_GROUP // 2)
        # the other groups are not held up while F3 is parked at its 6th event
        wait_until(lambda: all(len(done(f"F{g}")) == PER_GROUP // 2 for g in range(GROUPS) if g != 3)
                   and done(POISONED) == list(range(5)), timeout=120, interval=0.5,
                   message=lambda: f"{ {f'F{g}': len(done(f'F{g}')) for g in range(GROUPS)} }\n{workers[0].log_tail()}")
        workers[1].kill()  # SIGKILL: its partitions move to the other worker
        send(PER_GROUP // 2, PER_GROUP)
        wait_until(lambda: all(len(done(f"F{g}")) == PER_GROUP for g in range(GROUPS) if g != 3),
                   timeout=120, interval=0.5, message=lambda: workers[0].log_tail())
        workers[1].start()  # and back (restart: the partitions may move again)
        # Every event of the poisoned group is held, once the worker that owns its partition
        # now has counted them (a listing taken earlier shows a smaller count).
        last: list[list[dict[str, Any]]] = [[]]

        def parked() -> list[dict[str, Any]]:
            r = _cli(settings, tmp_path, "groups", "parked", "--json")
            last[0] = [json.loads(line) for line in r.stdout.splitlines()] if r.returncode == 0 else []
            return last[0]

        wait_until(lambda: [(p["group"], p["held"]) for p in parked()] == [(POISONED, PER_GROUP - 5)],
                   timeout=90, interval=1, message=lambda: f"groups parked: {last[0]}")
        listed = last[0]
        assert "poison" in listed[0]["error"]
        assert done(POISONED) == list(range(5))  # nothing of it applied while parked
        workers[0].kill()  # one more kill while parked
        workers[0].start()
        heal.write_text("fixed")  # the operator fixed the cause
        out = _cli(settings, tmp_path, "groups", "release", POISONED)
        assert out.returncode == 0, out.stderr
        assert f"release of '{POISONED}' requested" in out.stdout
        wait_until(lambda: len(done(POISONED)) >= PER_GROUP, timeout=120, interval=0.5,
                   message=lambda: f"{done(POISONED)}\n{workers[0].log_tail()}\n{workers[1].log_tail()}")
        assert _cli(settings, tmp_path, "groups", "parked", "--json").stdout.strip() == ""
    finally:
        for w in workers:
            if w.alive():
                w.kill()
    assert done(POISONED) == list(range(PER_GROUP))  # in the original order, exactly once
    for g in range(GROUPS):
        assert sorted(done(f"F{g}")) == list(range(PER_GROUP)), g
