"""A listener's output topic deleted while workers run: Kafka refuses its notifications for
good. That listener is suspended on the worker (a status record says why, `listeners
describe` shows it, and the worker keeps it after a restart), and the worker, its table and
the other listeners go on: no event is dead-lettered, none is lost, nothing stalls.
Registering the listener again (the same definition) lifts the suspension. Before, the
worker replayed its transaction for ever."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient, NewTopic
from kafka_fixtures import consume_all, wait_until
from worker_support import WorkerThread, read_dlq, read_table, reservation, send_events

from fifolane.cli.listeners import listeners as listeners_cli
from fifolane.config import Settings
from listeners.model import ListenerSpec
from listeners.registry import read_registry, register
from listeners.runtime import ListenerRuntime
from services.worker import App, Event, GroupState

pytestmark = pytest.mark.integration


def _events(prefix: str, n: int) -> list[tuple[str, dict[str, Any], str]]:
    return [("reservation", reservation(f"{prefix}{i}", f"F{i % 5}", 1), "upsert") for i in range(n)]


def _keys(settings: Settings, topic: str, listener: str) -> list[str]:
    return sorted(json.loads(m.value())["key"] for m in consume_all(settings, topic)
                  if json.loads(m.value())["listener"] == listener)


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_a_deleted_output_topic_suspends_its_listener_and_nothing_else(
        settings: Settings, topics: Any, guarantee: str, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings.model_copy(update={"librdkafka": {"allow.auto.create.topics": "false"}})  # as in production
    admin = AdminClient(settings.kafka_config())
    side = f"{settings.input_topic}.side"
    for future in admin.create_topics([NewTopic(side, 3, 1)]).values():
        future.result(30)
    rt = ListenerRuntime(settings)
    with WorkerThread(settings, worker_id="w-out", listeners=rt, guarantee=guarantee) as w:
        register(settings, ListenerSpec(name="side", filter="true", output_topic=side))
        register(settings, ListenerSpec(name="main", filter="true"))
        wait_until(lambda: rt.names() == ["main", "side"], message=lambda: str(rt.names()))
        n = send_events(settings, _events("A", 20))
        wait_until(lambda: w.stats.processed >= n and w.committed(), timeout=60, message=lambda: str(w.stats))
        assert _keys(settings, side, "side") == sorted(f"A{i}" for i in range(20))

        for future in admin.delete_topics([side]).values():
            future.result(30)
        m = send_events(settings, _events("B", 30))
        wait_until(lambda: "side" in rt.suspended() and w.committed() and len(read_table(settings)) == n + m,
                   timeout=120, message=lambda: f"suspended {rt.suspended()} {w.stats}")
        assert rt.names() == ["main"] and w.thread.is_alive()
        assert side in rt.suspended()["side"] and "register the listener again" in rt.suspended()["side"]
        assert w.stats.dead_lettered == 0 and read_dlq(settings) == []
        mains = _keys(settings, settings.listener_output_topic, "main")
        expected = sorted([f"A{i}" for i in range(20)] + [f"B{i}" for i in range(30)])
        if guarantee == "exactly-once":
            assert mains == expected
        else:  # the replay delivers again what the aborted batch had delivered
            assert sorted(set(mains)) == expected
        for k, v in {"FIFOLANE_BOOTSTRAP_SERVERS": settings.resolved_bootstrap(),
                     "FIFOLANE_INPUT_TOPIC": settings.input_topic,
                     "FIFOLANE_REGISTRY_TOPIC": settings.registry_topic,
                     "FIFOLANE_LISTENER_OUTPUT_TOPIC": settings.listener_output_topic}.items():
            monkeypatch.setenv(k, v)

        def described() -> str | None:
            out = CliRunner().invoke(listeners_cli, ["describe", "side"]).output
            return out if "suspended" in out and "w-out" in out else None

        assert "refused its notifications" in wait_until(described, timeout=30)
    rt.close()

    # Restarted, the worker keeps the suspension it said (its status record), and does not
    # create the deleted topic again.
    rt = ListenerRuntime(settings)
    with WorkerThread(settings, worker_id="w-out", listeners=rt, guarantee=guarantee) as w:
        wait_until(lambda: w.worker.assigned_partitions == [0, 1, 2] and rt.names() == ["main"]
                   and "side" in rt.suspended(), timeout=60, message=lambda: f"{rt.names()} {rt.suspended()}")
        assert side not in admin.list_topics(timeout=10).topics
        # The same definition registered again, at once: a new instance (the topic is
        # created again), which the worker's producer sees although it saw the topic deleted.
        before = read_registry(settings).listeners["side"].created_at
        again = register(settings, ListenerSpec(name="side", filter="true", output_topic=side))
        assert again.created_at > before
        wait_until(lambda: rt.names() == ["main", "side"] and not rt.suspended(), timeout=30,
                   message=lambda: f"{rt.names()} {rt.suspended()}")
        k = send_events(settings, _events("C", 10))
        wait_until(lambda: w.stats.processed >= k and w.committed(), timeout=60, message=lambda: str(w.stats))
        assert rt.names() == ["main", "side"] and not rt.suspended()
    rt.close()
    sides = _keys(settings, side, "side")
    assert (sides if guarantee == "exactly-once" else sorted(set(sides))) == sorted(f"C{i}" for i in range(10))
    assert len(read_table(settings)) == n + m + k


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_a_handler_emitting_to_the_deleted_topic_of_a_listener_has_its_events_dead_lettered(
        settings: Settings, topics: Any, guarantee: str) -> None:
    """The same deleted topic is a listener's output and where a handler emits (no automatic
    topic creation, as on a production cluster). The listener is suspended; the events whose
    handler emits there are dead-lettered as ``output-refused`` (their output cannot be
    written), the others applied. (A refusal there answered for the suspended listener for
    ever, and the worker replayed its transaction for ever.)"""
    settings = settings.model_copy(update={"librdkafka": {
        "allow.auto.create.topics": "false", "topic.metadata.propagation.max.ms": "1000"}})
    admin = AdminClient(settings.kafka_config())
    shared = f"{settings.input_topic}.shared"
    for future in admin.create_topics([NewTopic(shared, 3, 1)]).values():
        future.result(30)
    app = App("emits-to-a-listener-topic")

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        state.put("reservation", event.value)
        if event.value["customer_id"] == "emits":
            state.emit(shared, event.key, b"emitted")

    def events(prefix: str, emitting: set[int], n: int) -> list[tuple[str, dict[str, Any], str]]:
        return [("reservation", reservation(f"{prefix}{i}", f"F{i}", 1, customer="emits" if i in emitting else "c"),
                 "upsert") for i in range(n)]

    rt = ListenerRuntime(settings)
    with WorkerThread(settings, app, worker_id="w-emit", listeners=rt, guarantee=guarantee) as w:
        register(settings, ListenerSpec(name="side", filter="true", output_topic=shared))
        wait_until(lambda: rt.names() == ["side"], message=lambda: str(rt.names()))
        n = send_events(settings, events("A", {0, 1}, 6))
        wait_until(lambda: w.stats.processed >= n and w.committed(), timeout=60, message=lambda: str(w.stats))
        for future in admin.delete_topics([shared]).values():
            future.result(30)
        m = send_events(settings, events("B", {1, 4}, 6))
        wait_until(lambda: w.stats.processed + w.stats.dead_lettered >= n + m and w.committed(),
                   timeout=240, message=lambda: f"suspended {rt.suspended()} {w.stats}")
        assert "side" in rt.suspended() and w.thread.is_alive()
    rt.close()
    assert dict(w.stats.dead_letter_reasons) == {"output-refused": 2}
    dead = sorted(d["key"] for d in read_dlq(settings) if d["reason"] == "output-refused")
    assert (dead if guarantee == "exactly-once" else sorted(set(dead))) == [b"F1", b"F4"]  # at least once
    table = {k for k, (_v, rec) in read_table(settings).items() if rec is not None}
    applied = {f"reservation/A{i}" for i in range(6)} | {f"reservation/B{i}" for i in (0, 2, 3, 5)}
    if guarantee == "exactly-once":
        assert table == applied
    else:  # no transaction takes back what a refused batch delivered (README, "at-least-once")
        assert applied <= table <= applied | {"reservation/B1", "reservation/B4"}


def test_a_topic_deleted_while_a_snapshot_is_sent_to_it_suspends_its_listener(settings: Settings,
                                                                              topics: Any) -> None:
    """Exactly-once, the output topic of an include-current-state listener deleted while its
    snapshot is being sent: librdkafka retries the records in flight to it until they time
    out, and the commit fails with a time-out, not a refusal. The listeners' topics are looked
    up then, and the listener is suspended after that one abort. (Before, the worker replayed
    for minutes, committing nothing, until its producer was fenced.)"""
    settings = settings.model_copy(update={"librdkafka": {"allow.auto.create.topics": "false"}})
    admin = AdminClient(settings.kafka_config())
    side = f"{settings.input_topic}.side"
    for future in admin.create_topics([NewTopic(side, 3, 1)]).values():
        future.result(30)
    rt = ListenerRuntime(settings, snapshot_batch=200)
    with WorkerThread(settings, worker_id="w-snap", listeners=rt) as w:
        register(settings, ListenerSpec(name="main", filter="true"))
        wait_until(lambda: rt.names() == ["main"])
        n = send_events(settings, _events("E", 3000))
        wait_until(lambda: w.stats.processed >= n and w.committed(), timeout=120, message=lambda: str(w.stats))
        register(settings, ListenerSpec(name="side", filter="true", output_topic=side, include_current_state=True))
        wait_until(lambda: rt.snapshot_sent > 200, timeout=60, interval=0.01, message="no snapshot sent")
        for future in admin.delete_topics([side]).values():
            future.result(30)
        m = send_events(settings, _events("B", 50))
        wait_until(lambda: "side" in rt.suspended() and w.committed() and len(read_table(settings)) == n + m,
                   timeout=180, message=lambda: f"suspended {rt.suspended()} {w.stats}")
        assert rt.names() == ["main"] and rt.snapshot_pending() == []
        assert w.stats.dead_lettered == 0 and read_dlq(settings) == []
    rt.close()
    assert _keys(settings, settings.listener_output_topic, "main") == sorted(
        [f"E{i}" for i in range(3000)] + [f"B{i}" for i in range(50)])
