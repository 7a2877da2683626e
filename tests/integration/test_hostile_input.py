"""Hostile input against real Kafka (#12 items 3, 6, 8, 10 and the housekeeper race):
derived records too large for Kafka, registry records that do not parse, listeners
registered again under the same name, an expression over its run-time budget. In every case
the worker stays up, loses nothing and says why."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from kafka_fixtures import consume_all, wait_until
from worker_support import WorkerThread, read_dlq, read_table, reservation, send_events

from fifolane.cli.listeners import listeners as listeners_cli
from fifolane.config import Settings
from listeners.client import ListenerClient
from listeners.model import ListenerSpec
from listeners.registry import ensure_registry_topic, list_listeners, register, remove, renew
from listeners.runtime import ListenerRuntime
from listeners.seq import DELTA

pytestmark = pytest.mark.integration


def _raw(settings: Settings, key: bytes, value: bytes | None, topic: str | None = None) -> None:
    producer = Producer(settings.kafka_config(**{"message.max.bytes": 2_000_000}))
    producer.produce(topic or settings.input_topic, value, key)
    assert producer.flush(30) == 0


def _cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"FIFOLANE_BOOTSTRAP_SERVERS": settings.resolved_bootstrap(),
                 "FIFOLANE_INPUT_TOPIC": settings.input_topic,
                 "FIFOLANE_REGISTRY_TOPIC": settings.registry_topic,
                 "FIFOLANE_LISTENER_OUTPUT_TOPIC": settings.listener_output_topic}.items():
        monkeypatch.setenv(k, v)


def test_derived_records_too_large_for_kafka_do_not_stall(settings: Settings, topics: Any) -> None:
    """#12 item 3: a 999,000-byte input value that is not Avro (its dead-letter copy, with
    headers, would be over the limit) and a reservation whose customer_id is 200,000 control
    characters with a catch-all listener (its notification JSON takes 6 bytes a character):
    the copy is cut to fit and says so, the notification becomes a small one that carries
    the error, each input is counted once and the stream flows on."""
    register(settings, ListenerSpec(name="all", filter="true"))
    rt = ListenerRuntime(settings)
    with WorkerThread(settings, listeners=rt) as wt:
        wait_until(lambda: rt.names() == ["all"], message=lambda: str(rt.names()))
        _raw(settings, b"F1", b"\x00" + b"x" * 999_899)
        send_events(settings, [
            ("reservation", reservation("R1", "F1", 1, customer="\x01" * 200_000), "upsert"),
            ("reservation", reservation("R2", "F1", 1), "upsert"),
        ])  # fmt: skip
        wait_until(lambda: (wt.stats.processed, wt.stats.dead_lettered) == (2, 1) and wt.committed(),
                   timeout=60, message=lambda: str(wt.stats))
        assert wt.thread.is_alive() and wt.stats.aborts == 0
    rt.close()
    [dead] = read_dlq(settings)
    assert dead["reason"] == "undecodable" and dead["truncated"] == "value"
    assert int(dead["original-size"]) > 999_900 and len(dead["value"]) < 999_900
    assert dead["value"] == (b"\x00" + b"x" * 999_899)[: len(dead["value"])]
    assert sorted(read_table(settings)) == ["reservation/R1", "reservation/R2"]
    notes = {json.loads(m.value())["key"]: json.loads(m.value())
             for m in consume_all(settings, settings.listener_output_topic)}
    assert notes["R1"]["error"] == "too-large" and notes["R1"]["value"] is None
    assert notes["R1"]["kind"] == "created" and notes["R1"]["size"] > 1_000_000
    assert notes["R2"]["value"]["reservation_id"] == "R2" and "error" not in notes["R2"]


def test_registry_records_that_do_not_parse_never_stop_a_worker(settings: Settings, topics: Any) -> None:
    """#12 item 6: records another client (or another fifolane version) wrote: a lease of
    99999999999 days, a created_at far in the future, garbage. Each is an invalid
    registration, dead-lettered once (also after a restart), and the good listener works."""
    ensure_registry_topic(settings)
    register(settings, ListenerSpec(name="good", filter="true"))
    bad = {
        b"huge-lease": json.dumps({"name": "huge-lease", "filter": "true", "lease": "99999999999d"}).encode(),
        b"future": json.dumps({"name": "future", "filter": "true",
                               "created_at": "9999-12-31T23:59:59+00:00", "lease": "30d"}).encode(),
        b"garbage": b"\xff\xfe not json",
    }
    for key, value in bad.items():
        _raw(settings, key, value, settings.registry_topic)
    for run in range(2):  # the second worker run must not dead-letter them again
        runtime = ListenerRuntime(settings)
        with WorkerThread(settings, listeners=runtime, worker_id=f"w{run}") as wt:
            wait_until(lambda rt=runtime: rt.names() == ["good"] and len(read_dlq(settings)) == 3,
                       timeout=30, message=lambda rt=runtime: f"{rt.names()} {read_dlq(settings)}")
            send_events(settings, [("reservation", reservation(f"R{run}", "F1", 1), "upsert")])
            wait_until(lambda w=wt: w.stats.processed == 1 and w.committed(), timeout=30)
            assert wt.thread.is_alive()
        runtime.close()
    dlq = read_dlq(settings)
    assert sorted(d["key"] for d in dlq) == sorted(bad) and {d["reason"] for d in dlq} == {"invalid-listener"}
    assert [s.name for s in list_listeners(settings)] == ["good"]  # never deleted by a worker


def test_registering_again_is_a_new_stream(settings: Settings, topics: Any) -> None:
    """#12 item 8: removed and added again, replaced, or expired and renewed: the listener's
    numbers never repeat, so a following client drops none of the new notifications."""
    rt = ListenerRuntime(settings)
    register(settings, ListenerSpec(name="l", filter="true"))
    seen: list[dict[str, Any]] = []
    with WorkerThread(settings, listeners=rt), \
            ListenerClient(settings, "l", from_beginning=True, spec=ListenerSpec(name="l")) as client:

        def step(version: int) -> None:
            send_events(settings, [("reservation", reservation("R1", "F1", version), "upsert")])
            wait_until(lambda: seen.extend(client.poll(0.2)) or any(n["version"] == version for n in seen),
                       timeout=30, message=lambda: f"v{version} not delivered: {seen}")

        wait_until(lambda: rt.names() == ["l"])
        step(1)
        assert remove(settings, "l")
        wait_until(lambda: rt.names() == [])
        register(settings, ListenerSpec(name="l", filter="true"))  # the same definition, again
        wait_until(lambda: rt.names() == ["l"])
        step(2)
        register(settings, ListenerSpec(name="l", filter="value.version > 0"), replace=True)
        wait_until(lambda: rt.stats("l") is not None and len({n["registration"] for n in seen}) >= 2)
        step(3)
        leased = register(settings, ListenerSpec(name="l", filter="value.version > 0", lease=timedelta(seconds=2)),
                          replace=True)
        step(4)
        wait_until(lambda: rt.names() == [], timeout=20)  # the lease ran out
        renew(settings, leased)  # renewed after it expired
        wait_until(lambda: rt.names() == ["l"])
        step(5)
        assert client.duplicates == 0 and client.gaps == []
    rt.close()
    assert [n["version"] for n in seen] == [1, 2, 3, 4, 5]
    seqs = [n["seq"] for n in seen]
    assert all(b - a >= DELTA for a, b in zip(seqs, seqs[1:], strict=False)), seqs
    assert len({n["registration"] for n in seen}) == 4  # the renewal keeps its registration


def test_expression_over_its_budget_is_suspended_and_said(settings: Settings, topics: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """#12 item 10 (run time): a listener whose evaluation overruns its per-change budget is
    suspended on that worker, the reason is shown by `listeners describe`, and the worker and
    the other listeners go on. (A budget of 0 s makes any CEL evaluation overrun.)"""
    rt = ListenerRuntime(settings, budget=0.0)
    register(settings, ListenerSpec(name="slow", filter='size(value.customer_id) > 0'))
    register(settings, ListenerSpec(name="fast", filter='value.flight_number == "F1"'))  # native
    with WorkerThread(settings, listeners=rt, worker_id="w-budget") as wt:
        wait_until(lambda: rt.names() == ["fast", "slow"])
        send_events(settings, [("reservation", reservation(f"R{i}", "F1", 1), "upsert") for i in range(3)])
        wait_until(lambda: wt.stats.processed == 3 and wt.committed() and "slow" in rt.suspended(),
                   timeout=30, message=lambda: f"{rt.suspended()} {wt.stats}")
        assert rt.names() == ["fast"] and wt.thread.is_alive()
        _cli_env(settings, monkeypatch)
        def described() -> str | None:
            out = CliRunner().invoke(listeners_cli, ["describe", "slow"]).output
            return out if "suspended" in out and "w-budget" in out else None

        assert "over the budget" in wait_until(described, timeout=20)
    rt.close()
    keys = sorted(json.loads(m.value())["listener"] for m in consume_all(settings, settings.listener_output_topic))
    assert keys.count("fast") == 3


def test_expired_lease_and_a_new_registration_of_the_name(settings: Settings, topics: Any) -> None:
    """Suspected in #12: the housekeeper's tombstone for an expired lease landing after the
    user registered the name again would delete the new registration. Workers write no
    tombstones: the new registration stays, and is delivered to."""
    rt = ListenerRuntime(settings, housekeeping_interval=0.05)
    with WorkerThread(settings, listeners=rt, worker_id="keeper") as wt:  # owns partition 0
        wait_until(lambda: wt.worker.assigned_partitions == [0, 1, 2])
        register(settings, ListenerSpec(name="l", filter="true", lease=timedelta(seconds=2)))
        wait_until(lambda: rt.names() == ["l"])
        wait_until(lambda: rt.names() == [] and rt.expired == 1, timeout=20)  # expired here
        register(settings, ListenerSpec(name="l", filter="true"), replace=True)  # right away
        wait_until(lambda: rt.names() == ["l"])
        with ListenerClient(settings, "l", from_beginning=True) as client:
            send_events(settings, [("reservation", reservation("R1", "F1", 1), "upsert")])
            got: list[dict[str, Any]] = []
            wait_until(lambda: got.extend(client.poll(0.2)) or got, timeout=30)
        assert wt.thread.is_alive() and rt.names() == ["l"]
    rt.close()
    [spec] = list_listeners(settings)
    assert spec.lease is None  # the new registration, not deleted
    assert [n["key"] for n in got] == ["R1"]
