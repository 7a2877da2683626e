"""Bad input goes to the dead-letter topic with its reason; everything else is processed."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka_fixtures import consume_all, wait_until
from worker_support import (
    CATALOG,
    WorkerThread,
    accounted,
    committed_input,
    read_dlq,
    read_table,
    reservation,
    send_events,
    wait_accounted,
)

from fifolane.config import Settings
from fifolane.serde import make_codec
from services.worker import App, Event, GroupState

pytestmark = pytest.mark.integration


def _app() -> App:
    app = App("dlq-test")

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        if event.value["customer_id"] == "poison":
            raise RuntimeError("cannot book for poison")
        state.put("reservation", event.value)

    return app


def test_each_bad_record_is_dead_lettered_with_its_reason(settings: Settings, topics: Any) -> None:
    codec = make_codec(settings, CATALOG)
    good = codec.encode("reservation", reservation("R1", "LH1", 1))
    raw = Producer(settings.kafka_config())
    bad = [
        (b"LH1", b"\x00garbage", "undecodable"),
        (b"LH1", good[:12], "undecodable"),  # truncated Avro body
        (b"LH1", b"\xc3\x01" + struct.pack("<q", 12345) + good[10:], "unknown-schema"),
        (None, codec.encode("reservation", reservation("R2", "LH1", 1)), "missing-group"),
        (b"LH1", codec.encode("reservation", reservation("R3", "", 1)), "missing-group"),
        (b"LH1", codec.encode("reservation", reservation("", "LH1", 1)), "missing-key"),
        (b"LH1", None, "undecodable"),
    ]
    for key, value, _reason in bad:
        raw.produce(settings.input_topic, value, key)
    assert raw.flush(30) == 0
    goods = [("reservation", reservation(f"G{i}", f"LH{i % 3}", 1), "upsert") for i in range(30)]
    poison = [("reservation", reservation("P1", "LH0", 1, customer="poison"), "upsert")]
    after = [("reservation", reservation("G-after", "LH0", 1), "upsert")]  # same group as the poison
    n = len(bad) + send_events(settings, goods + poison + after)

    with WorkerThread(settings, _app(), concurrency=4, retries=2, retry_backoff=0.01) as w:
        wait_accounted([w], n)
    assert w.stats.processed == len(goods) + len(after)
    assert w.stats.dead_lettered == len(bad) + 1
    assert w.stats.handler_retries == 2

    letters = read_dlq(settings)
    reasons = sorted(d["reason"] for d in letters)
    assert reasons == sorted([r for _k, _v, r in bad] + ["handler-error"])
    poisoned = next(d for d in letters if d["reason"] == "handler-error")
    assert "RuntimeError: cannot book for poison" in poisoned["error"]
    assert poisoned["topic"] == settings.input_topic and poisoned["worker"] == "w1"
    assert int(poisoned["offset"]) >= 0 and poisoned["key"] == b"LH0"
    for d in letters:
        assert d["topic"] == settings.input_topic and d["error"]
    # the poisoned group went on; every good record is in the table
    table = read_table(settings)
    assert {k for k, v in table.items() if v[1] is not None} == {f"reservation/G{i}" for i in range(30)} | {
        "reservation/G-after"}


def test_a_result_kafka_would_refuse_is_dead_lettered_whole(settings: Settings, topics: Any) -> None:
    """A handler output over message.max.bytes would fail every replay: the event is
    dead-lettered, none of its effects are applied, and its group goes on."""
    out_topic = f"{settings.input_topic}.out"
    app = App("too-large")

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        state.put("reservation", event.value)
        size = 2_000_000 if event.key == "HUGE" else 10
        state.emit(out_topic, event.key, b"x" * size)

    events = [("reservation", reservation(f"S{i}", f"LH{i % 2}", 1), "upsert") for i in range(10)]
    events.insert(5, ("reservation", reservation("HUGE", "LH1", 1), "upsert"))
    n = send_events(settings, events)
    with WorkerThread(settings, app, concurrency=4) as w:
        wait_accounted([w], n)
    assert (w.stats.processed, w.stats.dead_lettered, w.stats.aborts) == (10, 1, 0)
    (letter,) = read_dlq(settings)
    assert letter["reason"] == "handler-error" and "message.max.bytes" in letter["error"]
    assert letter["key"] == b"LH1"
    table = read_table(settings)
    assert sorted(table) == sorted(f"reservation/S{i}" for i in range(10))  # HUGE's write refused too
    outputs = consume_all(settings, out_topic)
    assert sorted(m.key().decode() for m in outputs) == sorted(f"S{i}" for i in range(10))


def test_a_state_record_a_handler_makes_too_large_is_dead_lettered_as_too_large(
        settings: Settings, topics: Any) -> None:
    """A handler writes a reservation whose customer id is 2 MB: over what the state topic
    takes. The event is dead-lettered as ``too-large`` (as the table handler's would be),
    none of its effects are applied, and its group goes on."""
    out_topic = f"{settings.input_topic}.out"
    app = App("too-large-state")

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        big = event.key == "HUGE"
        state.put("reservation", {**event.value, "customer_id": "c" * 2_000_000} if big else event.value)
        state.emit(out_topic, event.key, b"seen")

    events = [("reservation", reservation(f"S{i}", f"LH{i % 2}", 1), "upsert") for i in range(10)]
    events.insert(5, ("reservation", reservation("HUGE", "LH1", 1), "upsert"))
    n = send_events(settings, events)
    with WorkerThread(settings, app, concurrency=4) as w:
        wait_accounted([w], n)
    assert (w.stats.processed, w.stats.dead_lettered, w.stats.aborts) == (10, 1, 0)
    assert dict(w.stats.dead_letter_reasons) == {"too-large": 1}
    (letter,) = read_dlq(settings)
    assert letter["reason"] == "too-large" and "reservation HUGE" in letter["error"]
    assert letter["key"] == b"LH1"
    assert sorted(read_table(settings)) == sorted(f"reservation/S{i}" for i in range(10))
    assert sorted(m.key().decode() for m in consume_all(settings, out_topic)) == sorted(f"S{i}" for i in range(10))


def test_outputs_kafka_cannot_take_are_dead_lettered_not_replayed(settings: Settings, topics: Any) -> None:
    """A handler (on the pool: its result is applied after later records were taken) emits to
    a topic name Kafka refuses, with a key that is not bytes, with a malformed header, or
    into the state topic. Each such event is dead-lettered with what to fix, before anything
    is produced: no transaction aborts (it once aborted for ever, and the bisection blamed
    another record), and every other group goes on."""
    out_topic = f"{settings.input_topic}.out"
    bad = {"BADNAME": ("no such topic!!", "k", ()), "BADKEY": (out_topic, 42, ()),
           "BADHDR": (out_topic, "k", (("h", 7),)), "STATE": (settings.state_topic, "reservation/forged", ()),
           "SURROGATE": (out_topic, "bad\udc80key", ())}
    app = App("bad-outputs")

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        state.put("reservation", event.value)
        topic, key, headers = bad.get(event.key, (out_topic, event.key, ()))
        state.emit(topic, key, b"v", headers)

    events = [("reservation", reservation(f"S{i}", f"LH{i % 3}", 1), "upsert") for i in range(12)]
    for i, name in enumerate(bad):
        events.insert(2 + 2 * i, ("reservation", reservation(name, f"LH{i % 3}", 1), "upsert"))
    n = send_events(settings, events)
    with WorkerThread(settings, app, concurrency=4, retries=0) as w:
        wait_accounted([w], n)
    assert (w.stats.processed, w.stats.dead_lettered, w.stats.aborts) == (12, 5, 0)
    letters = read_dlq(settings)
    assert sorted(d["reason"] for d in letters) == ["handler-error"] * 5
    errors = " | ".join(d["error"] for d in letters)
    for want in ("'no such topic!!' is not a Kafka topic name", "the key must be bytes, str or None, not int",
                 "a header must be a (str, bytes) pair", f"{settings.state_topic} is one of the worker's own topics",
                 "the key is a str that is not UTF-8 encodable"):
        assert want in errors, errors
    assert sorted(read_table(settings)) == sorted(f"reservation/S{i}" for i in range(12))
    assert sorted(m.key().decode() for m in consume_all(settings, out_topic)) == sorted(f"S{i}" for i in range(12))


@pytest.mark.parametrize("handler", ["table", "app"])
def test_state_headers_count_in_the_state_records_size(settings: Settings, topics: Any, handler: str) -> None:
    """With state headers, a state record carries its group and type twice (key and headers).
    A 1,500-byte group and values up to the state topic's 20,000 bytes: what would not fit
    with its headers is dead-lettered as ``too-large`` before it is produced; no transaction
    aborts (records Kafka then refused were bisected, and dead-lettered as output-refused)."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    # batch.size under the topic's limit: the broker checks a whole batch of records against
    # max.message.bytes, and librdkafka's default batches up to 1,000,000 bytes.
    settings = settings.model_copy(update={"state_headers": True, "librdkafka": {"batch.size": "20000"}})
    admin = AdminClient(settings.kafka_config())
    change = ConfigResource(ConfigResource.Type.TOPIC, settings.state_topic, incremental_configs=[
        ConfigEntry("max.message.bytes", "20000", incremental_operation=AlterConfigOpType.SET)])
    for done in admin.incremental_alter_configs([change]).values():
        done.result(30)
    app = None
    if handler == "app":
        app = App("state-headers")

        @app.handler("reservation")
        def handle(event: Event, state: GroupState) -> None:
            assert event.value is not None
            state.put("reservation", event.value)

    group = "G" * 1500
    events = [("reservation", {**reservation(f"R{size}", group, 1), "customer_id": "c" * size}, "upsert")
              for size in range(14000, 19001, 250)]
    n = send_events(settings, events)
    with WorkerThread(settings, app, concurrency=2) as w:
        wait_accounted([w], n, timeout=90)
    assert w.stats.aborts == 0
    assert set(w.stats.dead_letter_reasons) == {"too-large"} and 0 < w.stats.dead_lettered < n
    assert w.stats.processed + w.stats.dead_lettered == n
    dead = {d["value"] for d in read_dlq(settings)}
    assert len(dead) == w.stats.dead_lettered
    stored = sorted(int(k.split("/R", 1)[1]) for k, (_v, rec) in read_table(settings).items() if rec is not None)
    assert len(stored) == w.stats.processed and stored == sorted(stored)[: len(stored)]
    assert max(stored) < 19000 and min(stored) == 14000  # the smaller fit, the larger do not


@pytest.mark.parametrize("handler", ["sync", "async"])
def test_a_retry_sees_the_event_as_it_came(settings: Settings, topics: Any, handler: str) -> None:
    """A handler changes the event's value in place (a field, then all of it), then fails once:
    the retry gets the value as it came (it got the failed attempt's changes, and those
    were committed)."""
    tried: set[str] = set()
    app = App(f"retry-mutates-{handler}")

    def rule(event: Event, state: GroupState) -> None:
        assert event.value is not None
        if event.key not in tried:
            tried.add(event.key)
            event.value["seats"] = 999
            event.value.clear()
            raise TimeoutError("transient")
        state.put("reservation", {**event.value, "state": "CONFIRMED"})

    if handler == "sync":
        app.handler("reservation")(rule)
    else:
        @app.handler("reservation")
        async def rule_async(event: Event, state: GroupState) -> None:
            rule(event, state)

    events = [("reservation", reservation(f"S{i}", f"LH{i % 3}", 1, seats=i + 1), "upsert") for i in range(6)]
    n = send_events(settings, events)
    with WorkerThread(settings, app, concurrency=4, retries=2, retry_backoff=0.01) as w:
        wait_accounted([w], n)
    assert (w.stats.processed, w.stats.dead_lettered, w.stats.handler_retries) == (6, 0, 6)
    table = read_table(settings)
    assert {k: (rec["seats"], rec["flight_number"]) for k, (_v, rec) in table.items()} == \
        {f"reservation/S{i}": (i + 1, f"LH{i % 3}") for i in range(6)}


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_outputs_the_broker_refuses_in_a_batch_are_found_under_both_guarantees(
        settings: Settings, topics: Any, guarantee: str) -> None:
    """Four events of a burst emit a record with no key to a compacted topic: the broker
    refuses it (INVALID_RECORD), and librdkafka fails the records batched with it too
    (_INVALID_DIFFERENT_RECORD), often reporting those first. Two workers, many new entities
    (the directory's claims keep coming): the bisection finds exactly the four, under both
    guarantees (at-least-once once took a batch-mate's error for a passing one and replayed
    the batch for ever), and every other event is applied and committed."""
    compacted = f"{settings.input_topic}.compacted"
    admin = AdminClient(settings.kafka_config())
    for future in admin.create_topics([NewTopic(compacted, 3, 1, config={"cleanup.policy": "compact"})]).values():
        future.result(30)
    app = App("refused-in-a-batch")

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        state.put("reservation", event.value)
        state.emit(compacted, None if event.value["customer_id"] == "poison" else event.key, b"v")

    poisoned = {17, 18, 90, 199}
    n = 200
    events = [("reservation", reservation(f"R{i}", f"F{i % 23}", 1, customer="poison" if i in poisoned else "c1"),
               "upsert") for i in range(n)]
    w1 = WorkerThread(settings, app, worker_id="w1", guarantee=guarantee, concurrency=4)
    w2 = WorkerThread(settings, app, worker_id="w2", guarantee=guarantee, concurrency=4)
    with w1, w2:
        wait_until(lambda: w1.worker.assigned_partitions and w2.worker.assigned_partitions, timeout=60,
                   message="both workers have partitions")
        send_events(settings, events)
        wait_until(lambda: accounted([w1.stats, w2.stats]) >= n and w1.committed() and w2.committed(),
                   timeout=180, message=lambda: f"w1 {w1.stats}\nw2 {w2.stats}")
        refused = w1.stats.dead_letter_reasons["output-refused"] + w2.stats.dead_letter_reasons["output-refused"]
        assert refused == len(poisoned)
    letters = [d for d in read_dlq(settings) if d["reason"] == "output-refused"]
    assert {d["key"] for d in letters} == {f"F{i % 23}".encode() for i in poisoned}
    table, applied = set(read_table(settings)), {f"reservation/R{i}" for i in range(n) if i not in poisoned}
    if guarantee == "exactly-once":
        assert table == applied
    else:  # no transaction takes back what a refused batch delivered (README, "at-least-once")
        assert applied <= table <= applied | {f"reservation/R{i}" for i in poisoned}
    assert committed_input(settings, w1.worker.group_id) == n
