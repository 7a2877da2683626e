"""The built-in table handler against real Kafka: seed 001's orderings, stale drops, deletes."""

from __future__ import annotations

from typing import Any

import pytest
from kafka_fixtures import wait_until
from worker_support import (
    WorkerThread,
    consume_all,
    read_dlq,
    read_table,
    reservation,
    send_events,
    wait_accounted,
)

from fifolane.config import Settings
from fifolane.topics import create_topic
from services.worker import App, Event, GroupState

pytestmark = pytest.mark.integration

ADD, DEL = "upsert", "delete"


def _ev(op: str, rid: str, version: int, flight: str = "LH1", **kw: Any) -> tuple[str, dict[str, Any], str]:
    return ("reservation", reservation(rid, flight, version, **kw), op)


# (name, operations in arrival order, expected final (version, present?))
SEED_001_CASES = [
    ("add-add", [(ADD, 1), (ADD, 2)], (2, True)),
    ("add-add-reversed", [(ADD, 2), (ADD, 1)], (2, True)),
    ("add-del", [(ADD, 1), (DEL, 2)], (2, False)),
    ("add-del-reversed", [(DEL, 2), (ADD, 1)], (2, False)),
    ("del-add", [(DEL, 1), (ADD, 2)], (2, True)),
    ("del-add-reversed", [(ADD, 2), (DEL, 1)], (2, True)),
    ("duplicate", [(ADD, 1), (ADD, 1), (ADD, 1)], (1, True)),
]


def test_seed_001_orderings_stale_drops_and_oscillation(settings: Settings, topics: Any) -> None:
    events = []
    expected_superseded = 0
    for i, (_name, ops, _exp) in enumerate(SEED_001_CASES):
        for op, version in ops:
            events.append(_ev(op, f"R{i}", version, flight=f"F{i % 4}", seats=version))
    expected_superseded = 1 + 1 + 1 + 2  # the reversed cases drop one each, duplicates two
    # A constantly changing entity: 200 versions, arriving with every other pair swapped.
    versions = list(range(1, 201))
    for j in range(0, 200, 2):
        versions[j], versions[j + 1] = versions[j + 1], versions[j]
    for v in versions:
        events.append(_ev(ADD, "OSC", v, flight="F9", seats=v % 7 + 1))
    expected_superseded += 100  # each swapped older version arrives after its newer one
    n = send_events(settings, events)

    with WorkerThread(settings, concurrency=4) as w:
        wait_accounted([w], n)
    stats = w.stats
    assert stats.superseded == expected_superseded
    assert stats.processed == n - expected_superseded
    assert stats.dead_lettered == 0

    table = read_table(settings)
    for i, (name, _ops, (version, present)) in enumerate(SEED_001_CASES):
        got_version, record = table[f"reservation/R{i}"]
        assert got_version == version, name
        assert (record is not None) == present, name
        if present:
            assert record is not None and record["seats"] == version, name
    osc_version, osc = table["reservation/OSC"]
    assert osc_version == 200 and osc is not None and osc["seats"] == 200 % 7 + 1


def test_delete_version_survives_restore_on_another_worker(settings: Settings, topics: Any) -> None:
    """An old upsert that arrives after a delete is dropped, also by a worker that restored."""
    n1 = send_events(settings, [_ev(ADD, "A", 1), _ev(DEL, "A", 5), _ev(ADD, "B", 1)])
    with WorkerThread(settings, worker_id="first") as w1:
        wait_accounted([w1], n1)
    # A different worker with an empty state directory: it must restore the delete's version.
    n2 = send_events(settings, [_ev(ADD, "A", 3), _ev(ADD, "B", 2), _ev(ADD, "A", 6)])
    with WorkerThread(settings, worker_id="second") as w2:
        wait_accounted([w2], n2)
    assert w2.stats.restored_records >= 3
    assert (w2.stats.processed, w2.stats.superseded) == (2, 1)
    table = read_table(settings)
    assert table["reservation/A"][0] == 6 and table["reservation/A"][1] is not None
    assert table["reservation/B"][0] == 2


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_guarantees_and_metrics_endpoint(settings: Settings, topics: Any, guarantee: str) -> None:
    """Both guarantees give the same table; the Prometheus endpoint reports the counters."""
    import urllib.request

    events = [_ev(ADD, f"M{i}", 1, flight=f"F{i % 5}") for i in range(50)] + [_ev(ADD, "M0", 1, flight="F0")]
    n = send_events(settings, events)
    with WorkerThread(settings, concurrency=2, guarantee=guarantee, metrics_port=0) as w:
        wait_accounted([w], n)
        port = w.worker.metrics_port
        assert port
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "fifolane_events_processed_total{worker=\"w1\"} 50.0" in body, body[:1500]
    assert 'fifolane_events_superseded_total{worker="w1"} 1.0' in body
    assert "fifolane_commit_latency_seconds" in body and "fifolane_in_flight_groups" in body
    table = read_table(settings)
    assert sorted(table) == sorted(f"reservation/M{i}" for i in range(50))


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_output_over_the_topic_limit_is_dead_lettered_up_front(settings: Settings, topics: Any,
                                                                guarantee: str) -> None:
    """A handler output larger than its topic's max.message.bytes would be refused by the
    broker on every replay: the event is dead-lettered whole (nothing of it applied) before
    anything is produced, and every other event's output gets through."""
    out_topic = f"{settings.input_topic}.out"
    create_topic(settings, out_topic, 1, {"max.message.bytes": "2048"})
    app = App("too-large")

    @app.handler("reservation", inline=True)
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        state.put("reservation", event.value)
        state.emit(out_topic, event.key, b"x" * (8000 if event.key == "BIG" else 10))

    events = [_ev(ADD, f"A{i}", 1, flight=f"F{i % 3}") for i in range(20)]
    events.insert(10, _ev(ADD, "BIG", 1, flight="F1"))
    n = send_events(settings, events)
    with WorkerThread(settings, app, guarantee=guarantee) as w:
        wait_accounted([w], n)
        assert (w.stats.processed, w.stats.dead_lettered, w.stats.aborts) == (20, 1, 0)
    delivered = {m.key().decode(): m.value() for m in consume_all(settings, out_topic)}
    assert sorted(delivered) == sorted(f"A{i}" for i in range(20))
    assert sorted(read_table(settings)) == sorted(f"reservation/{k}" for k in delivered)
    [dead] = read_dlq(settings)
    assert dead["reason"] == "handler-error" and "max.message.bytes" in dead["error"]
    assert dead["key"] == b"F1"


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_record_the_broker_refuses_later_is_found_and_dead_lettered(settings: Settings, topics: Any,
                                                                    guarantee: str) -> None:
    """A record the broker refuses only when it arrives (here: no key, for a compacted
    topic) fails its transaction, and would fail every replay. The worker bisects its
    transactions down to the one input record that produced it, dead-letters that record
    (reason ``output-refused``) and goes on: every other event is applied exactly once."""
    out_topic = f"{settings.input_topic}.compacted"
    create_topic(settings, out_topic, 1, {"cleanup.policy": "compact"})
    app = App("refused")
    calls: dict[str, int] = {}

    @app.handler("reservation", inline=True)
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        calls[event.key] = calls.get(event.key, 0) + 1
        state.put("reservation", event.value)
        state.emit(out_topic, None if event.key == "BAD" else event.key, b"v")

    events = [_ev(ADD, f"A{i}", 1, flight=f"F{i % 3}") for i in range(40)]
    events.insert(25, _ev(ADD, "BAD", 1, flight="F1"))
    n = send_events(settings, events)
    with WorkerThread(settings, app, guarantee=guarantee) as w:
        wait_until(lambda: w.stats.dead_lettered == 1, timeout=120,
                   message=lambda: f"the refused record's input was not dead-lettered: {w.stats}")
        wait_accounted([w], n)
        wait_until(w.committed, timeout=30)
        assert w.stats.aborts >= 1
    delivered = [m.key().decode() for m in consume_all(settings, out_topic)]
    want = sorted(f"A{i}" for i in range(40))
    table = sorted(read_table(settings))
    if guarantee == "exactly-once":
        assert sorted(delivered) == want  # exactly once, although records were replayed
        assert table == sorted(f"reservation/{k}" for k in want)
    else:
        # At-least-once has no transactions: what a failed checkpoint delivered before the
        # failure stays, the dead-lettered event's state write included.
        assert sorted(set(delivered)) == want
        assert set(table) - {"reservation/BAD"} == {f"reservation/{k}" for k in want}
    [dead] = read_dlq(settings)
    assert dead["reason"] == "output-refused" and dead["key"] == b"F1"
    assert "INVALID_RECORD" in dead["error"] or "CORRUPT" in dead["error"], dead["error"]


def test_values_of_older_schema_versions_are_applied_like_current_ones(settings: Settings, topics: Any) -> None:
    """Producers still on v1 or v2 of the reservation schema (schemas/history): the worker
    applies those values (its scanner reads them: they resolve unchanged), keeps their bytes
    in the state topic, drops a stale one whatever its version's schema, and dead-letters a
    damaged one."""
    from io import BytesIO

    import fastavro
    from confluent_kafka import Producer
    from worker_support import CATALOG

    from fifolane.serde import make_codec
    from fifolane.serde.fingerprint import fingerprint_bytes

    def old(name: str, rec: dict[str, Any]) -> bytes:
        writer = next(w for w in CATALOG.writers.values() if w.where.endswith(name))
        body = BytesIO()
        fastavro.schemaless_writer(body, writer.schema, rec)
        return b"\xc3\x01" + fingerprint_bytes(writer.fingerprint) + body.getvalue()

    v1 = {k: v for k, v in reservation("V1", "LH1", 3, seats=2).items() if k != "customer_id"}
    values = [
        (b"LH1", old("reservation.v1.avsc", v1)),
        (b"LH1", old("reservation.v2.avsc", reservation("V2", "LH1", 4, seats=3, state="CONFIRMED"))),
        (b"LH2", make_codec(settings, CATALOG).encode("reservation", reservation("CUR", "LH2", 7, state="TICKETED"))),
        (b"LH2", old("reservation.v2.avsc", reservation("CUR", "LH2", 6))),  # older: stale
        (b"LH1", old("reservation.v2.avsc", reservation("V2", "LH1", 5, seats=4))),
        (b"LH2", old("reservation.v2.avsc", reservation("BAD", "LH2", 1))[:-3]),  # damaged body
    ]
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True}))
    for key, value in values:
        producer.produce(settings.input_topic, value, key)
    assert producer.flush(30) == 0
    with WorkerThread(settings) as w:
        wait_accounted([w], len(values))
    assert (w.stats.processed, w.stats.superseded, w.stats.dead_lettered) == (4, 1, 1)
    table = read_table(settings)
    assert table == {
        "reservation/V1": (3, {**v1, "customer_id": ""}),
        "reservation/V2": (5, reservation("V2", "LH1", 5, seats=4)),
        "reservation/CUR": (7, reservation("CUR", "LH2", 7, state="TICKETED")),
    }
    state = {m.key(): m.value() for m in consume_all(settings, settings.state_topic)}
    assert state[b"reservation/V2"] == values[4][1]  # the bytes the producer wrote
    assert [d["reason"] for d in read_dlq(settings)] == ["undecodable"]
