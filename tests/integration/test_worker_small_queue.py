"""A producer queue that is often full loses and reorders nothing (real Kafka).

The worker sends state records and notifications with the client's own produce and, when
librdkafka refuses one because its local queue is full (BufferError), produces it again
through the producer that waits for room. With ``queue.buffering.max.messages`` set to 20
(a user's FIFOLANE_LIBRDKAFKA tuning), nearly every batch fills the queue.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka_fixtures import consume_all, wait_until
from worker_support import WorkerThread, reservation, send_events

from fifolane.config import Settings
from fifolane.serde import SchemaCatalog, make_codec
from listeners.model import ListenerSpec
from listeners.registry import ensure_output_topic, ensure_registry_topic
from listeners.runtime import ListenerRuntime

pytestmark = pytest.mark.integration

KEYS, VERSIONS = 300, 5


def test_a_full_producer_queue_loses_and_reorders_nothing(settings: Settings, topics: dict[str, Any]) -> None:
    small = settings.model_copy(update={"librdkafka": {**settings.librdkafka,
                                                      "queue.buffering.max.messages": "20"}})
    ensure_registry_topic(small)
    ensure_output_topic(small, small.listener_output_topic)
    spec = ListenerSpec(name="all", type="reservation", filter="value.seats > 0")
    producer = Producer(small.kafka_config(**{"enable.idempotence": True, "acks": "all"}))
    producer.produce(small.registry_topic, spec.to_json(), spec.name.encode())
    assert producer.flush(30) == 0
    rt = ListenerRuntime(small)
    wt = WorkerThread(small, worker_id="smallq", listeners=rt)
    with wt:
        wait_until(lambda: rt.names() == ["all"], timeout=60, message="listener active")
        # Versions 1..5 of 300 reservations on 8 flights; version 3 arrives twice (stale).
        events = [("reservation", reservation(f"R{k}", f"F{k % 8}", v, seats=v), "upsert")
                  for v in [1, 2, 3, 3, 4, 5] for k in range(KEYS)]  # fmt: skip
        send_events(small, events)
        wait_until(lambda: wt.stats.processed + wt.stats.superseded >= len(events), timeout=120,
                   message=lambda: f"{wt.stats.processed} processed, {wt.stats.superseded} superseded")
        wait_until(wt.committed, timeout=60, message="committed")
        assert wt.worker.ckpt is not None and wt.worker.ckpt.producer.queue_full > 0  # the path ran
    assert (wt.stats.processed, wt.stats.superseded, wt.stats.dead_lettered) == (KEYS * VERSIONS, KEYS, 0)
    codec = make_codec(small, SchemaCatalog.load())
    state: dict[bytes, list[int]] = defaultdict(list)
    for m in consume_all(small, small.state_topic):
        state[m.key()].append(codec.decode(m.value()).record["version"])
    versions: dict[str, list[int]] = defaultdict(list)
    for m in consume_all(small, small.listener_output_topic):
        note = json.loads(m.value())
        versions[note["key"]].append(note["version"])
    # every state record once per applied version, every notification once, in version order
    assert state == {f"reservation/R{k}".encode(): [1, 2, 3, 4, 5] for k in range(KEYS)}
    assert versions == {f"R{k}": [1, 2, 3, 4, 5] for k in range(KEYS)}
