"""At-least-once offset commits against real Kafka: whatever triggers a commit (the interval,
a pause of the input: services.worker.pacing.PAUSE_S), every offset below a committed one
was finished, and an idle worker commits nothing. Adapted from a helper session's break
attempts on the 20 ms pause (benchmarks/README.md, "At-least-once commits after a 20 ms
pause")."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition
from kafka_fixtures import wait_until
from worker_support import (
    CATALOG,
    WorkerThread,
    committed_input,
    read_table,
    reservation,
    wait_accounted,
)

from fifolane.config import Settings
from fifolane.serde import make_codec
from services.worker import App, Event, GroupState
from services.worker import kafka as wkafka

pytestmark = pytest.mark.integration


def _stream(settings: Settings, w: WorkerThread, plan: list[tuple[int, float]], prefix: str,
            sent: list[str]) -> None:
    """Send bursts of new reservations over 13 flights: plan = (events, pause after)."""
    wait_until(lambda: w.worker.assigned_partitions != [], timeout=60, message="assigned")
    codec = make_codec(settings, CATALOG)
    out = Producer(settings.kafka_config(**{"enable.idempotence": True, "linger.ms": 0}))
    for n, gap in plan:
        for _ in range(n):
            rid, flight = f"{prefix}{len(sent)}", f"F{len(sent) % 13}"
            out.produce(settings.input_topic, codec.encode("reservation", reservation(rid, flight, 1)),
                        flight.encode())
            sent.append(rid)
        out.flush(5)
        time.sleep(gap)  # the input's shape: a pause after each burst
    assert out.flush(30) == 0


def test_at_least_once_never_commits_an_unfinished_offset(settings: Settings, topics: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Handlers of 0-60 ms on 4 threads, bursts with 5, 30 and 200 ms between them (pauses
    longer and shorter than PAUSE_S, commits on a 50 ms interval too): at every offset
    commit, every offset below the committed one of each partition had finished its handler."""
    finished: set[tuple[int, int]] = set()
    lock = threading.Lock()
    delays = random.Random(11)
    app = App("slow")

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        with lock:
            pause = delays.uniform(0, 0.06)
        time.sleep(pause)  # the handler's work
        assert event.value is not None
        state.put(event.type, event.value)
        with lock:
            finished.add((event.partition, event.offset))

    unfinished: list[str] = []
    checked = [0]
    commit = wkafka.WorkerConsumer.commit

    def checking(self: Any, offsets: list[TopicPartition], wait: bool = True) -> None:
        with lock:
            done = set(finished)
        for tp in offsets:
            if tp.topic == settings.input_topic:
                checked[0] += 1
                missing = [o for o in range(tp.offset) if (tp.partition, o) not in done]
                if missing:
                    unfinished.append(f"partition {tp.partition} committed {tp.offset}, unfinished {missing[:5]}")
        commit(self, offsets, wait)

    monkeypatch.setattr(wkafka.WorkerConsumer, "commit", checking)
    shapes = random.Random(5)
    plan = [(shapes.choice([1, 2, 5]), shapes.choice([0.005, 0.03, 0.2])) for _ in range(40)]
    sent: list[str] = []
    with WorkerThread(settings, app, guarantee="at-least-once", commit_interval=0.05, concurrency=4) as w:
        _stream(settings, w, plan, "S", sent)
        wait_accounted([w], len(sent), timeout=60)
        assert (w.stats.processed, w.stats.dead_lettered) == (len(sent), 0)
    assert checked[0] > 0 and unfinished == []
    assert {k: v for k, (v, _r) in read_table(settings).items()} == {f"reservation/{r}": 1 for r in sent}
    assert committed_input(settings, w.worker.group_id) == len(sent)


def test_an_idle_at_least_once_worker_commits_nothing(settings: Settings, topics: Any) -> None:
    """After its input stops, the pause commits once; then the worker commits nothing while
    idle (its loop wakes every PAUSE_S), and an event after the idle stretch is committed."""
    sent: list[str] = []
    with WorkerThread(settings, guarantee="at-least-once", commit_interval=600.0, concurrency=4) as w:
        _stream(settings, w, [(20, 0.0)], "I", sent)
        wait_accounted([w], len(sent), timeout=60)
        wait_until(lambda: committed_input(settings, w.worker.group_id) == len(sent), timeout=30,
                   message="the pause after the burst committed its offsets")
        # and the burst's directory claims, read back (by the directory's own consumer,
        # possibly after the input's pause commit) and committed: work, not idleness
        wait_until(lambda: w.stats.claims == len(sent) and w.committed(), timeout=30,
                   message=lambda: f"the burst's claims were not taken: {w.stats.claims} of {len(sent)}")
        before = w.stats.commits
        time.sleep(1.5)  # idle: nothing may commit
        idle = w.stats.commits - before
        _stream(settings, w, [(1, 0.0)], "J", sent)
        wait_accounted([w], len(sent), timeout=60)
        wait_until(lambda: committed_input(settings, w.worker.group_id) == len(sent), timeout=30,
                   message="the event after the idle stretch was committed (10-minute interval)")
    assert idle == 0
