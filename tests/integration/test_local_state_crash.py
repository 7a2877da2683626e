"""A worker killed with SIGKILL restarts on its own local state, which lost its last writes.

The partition stores run without RocksDB's write-ahead log (services/worker/state.py): the
changelog is the log. A crash therefore loses what RocksDB had not flushed yet, here every
row, and the restart must replay it from the changelog, so that the stale check still knows
each entity's version and the table stays exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from kafka_fixtures import wait_until
from worker_support import WorkerProcess, committed_input, read_table, reservation, send_events

from fifolane.config import Settings

pytestmark = pytest.mark.integration

GROUP = "crash-local-state"


def _flight(i: int) -> str:
    return f"F{i % 7}"


def _committed(settings: Settings) -> int:
    try:
        return committed_input(settings, GROUP)
    except KafkaException:  # the group's coordinator is still loading on a fresh broker
        return -1


def test_sigkill_loses_unflushed_rows_and_the_restart_replays_them(settings: Settings, topics: Any,
                                                                    tmp_path: Path) -> None:
    w = WorkerProcess(settings, "w1", tmp_path, extra=["--group-id", GROUP, "--no-listeners"])
    n = send_events(settings, (("reservation", reservation(f"R{i}", _flight(i), 5), "upsert") for i in range(200)))
    w.start()
    try:
        wait_until(lambda: _committed(settings) == n, timeout=90,
                   message=lambda: f"committed {_committed(settings)} of {n}\n{w.log_tail()}")
        w.kill()  # no clean close: RocksDB's memtables are gone with the process

        later = [("reservation", reservation(f"R{i}", _flight(i), 3), "upsert") for i in range(100)]  # stale
        later += [("reservation", reservation(f"R{i}", _flight(i), 6, seats=2), "upsert") for i in range(100, 150)]
        later += [("reservation", reservation(f"R{i}", _flight(i), 7), "delete") for i in range(150, 160)]
        m = send_events(settings, later)
        w.start()  # the same id and state directory
        wait_until(lambda: _committed(settings) == n + m, timeout=90,
                   message=lambda: f"committed {_committed(settings)} of {n + m}\n{w.log_tail()}")
        wait_until(lambda: w.snapshot().get("processed", 0) + w.snapshot().get("superseded", 0) == m, timeout=30)
        stats = w.snapshot()
    finally:
        if w.alive():
            w.kill()

    # Nothing of the first run had reached RocksDB's files: the restart replayed all of it.
    # (the counter also has the directory's claims, restored too when they were committed
    # before the kill: at most one per event)
    assert n <= stats["restored_records"] <= 2 * n
    assert stats["superseded"] == 100, "stale versions were applied: the restored state lost versions"
    assert stats["processed"] == 60
    table = read_table(settings)
    expected: dict[str, tuple[int, bool]] = {}
    for i in range(200):
        expected[f"reservation/R{i}"] = (5, True)
    for i in range(100, 150):
        expected[f"reservation/R{i}"] = (6, True)
    for i in range(150, 160):
        expected[f"reservation/R{i}"] = (7, False)
    assert {k: (v, rec is not None) for k, (v, rec) in table.items()} == expected
    assert all(table[f"reservation/R{i}"][1]["seats"] == 2 for i in range(100, 150))  # type: ignore[index]
