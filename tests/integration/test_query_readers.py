"""The query reader processes (``--query-readers``, services/worker/query/reader.py) against
real Kafka: key reads are answered by the reader with exactly the answer of the worker's own
endpoint; reads with min_position never go back while versions are written; a reader killed
is started again on the same address; a worker killed takes its reader with it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka_fixtures import wait_until
from test_query import send_events
from worker_support import WorkerProcess, WorkerThread, read_table, reservation, wait_accounted

from fifolane.client import member_urls
from fifolane.config import Settings
from fifolane.partitioner import partition_for

pytestmark = pytest.mark.integration

KEYS = [(f"R{i}", f"F{i % 5}") for i in range(20)]
READER = "X-Fifolane-Reader"


def _get(url: str, rid: str, flight: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{url}/v1/entities/reservation/{rid}", params={"group": flight, **params}, timeout=30)


def _table(settings: Settings) -> dict[str, Any] | None:
    table = read_table(settings)
    return table if len(table) == len(KEYS) else None


def _by_reader(url: str, deleted: tuple[str, ...] = ()) -> bool:
    """Every key is found (or found deleted) by the reader: its secondaries stand at views
    published after the keys were written."""
    for rid, f in KEYS:
        r = _get(url, rid, f)
        if r.headers.get(READER) != "reader" or r.status_code != (404 if rid in deleted else 200):
            return False
    return True


def test_the_reader_answers_as_the_worker_does(settings: Settings, topics: Any) -> None:
    n = send_events(settings, [("reservation", reservation(rid, f, v, seats=v), "upsert")
                               for v in (1, 2) for rid, f in KEYS]
                    + [("reservation", reservation("R3", "F3", 3), "delete")])
    with WorkerThread(settings, worker_id="r1", query_port=0, concurrency=4) as w:
        wait_accounted([w], n, timeout=90)
        query = w.worker.query
        url = wait_until(lambda: query.me.url, timeout=60, message="serving")
        upstream = f"http://127.0.0.1:{query.server.port}"  # the worker's own endpoint
        assert urlsplit(url).port != query.server.port
        wait_until(lambda: _by_reader(url, deleted=("R3",)), timeout=60, message="the reader answers every key")
        table = wait_until(lambda: _table(settings), timeout=30, message="the state topic holds every key")
        for rid, flight in KEYS:
            mine, theirs = _get(url, rid, flight), _get(upstream, rid, flight)
            assert mine.headers[READER] == "reader"
            assert (mine.status_code, mine.json()) == (theirs.status_code, theirs.json()), rid
            body = mine.json()
            version, record = table[f"reservation/{rid}"]
            assert body["version"] == version and body["partition"] == partition_for(flight.encode(), settings.partitions)
            if record is None:
                assert mine.status_code == 404 and body["deleted"] is True
            else:
                assert mine.status_code == 200 and body["value"] == record
                assert body["owner"] == {"worker": "r1", "url": url}
        # Not a key read, or one the reader cannot answer: the worker answers, unchanged.
        r = httpx.get(f"{url}/v1/groups/F1", params={"type": "reservation"})
        assert r.status_code == 200 and r.headers[READER] == "worker"
        assert sorted(e["key"] for e in r.json()["entities"]) == sorted(k for k, f in KEYS if f == "F1")
        r = _get(url, "R1", "F1", stale="true")
        assert r.status_code == 200 and r.headers[READER] == "worker" and r.json()["version"] == 2
        r = _get(url, "R1", "F1", min_position=10**9, wait_ms=100)
        assert r.status_code == 504 and r.headers[READER] == "worker"
        r = _get(url, "R1", "F1", partition="x")
        assert r.status_code == 400 and r.json()["error"] == "partition must be an integer, got 'x'"
        r = httpx.get(f"{url}/v1/entities/reservation/R1")  # no group: found through the directory
        assert r.status_code == 200 and r.headers[READER] == "worker" and r.json()["version"] == 2
        r = httpx.get(f"{url}/v1/routing")
        assert r.status_code == 200 and r.json()["me"] == {"worker": "r1", "url": url}


def test_reads_with_min_position_never_go_back_while_versions_are_written(settings: Settings, topics: Any) -> None:
    send_events(settings, [("reservation", reservation(rid, f, 1), "upsert") for rid, f in KEYS])
    stop = threading.Event()
    last = {"v": 1}

    def write() -> None:
        v = 1
        while not stop.is_set() and v < 30:
            v += 1
            send_events(settings, [("reservation", reservation(rid, f, v), "upsert") for rid, f in KEYS])
            last["v"] = v
            stop.wait(0.05)

    with WorkerThread(settings, worker_id="r2", query_port=0, concurrency=4, commit_interval=0.05) as w:
        url = wait_until(lambda: w.worker.query.me.url, timeout=60, message="serving")
        wait_until(lambda: _by_reader(url), timeout=60, message="the reader answers")
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        seen: dict[str, list[tuple[int, int, str]]] = {rid: [] for rid, _f in KEYS}
        positions: dict[str, int] = {}
        try:
            while writer.is_alive():
                for rid, f in KEYS:
                    params = {"min_position": positions[rid], "wait_ms": 5000} if rid in positions else {}
                    r = _get(url, rid, f, **params)
                    assert r.status_code == 200, r.text
                    body = r.json()
                    seen[rid].append((body["version"], body["position"], r.headers[READER]))
                    positions[rid] = body["position"]
        finally:
            stop.set()
            writer.join(30)
        served = [s for rows in seen.values() for _v, _p, s in rows]
        assert served.count("reader") > len(served) // 2  # the reader answered most of them
        for rid, rows in seen.items():
            versions = [v for v, _p, _s in rows]
            assert versions == sorted(versions), rid
            assert [p for _v, p, _s in rows] == sorted(p for _v, p, _s in rows), rid
        # Read-your-writes: once the last writes are committed, a read that passes the state
        # topic's end as min_position answers them (the reader, or the worker after a wait).
        wait_until(lambda: (t := read_table(settings)) and all(v == last["v"] for v, _r in t.values()),
                   timeout=60, message="the last versions committed")
        ends = _state_ends(settings)
        for rid, f in KEYS:
            p = partition_for(f.encode(), settings.partitions)
            r = _get(url, rid, f, wait_ms=10000, min_position=ends[p])
            assert r.status_code == 200 and r.json()["version"] == last["v"], r.text
            assert r.json()["position"] >= ends[p]


def _state_ends(settings: Settings) -> dict[int, int]:
    c = Consumer(settings.kafka_config(**{"group.id": "ends", "isolation.level": "read_committed"}))
    try:
        return {p: c.get_watermark_offsets(TopicPartition(settings.state_topic, p), timeout=10)[1]
                for p in range(settings.partitions)}
    finally:
        c.close()


def test_a_killed_reader_is_started_again_on_the_same_address(settings: Settings, topics: Any) -> None:
    n = send_events(settings, [("reservation", reservation(rid, f, 1), "upsert") for rid, f in KEYS])
    with WorkerThread(settings, worker_id="r3", query_port=0, concurrency=4) as w:
        wait_accounted([w], n, timeout=90)
        url = wait_until(lambda: w.worker.query.me.url, timeout=60, message="serving")
        wait_until(lambda: _by_reader(url), timeout=60, message="the reader answers")
        readers = w.worker.query.readers
        assert readers is not None
        old = readers._readers[0].proc
        os.kill(old.pid, signal.SIGKILL)
        old.wait(10)
        wait_until(lambda: readers._readers[0].proc is not old, timeout=30, message="a new reader")

        def answers() -> bool:
            try:
                return _by_reader(url)
            except httpx.HTTPError:
                return False
        wait_until(answers, timeout=60, message="the new reader answers every key, at the same address")
        assert w.worker.query.me.url == url
        for rid, f in KEYS:
            r = _get(url, rid, f)
            assert r.status_code == 200 and r.json()["version"] == 1


def test_a_killed_worker_takes_its_reader_with_it(settings: Settings, topics: Any, tmp_path: Path) -> None:
    send_events(settings, [("reservation", reservation(rid, f, 1), "upsert") for rid, f in KEYS])
    w = WorkerProcess(settings, "r4", tmp_path, extra=["--query-port", "0"]).start()
    try:
        url = wait_until(lambda: (u := member_urls(settings)) and u[0], timeout=60, message="r4 serving")
        wait_until(lambda: _by_reader(url), timeout=60, message="the reader answers")
        assert w.proc is not None
        children = subprocess.run(["pgrep", "-P", str(w.proc.pid)], capture_output=True, text=True).stdout.split()

        def admin_child(pid: str) -> bool:  # the roster's group describes (services/worker/group_admin.py)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return b"services.worker.group_admin" in f.read()

        readers = [pid for pid in children if not admin_child(pid)]
        assert len(readers) == 1, children
        w.kill()
        parts = urlsplit(url)

        def closed() -> bool:
            with socket.socket() as s:
                return s.connect_ex((parts.hostname or "127.0.0.1", parts.port or 0)) != 0
        wait_until(closed, timeout=20, message="the reader's port closed")
        wait_until(lambda: not os.path.exists(f"/proc/{readers[0]}"), timeout=20, message="the reader exited")
        # and the group admin child, whose input closed with the worker (after its open question)
        wait_until(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in children), timeout=30,
                   message="the group admin child exited")
    finally:
        if w.proc is not None and w.proc.poll() is None:
            w.kill()
