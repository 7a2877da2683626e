"""A worker restarted on its old local state after its topics were deleted and created again
rebuilds that state from the new state topic (services/worker/restore.py ``foreign``).

Before, it trusted its RocksDB store: the store's changelog offset was beyond the new topic's
end, so the restore replayed nothing and kept the old rows. A new entity with an old key and
a lower version was then dropped as stale against a version that no longer existed
anywhere, and the state topic never got it. The same happens after
``fifolane kafka up --fresh`` (a new cluster, the same names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from kafka_fixtures import wait_until
from worker_support import WorkerProcess, committed_input, read_table, reservation, send_events

from fifolane.config import Settings
from fifolane.topics import ensure_topics, role_names

pytestmark = pytest.mark.integration

GROUP = "topics-created-again"


def _committed(settings: Settings) -> int:
    try:
        return committed_input(settings, GROUP)
    except KafkaException:  # the group's coordinator is still loading, or the topic is new
        return -1


def _recreate(settings: Settings) -> None:
    """Delete every role topic, wait until Kafka has forgotten them, create them again."""
    admin = AdminClient(settings.kafka_config())
    names = sorted(set(role_names(settings).values()))
    existing = set(admin.list_topics(timeout=10).topics)
    for future in admin.delete_topics([n for n in names if n in existing], operation_timeout=30).values():
        future.result(60)
    wait_until(lambda: not set(names) & set(admin.list_topics(timeout=10).topics), timeout=60,
               message="the deleted topics are still listed")

    def created() -> bool:  # a topic just deleted may still be marked for deletion for a moment
        try:
            ensure_topics(settings)
            return True
        except Exception:  # noqa: BLE001 - tried again until the time-out
            return False
    wait_until(created, timeout=60, message="the role topics were not created again")


def test_a_restart_after_the_topics_were_created_again_rebuilds_its_state(settings: Settings, topics: Any,
                                                                          tmp_path: Path) -> None:
    w = WorkerProcess(settings, "w1", tmp_path, extra=["--group-id", GROUP, "--no-listeners"])
    first = send_events(settings, (("reservation", reservation(f"R{i}", f"F{i % 5}", 5), "upsert")
                                   for i in range(120)))
    w.start()
    try:
        wait_until(lambda: _committed(settings) == first, timeout=90,
                   message=lambda: f"committed {_committed(settings)} of {first}\n{w.log_tail()}")
        assert w.terminate() == 0  # a clean stop: RocksDB keeps every row and its offset
        assert len(read_table(settings)) == 120

        _recreate(settings)
        # The same keys again, at versions below the old ones, and a few new keys.
        later = [("reservation", reservation(f"R{i}", f"F{i % 5}", 1, seats=3), "upsert") for i in range(10)]
        later += [("reservation", reservation(f"N{i}", "F9", 1), "upsert") for i in range(5)]
        m = send_events(settings, later)
        w.start()  # the same --worker-id and state directory
        wait_until(lambda: _committed(settings) == m, timeout=120,
                   message=lambda: f"committed {_committed(settings)} of {m}\n{w.log_tail()}")
        wait_until(lambda: w.snapshot().get("processed", 0) + w.snapshot().get("superseded", 0) == m,
                   timeout=30, message=lambda: f"stats {w.snapshot()}")
        stats = w.snapshot()
    finally:
        if w.alive():
            w.kill()

    assert stats["processed"] == m and stats["superseded"] == 0, stats
    table = read_table(settings)
    assert {k: v for k, (v, _rec) in table.items()} == {
        **{f"reservation/R{i}": 1 for i in range(10)}, **{f"reservation/N{i}": 1 for i in range(5)}}
    assert all(table[f"reservation/R{i}"][1]["seats"] == 3 for i in range(10))  # type: ignore[index]
    assert "was built from topic" in w.log_tail(400) or "ahead of the changelog's end" in w.log_tail(400)
