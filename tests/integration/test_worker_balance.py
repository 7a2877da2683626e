"""Two workers share the input, and each takes the directory partitions of its input.

The input and the entity directory were once subscribed together, and cooperative-sticky
balanced them as one pool: a worker that joined second got every directory partition and no
input partition, and processed no event (services/worker/linked.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from kafka_fixtures import wait_until
from worker_support import WorkerThread, read_table, reservation, send_events, wait_accounted

from fifolane.config import Settings

pytestmark = pytest.mark.integration


def _linked(inputs: list[int], n_in: int, n_dir: int) -> list[int]:
    return [d for d in range(n_dir) if d % n_in in inputs]


def _owned(w: WorkerThread) -> tuple[list[int], list[int]]:
    a = w.worker.assignment
    return ([], []) if a is None else (sorted(a.tables), sorted(a.directories))


def _balanced(workers: list[WorkerThread], n: int) -> bool:
    ins = [_owned(w)[0] for w in workers]
    dirs = [_owned(w)[1] for w in workers]
    return (sorted(p for ps in ins for p in ps) == list(range(n)) and all(ins)
            and all(d == _linked(i, n, n) for i, d in zip(ins, dirs, strict=True)))


def test_a_second_worker_takes_input_partitions_and_their_directory_partitions(
        settings: Settings, topics: Any) -> None:
    n = settings.partitions
    assert n >= 2
    first = [("reservation", reservation(f"A{i}", f"F{i % 7}", 1), "upsert") for i in range(60)]
    send_events(settings, first)
    with WorkerThread(settings, None, worker_id="w1") as w1:
        wait_accounted([w1], len(first))
        wait_until(lambda: _balanced([w1], n), timeout=30)  # alone: everything, directory included
        with WorkerThread(settings, None, worker_id="w2") as w2:
            wait_until(lambda: _balanced([w1, w2], n), timeout=60, message=lambda: str([_owned(w) for w in (w1, w2)]))
            second = [("reservation", reservation(f"B{i}", f"F{i % 7}", 1), "upsert") for i in range(60)]
            send_events(settings, second)
            wait_until(lambda: w1.stats.processed + w2.stats.processed == 120 and w1.committed()
                       and w2.committed(), timeout=60, message=lambda: f"{w1.stats} {w2.stats}")
            assert w2.stats.processed > 0  # inputs of its own
            # and claims of its own: its directory consumer reads them back after the commit
            wait_until(lambda: w2.stats.claims > 0, timeout=30, message=lambda: str(w2.stats))
            wait_until(lambda: all(w.stats.assigned and w.stats.assigned_directory == _linked(w.stats.assigned, n, n)
                                   for w in (w1, w2)), timeout=30)  # what the stats file shows
        wait_until(lambda: _balanced([w1], n), timeout=60)  # w2 left: w1 has everything again
    table = read_table(settings)
    assert sorted(table) == sorted([f"reservation/A{i}" for i in range(60)] + [f"reservation/B{i}" for i in range(60)])
