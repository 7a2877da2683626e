"""Two workers started with the same ``--worker-id`` (a copy-pasted command line, a compose
file with a fixed id): they share the group's static member id, with which each one's
consumer fences the other's for good (that worker went on consuming nothing, and said
nothing but a warning), and a transactional id, with which they fence each other at every
commit. A fenced consumer is replaced by a new one that joins again, so the two take turns;
after five turns in two minutes one of them stops and says why; the other goes on, and
nothing is lost. A fencing now and then (a broker failover can leave one behind, and so
does a consumer that used the id once) is survived."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer
from kafka_fixtures import wait_until
from worker_support import WorkerProcess, processes, read_table, reservation, send_events

from fifolane.config import Settings

pytestmark = pytest.mark.integration


def test_a_second_worker_with_the_same_id_is_stopped_with_a_reason(settings: Settings, topics: Any,
                                                                   tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = WorkerProcess(settings, "same", tmp_path / "a"), WorkerProcess(settings, "same", tmp_path / "b")
    sent = 0
    with processes(a, b):
        deadline = time.monotonic() + 150
        while a.alive() and b.alive() and time.monotonic() < deadline:
            batch = [("reservation", reservation(f"R{i}", f"LH{i % 30}", 1), "upsert") for i in range(sent, sent + 200)]
            sent += send_events(settings, batch)
            time.sleep(0.2)
        assert a.alive() != b.alive(), f"both {'alive' if a.alive() else 'gone'}:\n{a.log_tail()}\n{b.log_tail()}"
        gone, survivor = (b, a) if a.alive() else (a, b)
        assert gone.proc is not None and gone.proc.wait(30) == 2
        text = gone.log_tail(200)
        assert "Traceback" not in text, text
        ours = [line for line in text.splitlines() if not line.startswith("%")]  # not librdkafka's
        last = ours[-1]  # fenced as the group's static member, again and again
        assert last.startswith("error: the Kafka consumer was fenced 5 times") and "the same --worker-id" in last, text
        assert "each worker its own --worker-id" in last, text
        want = {f"reservation/R{i}" for i in range(sent)}
        wait_until(lambda: {k for k, (_v, r) in read_table(settings).items() if r is not None} == want,
                   timeout=120, interval=1.0, message=lambda: survivor.log_tail())
        assert survivor.alive()
        assert survivor.terminate() == 0


def test_a_consumer_that_used_the_id_once_is_survived(settings: Settings, topics: Any, tmp_path: Path) -> None:
    """A static member fenced once (by a consumer that joined once with the worker's id, as a
    group coordinator can after a broker failover) gets a new consumer and goes on."""
    w = WorkerProcess(settings, "once", tmp_path)
    with processes(w):
        first = [("reservation", reservation(f"A{i}", f"LH{i % 20}", 1), "upsert") for i in range(300)]
        send_events(settings, first)
        want = {f"reservation/A{i}" for i in range(300)}
        wait_until(lambda: set(read_table(settings)) == want, timeout=90, interval=0.5, message=w.log_tail)
        group = re.search(r"joined group (\S+)", w.log_tail(400))
        assert group is not None, w.log_tail()
        other = Consumer({"bootstrap.servers": settings.resolved_bootstrap(), "group.id": group.group(1),
                          "group.instance.id": "once", "enable.auto.commit": False,
                          "partition.assignment.strategy": "cooperative-sticky"})
        assigned: list[Any] = []
        other.subscribe([settings.input_topic], on_assign=lambda _c, ps: assigned.extend(ps))
        deadline = time.monotonic() + 60
        while not assigned and time.monotonic() < deadline:
            other.poll(0.2)
        other.close()  # a static member leaves no word: the group keeps its member id for "once"
        assert assigned, "the other consumer took nothing"
        wait_until(lambda: "the consumer failed for good" in w.log_tail(400), timeout=60, message=w.log_tail)
        second = [("reservation", reservation(f"B{i}", f"LH{i % 20}", 1), "upsert") for i in range(300)]
        send_events(settings, second)
        want |= {f"reservation/B{i}" for i in range(300)}
        wait_until(lambda: set(read_table(settings)) == want, timeout=120, interval=0.5, message=w.log_tail)
        assert w.alive() and w.snapshot()["consumer_renewals"] == 1
        assert w.terminate() == 0
