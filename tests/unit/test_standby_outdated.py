"""A standby that starts following a store kept from earlier applies the owner's restore rule
(services/worker/restore.py ``outdated``).

The standby store lives at the path the owner's store would have, so a worker that owned the
partition before (or followed it) finds its old store there. Replaying the changelog from
that store's offset cannot remove an entity whose tombstone compaction removed meanwhile;
and the standby refreshes the store's freshness marker while it follows, so the restore on
a later take-over would not see the age either: the entity would come back to life. So a
store older than half the tombstone retention, or whose offset lies before the changelog's
start, is rebuilt when a standby starts following it. Real RocksDB stores; the standby's
Kafka consumer is a small fake (only the changelog's start is asked).
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import pytest

from services.worker.query.standby import Standbys
from services.worker.query.views import Views
from services.worker.state import StoreManager


class _Consumer:
    def __init__(self, low: int) -> None:
        self.low = low
        self.assigned: list[Any] = []

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return self.low, 100

    def assign(self, tps: list[Any]) -> None:
        self.assigned = [(tp.partition, tp.offset) for tp in tps]


def _old_store(root: Path, written_at_ms: int | None = None) -> None:
    """Partition 0's store as a worker left it: entity E alive, changelog offset 5, last
    written at ``written_at_ms`` (its ``m:written-at``, services/worker/state.py; None: now)."""
    stores = StoreManager(root, "g", group_index=False)
    store = stores.open(0)
    store.restore_batch([(b"reservation/E", 1, False, "F1", b"v")], 5)
    if written_at_ms is not None:
        store.db.put(b"m:written-at", struct.pack(">q", written_at_ms))
    stores.close_all()


def _follow(root: Path, *, low: int, retention_ms: int | None,
            consumer: _Consumer | None = None) -> tuple[Standbys, _Consumer]:
    """A standby of partition 0 after its first turn of opening stores."""
    standbys = Standbys({}, worker_id="w", state_topic="state", state_dir=root, store_name="g",
                        group_index=False, read_value=None, read_state=lambda value, headers: None,
                        views=Views(), tombstone_retention_ms=lambda: retention_ms)
    consumer = consumer or _Consumer(low)
    standbys._consumer = consumer  # type: ignore[assignment]
    standbys._want = {0}
    standbys._sync_assignment()
    return standbys, consumer


@pytest.mark.parametrize(("low", "retention_ms", "why"), [
    (0, 86_400_000, "older than half the tombstone retention"),
    (7, None, "its offset lies before the changelog's start"),
])
def test_an_outdated_store_is_rebuilt_before_a_standby_follows_it(tmp_path: Path, low: int,
                                                                  retention_ms: int | None, why: str) -> None:
    _old_store(tmp_path, written_at_ms=int(time.time() * 1000) - 86_400_000)  # a day ago
    standbys, consumer = _follow(tmp_path, low=low, retention_ms=retention_ms)
    try:
        store = standbys._stores.stores[0]
        assert store.is_empty(), why
        assert standbys.following() == [0]
        assert consumer.assigned == [(0, 0)]  # replayed from the start (auto.offset.reset: earliest)
    finally:
        standbys.stop()


def test_a_recent_store_is_followed_from_its_own_offset(tmp_path: Path) -> None:
    _old_store(tmp_path)
    standbys, consumer = _follow(tmp_path, low=0, retention_ms=86_400_000)
    try:
        assert standbys._stores.stores[0].get(b"reservation/E") is not None
        assert consumer.assigned == [(0, 5)]
    finally:
        standbys.stop()


def test_an_unknown_changelog_start_waits_for_the_next_turn(tmp_path: Path) -> None:
    _old_store(tmp_path)

    class Unreachable(_Consumer):
        def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
            from confluent_kafka import KafkaError, KafkaException

            raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    standbys, _ = _follow(tmp_path, low=0, retention_ms=1, consumer=Unreachable(0))
    try:
        assert standbys.following() == []  # nothing opened, nothing wiped yet
    finally:
        standbys.stop()
    stores = StoreManager(tmp_path, "g", group_index=False)
    try:
        assert stores.open(0).get(b"reservation/E") is not None
    finally:
        stores.close_all()
