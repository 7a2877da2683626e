"""A partition that comes back to a worker whose store is older than the changelog's memory
of deletes (#12 item 13).

Worker A owns the partitions and creates entity E. Worker B takes them over and deletes E.
Compaction then removes the tombstone (``delete.retention.ms`` passed). When A gets the
partitions back, replaying the changelog from A's old position shows nothing about E: A's
store would still have E alive. A store last written longer ago than half the tombstone
retention is rebuilt from the changelog instead, so E is gone for A too (here: an app
handler reading E through ``GroupState.get``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from kafka_fixtures import consume_all, wait_until
from worker_support import CATALOG, WorkerThread, reservation, send_events

from fifolane.config import Settings
from fifolane.serde import make_codec
from fifolane.topics import create_topic, ensure_topics
from services.worker import App, Event, GroupState

pytestmark = pytest.mark.integration


def _app(out_topic: str) -> App:
    app = App("returning")

    @app.handler("reservation", inline=True)
    def handle(event: Event, state: GroupState) -> None:
        if event.key == "PROBE":  # what this worker's store says of E
            state.emit(out_topic, "probe", json.dumps({"E": state.get("reservation", "E")}).encode())
        if event.value is None:
            state.delete("reservation", event.key, event.version)
        else:
            state.put("reservation", event.value)

    return app


def _compact_away(settings: Settings, key: bytes) -> None:
    """Roll segments (writing filler records to the state topic) until compaction has removed
    every record of ``key``, its tombstone included."""
    codec = make_codec(settings, CATALOG)
    producer = Producer(settings.kafka_config())
    n = [0]

    def gone() -> bool:
        for _ in range(20):
            n[0] += 1
            rid = f"filler{n[0] % 50}"
            producer.produce(settings.state_topic, codec.encode("reservation", reservation(rid, "F1", n[0])),
                             f"reservation/{rid}".encode(), partition=0)
        producer.flush(10)
        return all(m.key() != key for m in consume_all(settings, settings.state_topic))

    wait_until(gone, timeout=120, interval=0.3, message=f"compaction to remove {key!r}")


def test_a_store_older_than_the_tombstones_memory_is_rebuilt(tmp_path: Path, kafka_bootstrap: str) -> None:
    from kafka_fixtures import make_settings

    settings = make_settings(kafka_bootstrap, home=tmp_path / "home", partitions=1)
    ensure_topics(settings, 1, history_window_ms=0)
    admin = AdminClient(settings.kafka_config())
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in {
        "delete.retention.ms": "1000", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"}.items()]
    res = ConfigResource(ResourceType.TOPIC, settings.state_topic, incremental_configs=entries)
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)
    out = f"{settings.input_topic}.probe"
    create_topic(settings, out, 1, {})
    app = _app(out)

    def probes() -> list[Any]:
        return [json.loads(m.value())["E"] for m in consume_all(settings, out)]

    with WorkerThread(settings, app, worker_id="a", state_dir=tmp_path / "a") as a:
        send_events(settings, [("reservation", reservation("E", "F1", 1), "upsert"),
                               ("reservation", reservation("PROBE", "F1", 1), "upsert")])
        wait_until(lambda: a.stats.processed == 2 and a.committed(), timeout=30)
    [first] = probes()
    assert first["reservation_id"] == "E"  # E lives in F1, as the probe sees it
    with WorkerThread(settings, app, worker_id="b", state_dir=tmp_path / "b") as b:
        send_events(settings, [("reservation", reservation("E", "F1", 3), "delete")])
        wait_until(lambda: b.stats.processed == 1 and b.committed(), timeout=30)
    _compact_away(settings, b"reservation/E")
    with WorkerThread(settings, app, worker_id="a", state_dir=tmp_path / "a") as a:
        send_events(settings, [("reservation", reservation("PROBE", "F1", 2), "upsert")])
        wait_until(lambda: a.stats.processed == 1 and a.committed(), timeout=60)
    assert probes()[1:] == [None], "worker a's store resurrected the deleted entity"
