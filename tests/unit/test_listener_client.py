"""Sequence tracking (duplicates, provable gaps, new runs), the materialized view, and the
notification JSON encoding. No Kafka."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from listeners.client import MaterializedView
from listeners.notify import dumps, notification
from listeners.registry import Progress, parse_progress_key, progress_key
from listeners.seq import DELTA, Gap, SeqTracker, next_epoch


def test_tracker_drops_duplicates_and_proves_gaps() -> None:
    t = SeqTracker()
    base = 7 * DELTA
    accepted = [t.accept("l", 0, s) for s in (base, base + 1, base + 1, base + 4, base + 2)]
    assert accepted == [True, True, False, True, False]
    assert t.gaps == [Gap("l", 0, base + 1, base + 4)] and t.gaps[0].missing == 2
    assert t.duplicates == 2
    # A failover jumps by at least DELTA: a new run, no inference.
    assert t.accept("l", 0, base + 4 + DELTA) is True
    assert (len(t.gaps), t.runs) == (1, 2)
    # Partitions and listeners are tracked separately.
    assert t.accept("l", 1, base) is True and t.accept("m", 0, base) is True


def test_epochs_increase_and_leave_room() -> None:
    a = next_epoch()
    b = next_epoch(a)
    assert b >= a + 2 and (b + 60 * 365 * 24 * 3600 * 1000) * DELTA < 2**63


def test_view_applies_in_order() -> None:
    v = MaterializedView()
    for version, (kind, key, value) in enumerate([("created", "A", {"x": 1}), ("created", "B", {"x": 2}),
                                                  ("modified", "A", {"x": 3}), ("removed", "B", None),
                                                  ("removed", "C", None)]):  # fmt: skip
        v.apply({"kind": kind, "type": "t", "key": key, "value": value, "version": version, "partition": 0})
    assert v.data == {"t/A": {"x": 3}}
    assert v.applied == 5


def _note(kind: str, key: str, version: int, partition: int, value: Any = None,
          registration: str = "2026-01-01T00:00:00+00:00") -> dict[str, Any]:
    return {"kind": kind, "type": "t", "key": key, "value": value, "version": version,
            "partition": partition, "registration": registration}


@pytest.mark.parametrize("order", ["moved-out first", "moved-in first"])
def test_view_follows_an_entity_that_changed_partition(order: str) -> None:
    """Rebooked onto a flight of another partition: removed there and created here with the
    same version, in either order; an older note from the old partition changes nothing."""
    out, into = _note("removed", "A", 5, 0), _note("created", "A", 5, 1, {"x": "moved"})
    v = MaterializedView()
    v.apply(_note("created", "A", 1, 0, {"x": "first"}))
    for note in ([out, into] if order == "moved-out first" else [into, out]):
        v.apply(note)
    assert v.data == {"t/A": {"x": "moved"}}
    v.apply(_note("modified", "A", 3, 0, {"x": "stale"}))  # late, from the old partition
    assert v.data == {"t/A": {"x": "moved"}}
    v.apply(_note("removed", "A", 6, 1))
    v.apply(_note("created", "A", 4, 0, {"x": "older"}))
    assert v.data == {}


def test_view_starts_again_with_a_new_registration() -> None:
    v = MaterializedView()
    v.apply(_note("created", "A", 1, 0, {"x": 1}))
    v.apply(_note("created", "B", 1, 1, {"x": 1}))
    later = "2026-02-01T00:00:00+00:00"
    v.apply(_note("created", "B", 1, 1, {"x": 2}, registration=later))  # its snapshot
    v.apply(_note("modified", "A", 2, 0, {"x": 3}))  # the old registration, still in flight
    assert v.data == {"t/B": {"x": 2}}


def test_notification_json_handles_cel_and_avro_values() -> None:
    value = {"d": date(2025, 1, 2), "ts": datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
             "dur": timedelta(seconds=90), "amount": Decimal("1.50"), "raw": b"\x00\x01"}  # fmt: skip
    doc = json.loads(notification("l", "created", "t", "k", value, "created", 2, 10, 3, 99, 5))
    assert doc == {
        "listener": "l", "kind": "created", "key": "k", "type": "t", "table_change": "created",
        "partition": 2, "offset": 10, "version": 3, "seq": 99, "ts": 5,
        "value": {"d": "2025-01-02", "ts": "2025-01-02T03:04:05+00:00", "dur": 90.0,
                  "amount": "1.50", "raw": "AAE="},
    }  # fmt: skip
    snap = json.loads(notification("l", "created", "t", "k", None, None, 0, None, 1, 1, 1,
                                   snapshot=True))  # fmt: skip
    assert (snap["snapshot"], snap["offset"], snap["table_change"]) == (True, None, None)
    assert dumps({"s": {1}}) == b'{"s":[1]}'


def test_progress_records_round_trip() -> None:
    p = Progress("view", 4, "2025-01-01T00:00:00+00:00", b"reservation/R\xff", False, 12)
    assert Progress.from_json(p.to_json()) == p
    assert progress_key("view", 4) == "view/snapshot/4"
    assert parse_progress_key("view/snapshot/4") == ("view", 4)
    assert parse_progress_key("view") is None
