"""The query API against real Kafka with several workers: answers equal the table, routing
through the entity directory and "moved" answers, the CLI, bad requests."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from kafka_fixtures import wait_until
from worker_support import CATALOG, WorkerThread, read_table, reservation, wait_accounted

from fifolane.cli import cli
from fifolane.client import StateClient, member_urls
from fifolane.config import Settings
from fifolane.partitioner import PARTITIONER, partition_for
from fifolane.serde import make_codec

pytestmark = pytest.mark.integration


def send_events(settings: Settings, events: list[tuple[str, dict[str, Any], str]]) -> int:
    """Send ``(type, record, op)`` events keyed by group, partitioned like ``fifolane produce``
    and Java clients (murmur2), which the query routing relies on."""
    codec = make_codec(settings, CATALOG)
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all",
                                                 "linger.ms": 5, "partitioner": PARTITIONER}))
    for type_name, record, op in events:
        et = CATALOG.entity(type_name)
        group = str(et.group_of(record))
        value = (codec.encode_delete(type_name, et.key_of(record), group, int(et.version_of(record)))
                 if op == "delete" else codec.encode(type_name, record))
        producer.produce(settings.input_topic, value, group.encode())
    assert producer.flush(30) == 0
    return len(events)


def _events(n_flights: int = 6, per_flight: int = 10) -> list[tuple[str, dict[str, Any], str]]:
    events = []
    for f in range(n_flights):
        for r in range(per_flight):
            rid = f"R{f}-{r}"
            events.append(("reservation", reservation(rid, f"F{f}", 1, seats=1), "upsert"))
            events.append(("reservation", reservation(rid, f"F{f}", 2, seats=r + 1), "upsert"))
            if r % 5 == 0:
                events.append(("reservation", reservation(rid, f"F{f}", 3), "delete"))
    return events


def _table_of(settings: Settings, n: int) -> dict[str, Any] | None:
    table = read_table(settings)
    return table if len(table) == n else None


def _serving(workers: list[WorkerThread], partitions: int) -> bool:
    """Every worker's roster knows an owner with an address for every partition."""
    for w in workers:
        r = w.worker.query.routing()  # type: ignore[union-attr]
        if len([p for p in range(partitions) if (o := r.owner(p)) is not None and o.url]) < partitions:
            return False
    return True


def test_answers_equal_the_table_across_three_workers(settings: Settings, topics: Any) -> None:
    n = send_events(settings, _events())
    workers = [WorkerThread(settings, worker_id=f"q{i}", query_port=0, concurrency=4) for i in range(3)]
    for w in workers:
        w.__enter__()
    try:
        wait_accounted(workers, n, timeout=90)
        wait_until(lambda: _serving(workers, settings.partitions), timeout=30, message="routing known")
        # (Transaction markers are written after the commit returns: wait for them.)
        table = wait_until(lambda: _table_of(settings, 60), timeout=30, message="the state topic holds every entity")
        urls = member_urls(settings)
        assert len(urls) == 3
        with StateClient(urls[:1]) as client:
            # The directory learns of new entities after their partition committed: wait for it.
            live = [k.partition("/")[2] for k, (_v, rec) in table.items() if rec is not None]
            wait_until(lambda: all(client.get("reservation", k) is not None for k in live), timeout=30,
                       message="every live entity found")
            for key, (version, record) in sorted(table.items()):
                type_name, _, k = key.partition("/")
                got = client.get(type_name, k)
                if record is None:
                    assert got is None, key
                    continue
                assert got.version == version and got.value == record, key
                assert got.group == record["flight_number"]
                assert got.owner is not None and got.owner.worker in {"q0", "q1", "q2"}
            # Answers routed through other workers were "moved" and retried there.
            assert client.retries["moved"] > 0
            # A group scan gives exactly the group's live entities.
            for f in range(6):
                want = {k.partition("/")[2]: rec for k, (_v, rec) in table.items()
                        if rec is not None and rec["flight_number"] == f"F{f}"}
                got_scan = {e.key: e.value for e in client.scan(f"F{f}")}
                assert got_scan == want
                paged = [e.key for e in client.scan(f"F{f}", page=3)]
                assert paged == sorted(want)
                pref = {e.key for e in client.scan(f"F{f}", type_name="reservation", prefix=f"R{f}-1")}
                assert pref == {k for k in want if k.startswith(f"R{f}-1")}

        # The raw API: a worker that does not own the partition answers 421 moved, naming the owner.
        group = "F2"
        any_owner = workers[0].worker.query.routing()  # type: ignore[union-attr]
        p = partition_for(group.encode(), settings.partitions)
        owner = any_owner.owner(p)
        assert owner is not None
        other = next(u for u in urls if u != owner.url)
        r = httpx.get(f"{other}/v1/entities/reservation/R2-1", params={"group": group})
        assert r.status_code == 421
        assert r.json()["status"] == "moved" and r.json()["owner"] == {"worker": owner.worker, "url": owner.url}
        r = httpx.get(f"{owner.url}/v1/entities/reservation/R2-1", params={"group": group})
        assert r.status_code == 200
        body = r.json()
        assert body["partition"] == p and body["version"] == 2 and body["position"] > 0
        r = httpx.get(f"{owner.url}/v1/entities/nosuchtype/x")
        assert r.status_code == 400 and "unknown entity type 'nosuchtype'" in r.json()["error"]
        r = httpx.get(f"{owner.url}/v1/groups/{group}", params={"limit": "many"})
        assert r.status_code == 400 and r.json()["error"] == "limit must be an integer, got 'many'"

        # The CLI, against one address.
        res = CliRunner().invoke(cli, ["get", "reservation", "R3-2", "--json", "--url", urls[0]])
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert out["version"] == 2 and out["value"] == table["reservation/R3-2"][1]
        res = CliRunner().invoke(cli, ["get", "reservation", "R3-0", "--url", urls[0]])
        assert res.exit_code == 1 and "reservation R3-0: not found" in res.output
        res = CliRunner().invoke(cli, ["get", "reservation", "R3-0", "--json", "--url", urls[0]])
        assert res.exit_code == 1
        out = json.loads(res.output)  # a deleted entity: where it was, its last version and group
        assert (out["status"], out["deleted"], out["group"], out["version"]) == (
            "not_found", True, "F3", table["reservation/R3-0"][0])
        assert out["partition"] == partition_for(b"F3", settings.partitions) and out["position"] > 0
        res = CliRunner().invoke(cli, ["scan", "--group", "F4", "--json", "--url", urls[1]])
        assert res.exit_code == 0, res.output
        lines = [json.loads(line) for line in res.output.splitlines()]
        assert {x["key"] for x in lines} == {f"R4-{r}" for r in range(10) if r % 5}
    finally:
        for w in workers:
            w.stop()

