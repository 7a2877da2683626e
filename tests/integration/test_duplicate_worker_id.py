"""Two workers started with the same ``--worker-id`` (a copy-pasted command line, a compose
file with a fixed id): they share the group's static member id, which fences one consumer
for good (that worker went on consuming nothing, and said nothing but a warning), and a
transactional id, with which they fence each other at every commit. One of them stops and
says why; the other goes on, and nothing is lost."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
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
        last = gone.log_tail(1)  # fenced as the group's static member, or as a transactional producer
        assert last.startswith("error: ") and "the same --worker-id" in last, text
        assert "each worker its own --worker-id" in last, text
        want = {f"reservation/R{i}" for i in range(sent)}
        wait_until(lambda: {k for k, (_v, r) in read_table(settings).items() if r is not None} == want,
                   timeout=120, interval=1.0, message=lambda: survivor.log_tail())
        assert survivor.alive()
        assert survivor.terminate() == 0
