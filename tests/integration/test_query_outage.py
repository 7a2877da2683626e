"""Reads after a broker outage (a Kafka of its own, stopped until the worker loses its
partitions, then started again): an entity produced afterwards is read with its exact
content, and the partitions' positions move on. Before the fix the worker's admin client
kept the partition's old leader epoch (FENCED_LEADER_EPOCH for good), no position was learned
again, and reads answered "not found" from the views of before the outage."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka_fixtures import make_settings, start_local_cluster, wait_until
from test_query import send_events
from worker_support import WorkerProcess, reservation

from fifolane.client import StateClient, member_urls
from fifolane.partitioner import partition_for
from fifolane.topics import ensure_topics

pytestmark = pytest.mark.integration

GROUPS = ["F0", "F1", "F2", "F3", "F4", "F5"]


@pytest.fixture(scope="module")
def own_kafka() -> Iterator[Any]:
    """A one-broker Kafka of this module's own: stopping it stops no other test's."""
    kafka = start_local_cluster(1, tag="-outage")
    try:
        yield kafka
    finally:
        kafka.stop()


def _positions(url: str) -> dict[int, int]:
    body = httpx.get(url + "/v1/partitions", timeout=10).json()
    return {int(p): a["position"] for p, a in body["active"].items()}


def _all_active(url: str, partitions: int) -> dict[int, int] | None:
    got = _positions(url)
    return got if len(got) == partitions else None


def test_reads_after_the_broker_was_down_until_the_partitions_were_lost(own_kafka: Any, tmp_path: Path) -> None:
    settings = make_settings(own_kafka.bootstrap, home=tmp_path / "home")
    ensure_topics(settings)
    before = {g: reservation(f"R-{g}", g, 1, seats=2) for g in GROUPS}
    send_events(settings, [("reservation", r, "upsert") for r in before.values()])
    w = WorkerProcess(settings, "o1", tmp_path, extra=["--query-port", "0"])
    w.start()
    try:
        wait_until(lambda: len(member_urls(settings)) == 1, timeout=90, message="o1 serving")
        (url,) = member_urls(settings)
        client = StateClient.from_settings(settings, timeout=120)
        for g, r in before.items():
            got = wait_until(lambda g=g: client.get("reservation", f"R-{g}", group=g), timeout=60,
                             message=f"R-{g} readable")
            assert (got.version, got.value) == (1, r)
        old = wait_until(lambda: _all_active(url, settings.partitions), timeout=30,
                         message="every partition active")

        own_kafka.cluster.kill_broker(0, graceful=True)  # fifolane kafka down
        wait_until(lambda: "partitions lost" in w.log_file.read_text(errors="replace"), timeout=120,
                   message=lambda: f"the worker loses its partitions:\n{w.log_tail()}")
        own_kafka.cluster.start_broker(0)  # fifolane kafka up

        after = {g: reservation(f"Q-{g}", g, 1, seats=3, customer="c9") for g in GROUPS}
        send_events(settings, [("reservation", r, "upsert") for r in after.values()])
        for g, r in after.items():
            got = wait_until(lambda g=g: client.get("reservation", f"Q-{g}", group=g), timeout=180,
                             message=lambda g=g: f"Q-{g} readable after the outage:\n{w.log_tail()}")
            assert (got.type, got.key, got.group, got.version, got.value) == ("reservation", f"Q-{g}", g, 1, r)
            assert got.partition == partition_for(g.encode(), settings.partitions)
            assert got.position > old[got.partition]
        for g, r in before.items():  # and what was there before is still there
            got = client.get("reservation", f"R-{g}", group=g)
            assert got is not None and (got.version, got.value) == (1, r)
        now = _positions(url)
        touched = {partition_for(g.encode(), settings.partitions) for g in GROUPS}
        assert all(now[p] > old[p] for p in touched), (old, now)
        client.close()
        assert w.terminate() == 0
    finally:
        if w.alive():
            w.kill()
