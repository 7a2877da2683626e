"""A local store built from another changelog is rebuilt, not trusted
(services/worker/restore.py ``foreign``).

A worker keeps its RocksDB stores across restarts (per ``--worker-id``). When the state topic
is deleted and created again, renamed (``FIFOLANE_STATE_TOPIC``), or the whole cluster is
replaced (``fifolane kafka up --fresh``), the store's offset says nothing about the new
topic: replaying from it skipped the new topic's first records (the flights were lost, every
reservation was rejected), or, with the offset beyond the new end, replayed nothing and kept
the old rows (a new flight was dropped as stale against its old version). Now a store
records its source (the topic's name and Kafka's topic id) and is rebuilt when it names
another, or when its offset lies beyond the changelog's end. Real RocksDB stores; the
changelog consumer is a small fake.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from fake_kafka import FakeMsg

from services.worker.metrics import Stats
from services.worker.query.standby import Standbys
from services.worker.query.views import Views
from services.worker.restore import RestoredRow, restore_partition
from services.worker.state import StoreManager


class _Changelog:
    """A changelog partition holding ``keys`` at offsets ``low``, ``low + 1``, ...."""

    def __init__(self, keys: list[str], low: int = 0) -> None:
        self.low = low
        self.msgs = [FakeMsg(0, low + i, f"reservation/{k}".encode(), k.encode(), topic="state")
                     for i, k in enumerate(keys)]
        self.start: int | None = None
        self.assigned: list[Any] = []

    @property
    def high(self) -> int:
        return self.low + len(self.msgs)

    def get_watermark_offsets(self, tp: Any, timeout: float | None = None) -> tuple[int, int]:
        return self.low, self.high

    def assign(self, tps: list[Any]) -> None:
        self.start = tps[0].offset
        self.assigned = [(tp.partition, tp.offset) for tp in tps]

    def consume(self, n: int, timeout: float) -> list[FakeMsg]:
        assert self.start is not None
        out = [m for m in self.msgs if m.offset() >= self.start][:n]
        if out:
            self.start = out[-1].offset() + 1
        return out

    def position(self, tps: list[Any]) -> list[Any]:
        return [type("TP", (), {"offset": self.start})()]

    def close(self) -> None:
        pass


def _row(msg: Any, _raw: bool) -> RestoredRow:
    return (msg.key(), 1, False, "F1", msg.value())


def _restore(root: Path, changelog: _Changelog, topic_id: str | None, topic: str = "state") -> list[bytes]:
    """Restore partition 0 from ``changelog``; the entity keys in the store afterwards."""
    stores = StoreManager(root, "g", group_index=False)
    try:
        store = restore_partition({}, topic, 0, stores, Stats(), _row, make_consumer=lambda conf: changelog,
                                  wait_open_txn_s=0.5, topic_id=lambda t: topic_id)
        return sorted(k for k in store.db.keys() if k.startswith(b"e:"))  # noqa: SIM118 - an Rdict
    finally:
        stores.close_all()


def _keys(*names: str) -> list[bytes]:
    return sorted(f"e:reservation/{n}".encode() for n in names)


def test_a_store_from_a_topic_created_again_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert _restore(tmp_path, _Changelog(["OLD1", "OLD2", "OLD3"]), "id-A") == _keys("OLD1", "OLD2", "OLD3")
    # The topic is deleted and created again: a new id, and fewer records than the store's offset.
    fresh = _Changelog(["NEW1"])
    with caplog.at_level(logging.WARNING):
        assert _restore(tmp_path, fresh, "id-B") == _keys("NEW1")
    assert fresh.assigned == [(0, 0)]  # replayed from the start
    assert "built from topic 'state' (id id-A), not from this changelog, topic 'state' (id id-B)" in caplog.text


def test_a_new_topic_longer_than_the_old_one_is_replayed_from_its_start(tmp_path: Path) -> None:
    """The old offset lies inside the new topic: replaying from it skipped the new topic's head."""
    assert _restore(tmp_path, _Changelog(["OLD1"]), "id-A") == _keys("OLD1")
    fresh = _Changelog(["NEW1", "NEW2", "NEW3"])
    assert _restore(tmp_path, fresh, "id-B") == _keys("NEW1", "NEW2", "NEW3")
    assert fresh.assigned == [(0, 0)]


def test_a_store_from_another_topic_name_is_rebuilt(tmp_path: Path) -> None:
    assert _restore(tmp_path, _Changelog(["OLD1"]), "id-A", topic="state") == _keys("OLD1")
    assert _restore(tmp_path, _Changelog(["NEW1", "NEW2"]), "id-C", topic="state-v2") == _keys("NEW1", "NEW2")


def test_the_same_topic_replays_only_its_tail(tmp_path: Path) -> None:
    assert _restore(tmp_path, _Changelog(["A", "B"]), "id-A") == _keys("A", "B")
    grown = _Changelog(["A", "B", "C"])
    assert _restore(tmp_path, grown, "id-A") == _keys("A", "B", "C")
    assert grown.assigned == [(0, 2)]  # from the store's own offset: kept, not rebuilt


def test_without_a_known_id_a_store_ahead_of_the_end_is_rebuilt(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A store written before sources were recorded, or a topic id not read: offsets decide."""
    assert _restore(tmp_path, _Changelog(["OLD1", "OLD2", "OLD3"]), None) == _keys("OLD1", "OLD2", "OLD3")
    with caplog.at_level(logging.WARNING):
        assert _restore(tmp_path, _Changelog(["NEW1"]), None) == _keys("NEW1")
    assert "ahead of the changelog's end (offset 3, the end 1)" in caplog.text
    # Not ahead, no id: nothing tells, the store is kept (its tail replayed).
    assert _restore(tmp_path, _Changelog(["NEW1", "NEW2"]), None) == _keys("NEW1", "NEW2")


def test_a_store_kept_without_an_id_adopts_the_first_one_read(tmp_path: Path) -> None:
    assert _restore(tmp_path, _Changelog(["A"]), None) == _keys("A")
    assert _restore(tmp_path, _Changelog(["A", "B"]), "id-A") == _keys("A", "B")  # adopted, tail replayed
    assert _restore(tmp_path, _Changelog(["Z"]), "id-B") == _keys("Z")  # from now on compared


class _StandbyConsumer:
    def __init__(self, low: int, high: int) -> None:
        self.low, self.high = low, high
        self.assigned: list[Any] = []

    def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
        return self.low, self.high

    def assign(self, tps: list[Any]) -> None:
        self.assigned = [(tp.partition, tp.offset) for tp in tps]


@pytest.mark.parametrize(("high", "topic_id", "rebuilt"), [
    (100, "id-B", True),  # another topic of the same name
    (2, None, True),  # the store's offset (3) is beyond the end
    (100, "id-A", False),  # the same topic: followed from the store's offset
])
def test_a_standby_applies_the_same_rule(tmp_path: Path, high: int, topic_id: str | None, rebuilt: bool) -> None:
    assert _restore(tmp_path, _Changelog(["A", "B", "C"]), "id-A") == _keys("A", "B", "C")
    standbys = Standbys({}, worker_id="w", state_topic="state", state_dir=tmp_path, store_name="g",
                        group_index=False, read_value=None, read_state=lambda value, headers: None,
                        views=Views(), topic_id=lambda t: topic_id)
    consumer = _StandbyConsumer(0, high)
    standbys._consumer = consumer  # type: ignore[assignment]
    standbys._want = {0}
    standbys._sync_assignment()
    try:
        assert standbys._stores.stores[0].is_empty() is rebuilt
        assert consumer.assigned == [(0, 0 if rebuilt else 3)]
    finally:
        standbys.stop()
