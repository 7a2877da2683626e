"""Cluster listeners against real Kafka, with in-process workers: view semantics, order,
converters, run-time errors, late workers, removal, leases, invalid registrations, the CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from kafka_fixtures import consume_all, wait_until
from worker_support import WorkerThread, read_dlq, reservation, send_events

from fifolane.cli.listeners import listeners as listeners_cli
from fifolane.config import Settings
from listeners.client import ListenerClient
from listeners.model import ListenerSpec
from listeners.registry import ensure_registry_topic, list_listeners, register, remove
from listeners.runtime import ListenerRuntime
from listeners.seq import DELTA

pytestmark = pytest.mark.integration

BIG = "value.amount > 100.0"
PROJ = '{"id": value.reservation_id, "amount": value.amount}'


def _worker(settings: Settings, wid: str) -> tuple[WorkerThread, ListenerRuntime]:
    rt = ListenerRuntime(settings)
    wt = WorkerThread(settings, worker_id=wid, listeners=rt)
    return wt, rt


@pytest.fixture
def worker(settings: Settings, topics: dict[str, Any]) -> Iterator[tuple[WorkerThread, ListenerRuntime]]:
    wt, rt = _worker(settings, "w1")
    with wt:
        yield wt, rt
    rt.close()


def _notes(settings: Settings, name: str, n: int, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Exactly the first n notifications of ``name`` (and no more arriving within 1 s)."""
    got: list[dict[str, Any]] = []
    # spec given: removed listeners too (all of these use the default output topic)
    with ListenerClient(settings, name, from_beginning=True, spec=ListenerSpec(name=name)) as client:
        def more() -> bool:
            got.extend(client.poll(0.2))
            return len(got) >= n

        wait_until(more, timeout=timeout,
                   message=lambda: f"{len(got)} of {n} notifications: {got}")
        extra = client.poll(1.0)
        assert client.gaps == [] and client.duplicates == 0
    assert extra == []
    return got


def _brief(notes: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
    return [(n["key"], n["kind"], n["value"]) for n in notes]


def test_view_semantics_order_and_converter(settings: Settings, worker: Any) -> None:
    wt, rt = worker
    register(settings, ListenerSpec(name="big", filter=BIG, convert=PROJ))
    register(settings, ListenerSpec(name="all-raw", filter="true", kinds=("removed",)))
    wait_until(lambda: rt.names() == ["all-raw", "big"], message=lambda: str(rt.names()))
    send_events(settings, [
        ("reservation", reservation("R1", "F1", 1, amount=50.0), "upsert"),  # not in view
        ("reservation", reservation("R1", "F1", 2, amount=150.0), "upsert"),  # enters
        ("reservation", reservation("R1", "F1", 3, amount=200.0), "upsert"),  # stays
        ("reservation", reservation("R1", "F1", 2, amount=999.0), "upsert"),  # stale: no change
        ("reservation", reservation("R1", "F1", 4, amount=10.0), "upsert"),  # leaves
        ("reservation", reservation("R2", "F1", 1, amount=500.0), "upsert"),  # enters
        ("reservation", reservation("R2", "F1", 2, amount=500.0), "delete"),  # deleted
        ("reservation", reservation("R3", "F1", 1, amount=1.0), "delete"),  # absent: nothing
    ])  # fmt: skip
    notes = _notes(settings, "big", 5)
    assert _brief(notes) == [
        ("R1", "created", {"id": "R1", "amount": 150.0}),
        ("R1", "modified", {"id": "R1", "amount": 200.0}),
        ("R1", "removed", None),
        ("R2", "created", {"id": "R2", "amount": 500.0}),
        ("R2", "removed", None),
    ]
    assert [(n["table_change"], n["version"]) for n in notes] == [
        ("modified", 2), ("modified", 3), ("modified", 4), ("created", 1), ("removed", 2),
    ]  # fmt: skip
    assert all(n["type"] == "reservation" and n["listener"] == "big" for n in notes)
    seqs = [n["seq"] for n in notes]  # one source partition (group F1), one stable run
    assert seqs == list(range(seqs[0], seqs[0] + 5)) and seqs[0] % DELTA == 0
    # The unconverted removed-only listener: table deletes only (R1 leaves nothing: its row stays).
    raw = _notes(settings, "all-raw", 1)
    assert _brief(raw) == [("R2", "removed", None)]
    # Notifications are keyed like the state topic and sit in the source partition.
    msgs = consume_all(settings, settings.listener_output_topic)
    assert {m.key() for m in msgs} == {b"reservation/R1", b"reservation/R2"}
    assert {m.partition() for m in msgs} == {notes[0]["partition"]}
    assert rt.stats("big").errors == 0


def test_runtime_errors_are_counted_not_fatal(settings: Settings, worker: Any) -> None:
    wt, rt = worker
    register(settings, ListenerSpec(name="bad", filter="int(value.state) > 0"))
    register(settings, ListenerSpec(name="good", filter=BIG, convert=PROJ))
    wait_until(lambda: rt.names() == ["bad", "good"])
    send_events(settings, [
        ("reservation", reservation("R1", "F1", 1, amount=150.0), "upsert"),
        ("reservation", reservation("R1", "F1", 2, amount=160.0), "upsert"),
    ])  # fmt: skip
    assert _brief(_notes(settings, "good", 2)) == [
        ("R1", "created", {"id": "R1", "amount": 150.0}),
        ("R1", "modified", {"id": "R1", "amount": 160.0}),
    ]
    stats = rt.stats("bad")
    assert (stats.errors, stats.notifications) == (2, 0)  # one per change (the second fails on new and old)
    assert stats.last_error is not None and "int" in stats.last_error
    assert wt.thread.is_alive()


def test_late_worker_removal_and_lease_expiry(settings: Settings, topics: dict[str, Any]) -> None:
    register(settings, ListenerSpec(name="keep", filter=BIG, convert=PROJ))
    register(settings, ListenerSpec(name="gone", filter=BIG))
    wt, rt = _worker(settings, "late")  # started after the registrations
    with wt:
        wait_until(lambda: rt.names() == ["gone", "keep"], message=lambda: str(rt.names()))
        register(settings, ListenerSpec(name="leased", filter=BIG, lease=timedelta(seconds=4)))
        wait_until(lambda: "leased" in rt.names(), message=lambda: str(rt.names()))
        send_events(settings, [("reservation", reservation("R1", "F1", 1, amount=150.0), "upsert")])
        assert [n["key"] for n in _notes(settings, "leased", 1)] == ["R1"]
        assert [n["key"] for n in _notes(settings, "gone", 1)] == ["R1"]
        assert remove(settings, "gone") is True
        wait_until(lambda: "gone" not in rt.names())
        # The lease runs out (no client renews it): inactive at once on every worker, while
        # its registration stays (expired) until it is renewed or removed: a worker never
        # deletes a registration (its tombstone could land after a new one of that name).
        wait_until(lambda: rt.names() == ["keep"], timeout=20, message=lambda: str(rt.names()))
        assert rt.expired == 1
        listed = {s.name: s for s in list_listeners(settings)}
        assert sorted(listed) == ["keep", "leased"] and listed["leased"].is_expired()
        send_events(settings, [("reservation", reservation("R2", "F1", 1, amount=300.0), "upsert")])
        assert [n["key"] for n in _notes(settings, "keep", 2)] == ["R1", "R2"]
        assert [n["key"] for n in _notes(settings, "gone", 1)] == ["R1"]
        assert [n["key"] for n in _notes(settings, "leased", 1)] == ["R1"]
    rt.close()


def test_invalid_registration_is_dead_lettered(settings: Settings, worker: Any) -> None:
    wt, rt = worker
    ensure_registry_topic(settings)
    raw = json.dumps({"name": "broken", "filter": "value.amount >"}).encode()
    producer = Producer(settings.kafka_config())
    producer.produce(settings.registry_topic, raw, b"broken")
    assert producer.flush(10) == 0
    dlq = wait_until(lambda: read_dlq(settings), timeout=20)
    assert len(dlq) == 1
    assert (dlq[0]["key"], dlq[0]["value"], dlq[0]["reason"]) == (b"broken", raw, "invalid-listener")
    assert "position" in dlq[0]["error"] or "column" in dlq[0]["error"]
    assert wait_until(lambda: list_listeners(settings) == [] and rt.dead_lettered == 1)
    assert wt.thread.is_alive() and rt.names() == []


def test_cli_add_list_describe_remove(settings: Settings, topics: dict[str, Any],
                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    env = {"FIFOLANE_BOOTSTRAP_SERVERS": settings.resolved_bootstrap(),
           "FIFOLANE_INPUT_TOPIC": settings.input_topic,
           "FIFOLANE_REGISTRY_TOPIC": settings.registry_topic,
           "FIFOLANE_LISTENER_OUTPUT_TOPIC": settings.listener_output_topic}  # fmt: skip
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    runner = CliRunner()
    out_topic = settings.listener_output_topic + ".big"
    res = runner.invoke(listeners_cli, ["add", "big", "--filter", BIG, "--convert", PROJ,
                                        "--output", out_topic, "--lease", "1h"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert len(consume_all(settings, out_topic)) == 0  # created (the same partitions as input)
    res = runner.invoke(listeners_cli, ["add", "big", "--filter", "true"])
    assert res.exit_code == 2 and "already exists" in res.output
    res = runner.invoke(listeners_cli, ["add", "big", "--filter", BIG, "--convert", PROJ,
                                        "--output", out_topic, "--lease", "1h"])  # fmt: skip
    assert res.exit_code == 0 and "same definition" in res.output
    res = runner.invoke(listeners_cli, ["list", "--json"])
    rows = [json.loads(line) for line in res.output.splitlines()]
    assert [(r["name"], r["filter"], r["lease"], r["expired"]) for r in rows] == [("big", BIG, "1h", False)]
    assert rows[0]["expires_at"] is not None
    res = runner.invoke(listeners_cli, ["describe", "big", "--json"])
    assert json.loads(res.output)["output_topic"] == out_topic
    res = runner.invoke(listeners_cli, ["add", "big", "--filter", "true", "--replace"])
    assert res.exit_code == 0
    assert [s.filter for s in list_listeners(settings)] == ["true"]
    assert runner.invoke(listeners_cli, ["remove", "big"]).exit_code == 0
    assert list_listeners(settings) == []
    res = runner.invoke(listeners_cli, ["remove", "big"])
    assert res.exit_code == 2 and "unknown listener 'big'" in res.output


def test_cli_refuses_invalid_expressions_with_position() -> None:
    runner = CliRunner()
    res = runner.invoke(listeners_cli, ["add", "x", "--filter", "value.amount >"])
    assert res.exit_code == 2
    lines = res.output.splitlines()
    assert lines[0].startswith("error: invalid filter")
    assert lines[1:] == ["  value.amount >", "  " + " " * 14 + "^"]
    res = runner.invoke(listeners_cli, ["add", "x", "--filter", "true", "--convert", "{'a': nope}"])
    assert res.exit_code == 2 and res.output.startswith("error: invalid converter")
    assert res.output.splitlines()[-1].index("^") - 2 == "{'a': nope}".index("nope")
