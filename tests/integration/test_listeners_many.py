"""Thousands of equality listeners registered through the registry topic, on a real worker.

Regression: with 10,000 listeners a worker committed nothing within 90 s (a broker metadata
lookup and an O(listeners) recomputation per activated listener). The registrations are
written before the worker starts, as in the benchmark, so they are applied at assignment.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka_fixtures import consume_all, wait_until
from worker_support import WorkerThread, reservation, send_events

from fifolane.config import Settings
from listeners.model import ListenerSpec
from listeners.registry import ensure_output_topic, ensure_registry_topic
from listeners.runtime import ListenerRuntime

pytestmark = pytest.mark.integration

N = 3000


def _register_bulk(settings: Settings, specs: list[ListenerSpec]) -> None:
    ensure_registry_topic(settings)
    ensure_output_topic(settings, settings.listener_output_topic)
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all",
                                                 "linger.ms": 20}))  # fmt: skip
    for s in specs:
        producer.produce(settings.registry_topic, s.to_json(), s.name.encode())
        producer.poll(0)
    assert producer.flush(60) == 0


def test_thousands_of_equality_listeners(settings: Settings, topics: dict[str, Any]) -> None:
    specs = [ListenerSpec(name=f"c{i}", type="reservation", filter=f'value.customer_id == "c{i}"')
             for i in range(N)]  # fmt: skip
    _register_bulk(settings, specs)
    rt = ListenerRuntime(settings)
    wt = WorkerThread(settings, worker_id="many", listeners=rt)
    try:
        with wt:
            wait_until(lambda: len(rt.names()) == N, timeout=60,
                       message=lambda: f"{len(rt.names())} of {N} listeners active")  # fmt: skip
            events: list[tuple[str, dict[str, Any], str]] = []
            for i in range(40):  # created, for c0..c39 (ids spread over the range)
                events.append(("reservation", reservation(f"R{i}", f"F{i % 7}", 1,
                                                          customer=f"c{i * 73}"), "upsert"))  # fmt: skip
            for i in range(10):  # leave the view: another customer nobody listens to
                events.append(("reservation", reservation(f"R{i}", f"F{i % 7}", 2,
                                                          customer="nobody"), "upsert"))  # fmt: skip
            for i in range(10, 20):  # stay in the view
                events.append(("reservation", reservation(f"R{i}", f"F{i % 7}", 2, amount=5.0,
                                                          customer=f"c{i * 73}"), "upsert"))  # fmt: skip
            for i in range(20, 25):  # deleted
                events.append(("reservation", reservation(f"R{i}", f"F{i % 7}", 2,
                                                          customer=f"c{i * 73}"), "delete"))  # fmt: skip
            events.append(("reservation", reservation("X1", "F1", 1, customer="z"), "upsert"))
            send_events(settings, events)
            expected = Counter({(f"c{i * 73}", f"R{i}", "created"): 1 for i in range(40)})
            expected.update({(f"c{i * 73}", f"R{i}", "removed"): 1 for i in range(10)})
            expected.update({(f"c{i * 73}", f"R{i}", "modified"): 1 for i in range(10, 20)})
            expected.update({(f"c{i * 73}", f"R{i}", "removed"): 1 for i in range(20, 25)})
            total = sum(expected.values())

            def notes() -> list[dict[str, Any]]:
                msgs = consume_all(settings, settings.listener_output_topic)
                return [json.loads(m.value()) for m in msgs]

            got = wait_until(lambda: (n := notes()) and len(n) >= total and n, timeout=60,
                             message=lambda: f"notifications: {len(notes())} of {total}")  # fmt: skip
            wait_until(lambda: wt.worker.stats.processed >= len(events), timeout=30,
                       message="events processed")  # fmt: skip
            got = notes()
            assert Counter((d["listener"], d["key"], d["kind"]) for d in got) == expected
            assert len(got) == total
    finally:
        rt.close()
