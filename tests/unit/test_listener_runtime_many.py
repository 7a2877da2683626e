"""Thousands of listeners on one worker (no Kafka): registration is linear, delivery exact.

Regression: a worker with 10,000 registered equality listeners used to commit nothing for
minutes, because activating each listener looked up its output topic's partitions on the
broker and recomputed the set of watched entity types over all active listeners.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.serde import SchemaCatalog, make_codec
from listeners.follower import RegistryRecord
from listeners.model import ListenerSpec
from listeners.notify import notification
from listeners.runtime import ListenerRuntime
from listeners.standin import QuietRegistry, StandInContext
from services.worker.state import Row

N = 10_000


def _record(rid: str, customer: str, amount: float = 10.0, version: int = 1) -> dict[str, Any]:
    return {"reservation_id": rid, "flight_number": "F1", "customer_id": customer, "seats": 1,
            "amount": amount, "state": "NEW", "version": version}  # fmt: skip


def test_ten_thousand_equality_listeners_deliver_exactly() -> None:
    settings = Settings()
    codec = make_codec(settings, SchemaCatalog.load(PROJECT_ROOT / "schemas"))
    worker = StandInContext(codec)
    lookups: list[str] = []

    def partitions(topic: str) -> int:
        lookups.append(topic)
        return 6

    rt = ListenerRuntime(settings, topic_partitions=partitions, follower=QuietRegistry())  # type: ignore[arg-type]
    rt.open(worker)
    rt.on_assign([0, 1])
    assert rt.ready()
    specs = [ListenerSpec(name=f"c{i}", type="reservation", filter=f'value.customer_id == "c{i}"')
             for i in range(N)]  # fmt: skip
    rt.apply_records([RegistryRecord(s.name, s.to_json(), i) for i, s in enumerate(specs)])
    assert len(rt.names()) == N
    assert lookups == [settings.listener_output_topic]  # one metadata lookup, not one per listener

    def change(offset: int, rid: str, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        old_row = None if old is None else Row(old["version"], False, "F1",
                                               codec.encode("reservation", old))  # fmt: skip
        new_row = Row(new["version"], False, "F1", codec.encode("reservation", new))
        rt.on_change(offset % 2, offset, 1000 + offset, f"reservation/{rid}".encode(), old_row, new_row, new)  # fmt: skip

    # 300 entities created for customers c0..c299, plus 5 for customers nobody listens to.
    for i in range(300):
        change(i, f"R{i}", None, _record(f"R{i}", f"c{i}"))
    for i in range(5):
        change(300 + i, f"X{i}", None, _record(f"X{i}", f"z{i}"))
    # R0..R99 move to an unwatched customer (leave c<i>'s view); R100..R199 change amount.
    for i in range(100):
        change(400 + i, f"R{i}", _record(f"R{i}", f"c{i}"), _record(f"R{i}", "nobody", version=2))
    for i in range(100, 200):
        change(400 + i, f"R{i}", _record(f"R{i}", f"c{i}"),
               _record(f"R{i}", f"c{i}", amount=99.0, version=2))  # fmt: skip

    docs = [json.loads(v) for _t, v, _k, _p in worker.sent]
    assert len(docs) == 500
    kinds = Counter((d["listener"], d["kind"]) for d in docs)
    expected = Counter({(f"c{i}", "created"): 1 for i in range(300)})
    expected.update({(f"c{i}", "removed"): 1 for i in range(100)})
    expected.update({(f"c{i}", "modified"): 1 for i in range(100, 200)})
    assert kinds == expected
    assert all(d["key"] == f"R{d['listener'][1:]}" for d in docs)
    assert {t for t, _v, _k, _p in worker.sent} == {settings.listener_output_topic}
    # Per listener and partition the numbers are consecutive from the run's base.
    seqs: dict[tuple[str, int], list[int]] = {}
    for d in docs:
        seqs.setdefault((d["listener"], d["partition"]), []).append(d["seq"])
    assert all(s == list(range(s[0], s[0] + len(s))) for s in seqs.values())
    # The fast JSON is byte-for-byte what notification() builds.
    d, raw = docs[-1], worker.sent[-1][1]
    assert raw == notification(d["listener"], d["kind"], d["type"], d["key"], d["value"],
                               d["table_change"], d["partition"], d["offset"], d["version"],
                               d["seq"], d["ts"], registration=d["registration"])  # fmt: skip

    # Removing them all is linear too, and leaves nothing to match.
    rt.apply_records([RegistryRecord(s.name, None, N + i) for i, s in enumerate(specs)])
    assert rt.names() == []
    worker.sent.clear()
    change(999, "R250", _record("R250", "c250"), _record("R250", "c250", version=3))
    assert worker.sent == []
