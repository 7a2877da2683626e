"""Reads through scale-out, SIGKILL and scale-in (worker processes, real Kafka): no read
fails, no read goes back to an older version (monotonic reads with min_position), and once
the writes stop the answers equal the table. Also the bounded min_position wait."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka_fixtures import wait_until
from test_query import send_events
from worker_support import WorkerProcess, read_table, reservation

from fifolane.client import StateClient, member_urls
from fifolane.config import Settings
from fifolane.partitioner import partition_for
from fifolane.query import QueryError

pytestmark = pytest.mark.integration

KEYS = [(f"R{i}", f"F{i % 6}") for i in range(12)]


def _writer(settings: Settings, stop: threading.Event, versions: dict[str, int]) -> None:
    v = 1
    while not stop.is_set():
        v += 1
        send_events(settings, [("reservation", reservation(rid, flight, v, seats=v % 9 + 1), "upsert")
                               for rid, flight in KEYS])
        for rid, _f in KEYS:
            versions[rid] = v
        stop.wait(0.1)


def _reader(client: StateClient, stop: threading.Event, seen: list[tuple[str, int, int, int]],
            failures: list[str]) -> None:
    while not stop.is_set():
        for rid, flight in KEYS:
            try:
                e = client.get("reservation", rid, group=flight)
            except QueryError as exc:
                failures.append(f"{rid}: {exc}")
                continue
            if e is not None:
                seen.append((rid, e.version, e.partition, e.position))


def _table_at(settings: Settings, want: dict[str, int]) -> dict[str, Any] | None:
    table = read_table(settings)
    return table if {k.partition("/")[2]: v for k, (v, _r) in table.items()} == want else None


def _procs(settings: Settings, tmp: Path, ids: list[str]) -> list[WorkerProcess]:
    return [WorkerProcess(settings, wid, tmp, extra=["--query-port", "0", "--concurrency", "4"]) for wid in ids]


def test_reads_through_scale_out_sigkill_and_scale_in(settings: Settings, topics: Any, tmp_path: Path) -> None:
    versions: dict[str, int] = {}
    send_events(settings, [("reservation", reservation(rid, flight, 1), "upsert") for rid, flight in KEYS])
    w1, w2, w3 = _procs(settings, tmp_path, ["k1", "k2", "k3"])
    w1.start()
    try:
        wait_until(lambda: len(member_urls(settings)) == 1, timeout=60, message="k1 serving")
        client = StateClient.from_settings(settings, timeout=90)
        wait_until(lambda: client.get("reservation", "R0", group="F0") is not None, timeout=60)
        stop = threading.Event()
        seen: list[tuple[str, int, int, int]] = []
        failures: list[str] = []
        threads = [threading.Thread(target=_writer, args=(settings, stop, versions), daemon=True),
                   threading.Thread(target=_reader, args=(client, stop, seen, failures), daemon=True)]
        for t in threads:
            t.start()
        w2.start()  # scale out: partitions move to k2 while the reads go on
        wait_until(lambda: len(member_urls(settings)) == 2, timeout=60, message="k2 serving")
        n = len(seen)
        wait_until(lambda: len(seen) > n + 50, timeout=60, message="reads after scale-out")
        moved_before = client.retries["moved"]
        w1.kill()  # SIGKILL: its partitions are unavailable until the group notices
        n = len(seen)
        wait_until(lambda: len(seen) > n + 50, timeout=90, message="reads after the SIGKILL")
        w3.start()
        # (k1's address stays in the members topic: killed, it could not clear it.)
        wait_until(lambda: len(member_urls(settings)) == 3, timeout=60, message="k3 serving")
        n = len(seen)
        wait_until(lambda: len(seen) > n + 50, timeout=60, message="reads after the second scale-out")
        assert w2.terminate() == 0  # scale in: a clean leave, its partitions go to k3
        wait_until(lambda: len(member_urls(settings)) == 2, timeout=30, message="k2's address cleared")
        n = len(seen)
        wait_until(lambda: len(seen) > n + 50, timeout=90, message="reads after the scale-in")
        stop.set()
        for t in threads:
            t.join(30)
        assert failures == []
        assert client.retries["moved"] + client.retries["unavailable"] + client.retries["restoring"] > 0
        assert client.retries["moved"] >= moved_before
        # Monotonic reads: per key the versions never go down, per partition neither do positions.
        last_version: dict[str, int] = {}
        last_position: dict[int, int] = {}
        for rid, version, partition, position in seen:
            assert version >= last_version.get(rid, 0), f"{rid} went back from {last_version[rid]} to {version}"
            assert position >= last_position.get(partition, 0)
            last_version[rid] = version
            last_position[partition] = position
        # The writes stopped: the answers reach the table and equal it.
        want = {rid: versions[rid] for rid, _f in KEYS}
        table = wait_until(lambda: _table_at(settings, want), timeout=60,
                           message="the state topic holds the last versions")
        final = {k.partition("/")[2]: v for k, (v, _r) in table.items()}
        wait_until(lambda: all((e := client.get("reservation", rid, group=f)) is not None
                               and e.version == final[rid] for rid, f in KEYS), timeout=60,
                   message="reads reach the table")
        for rid, flight in KEYS:
            e = client.get("reservation", rid, group=flight)
            assert e is not None and e.value == table[f"reservation/{rid}"][1]
            assert e.partition == partition_for(flight.encode(), settings.partitions)
        client.close()
    finally:
        for w in (w1, w2, w3):
            if w.proc is not None and w.proc.poll() is None:
                w.kill()


def test_min_position_waits_with_a_bound(settings: Settings, topics: Any, tmp_path: Path) -> None:
    send_events(settings, [("reservation", reservation("R1", "F1", 1), "upsert")])
    (w,) = _procs(settings, tmp_path, ["m1"])
    w.start()
    try:
        wait_until(lambda: member_urls(settings), timeout=60, message="m1 serving")
        url = member_urls(settings)[0]
        path = f"{url}/v1/entities/reservation/R1"
        first = wait_until(lambda: (r := httpx.get(path, params={"group": "F1"})).status_code == 200 and r.json(),
                           timeout=60, message="R1 served")
        pos = first["position"]
        # Not reached within the bound: 504 timeout, after about the bound.
        t0 = time.monotonic()
        r = httpx.get(path, params={"group": "F1", "min_position": pos + 1, "wait_ms": 300})
        waited = time.monotonic() - t0
        assert r.status_code == 504
        assert r.json()["status"] == "timeout" and r.json()["position"] == pos and r.json()["min_position"] == pos + 1
        assert 0.3 <= waited < 3.0
        # Reached by a write during the wait: answered with the new version.
        result: dict[str, Any] = {}

        def ask() -> None:
            result["r"] = httpx.get(path, params={"group": "F1", "min_position": pos + 1, "wait_ms": 20_000},
                                    timeout=30)
        t = threading.Thread(target=ask)
        t.start()
        send_events(settings, [("reservation", reservation("R1", "F1", 2), "upsert")])
        t.join(30)
        body = result["r"].json()
        assert result["r"].status_code == 200 and body["version"] == 2 and body["position"] > pos
        # Without a wait: the answer at once, whatever the position.
        r = httpx.get(path, params={"group": "F1", "min_position": body["position"] + 10})
        assert r.status_code == 504 and r.json()["waited_ms"] == 0
    finally:
        w.terminate()


def test_no_read_from_a_half_restored_store(settings: Settings, topics: Any, tmp_path: Path) -> None:
    n = 30_000
    send_events(settings, [("reservation", reservation(f"R{i:05d}", "BIG", 1), "upsert") for i in range(n)]
                + [("reservation", reservation("LAST", "BIG", 1), "upsert")])
    a, b = _procs(settings, tmp_path, ["h1", "h2"])
    a.start()
    try:
        wait_until(lambda: member_urls(settings), timeout=60, message="h1 serving")
        with StateClient.from_settings(settings, timeout=120) as client:
            wait_until(lambda: client.get("reservation", "LAST", group="BIG") is not None, timeout=120,
                       message="h1 processed every event")
        assert a.terminate() == 0
        wait_until(lambda: not member_urls(settings), timeout=30, message="h1's address cleared")
        b.start()  # a new state dir: restores all n + 1 entities
        url = wait_until(lambda: member_urls(settings), timeout=60, message="h2 serving")[0]
        statuses: list[str] = []
        first_ok = None
        deadline = time.monotonic() + 120
        with httpx.Client() as http:
            while time.monotonic() < deadline:
                r = http.get(f"{url}/v1/entities/reservation/LAST", params={"group": "BIG"})
                body = r.json()
                if not statuses or statuses[-1] != body["status"]:
                    statuses.append(body["status"])
                if body["status"] == "restoring":
                    assert 0 <= body["progress"]["done"] <= body["progress"]["total"]
                if r.status_code == 200:
                    first_ok = body
                    count = sum(1 for _ in _scan(http, url, "BIG"))
                    break
        assert first_ok is not None and first_ok["version"] == 1, statuses
        assert "not_found" not in statuses
        assert "restoring" in statuses, statuses
        assert count == n + 1
    finally:
        for w in (a, b):
            if w.proc is not None and w.proc.poll() is None:
                w.kill()


def _scan(http: httpx.Client, url: str, group: str) -> Any:
    after = None
    while True:
        params = {"limit": 10_000, **({"after": after} if after else {})}
        body = http.get(f"{url}/v1/groups/{group}", params=params).json()
        assert body["status"] == "ok", body
        yield from body["entities"]
        after = body["next"]
        if after is None:
            return
