"""The flights pipeline end to end on the secured broker, each component under its own
principal with its role's ACLs and nothing else: a producer, two workers, a listener admin
registering, a listener reader following (and renewing its lease), Spark reading over TLS
and SASL. The results equal the sequential reference."""

from __future__ import annotations

import random
import urllib.request
from datetime import date
from pathlib import Path
from typing import Any

import psutil
import pytest
from kafka_fixtures import wait_until
from secure_support import SecureSetup
from worker_support import WorkerThread, read_table, reservation, send_events, wait_accounted

from fifolane.serde import SchemaCatalog
from listeners.client import ListenerClient, MaterializedView
from listeners.model import ListenerSpec
from listeners.registry import get_listener, register
from listeners.runtime import ListenerRuntime
from services.worker.runtime import load_app
from spark.job import build_views
from spark.output import read_view
from spark.views import RESERVATION_COLUMNS

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def _events() -> list[tuple[str, dict[str, Any], str]]:
    rng = random.Random(18)
    flights = [f"LH{i}" for i in range(6)]
    events: list[tuple[str, dict[str, Any], str]] = [
        ("flight", {"flight_number": f, "origin": "FRA", "destination": "JFK", "departure": date(2026, 12, 1),
                    "capacity": 12, "version": 1}, "upsert")
        for f in flights
    ]
    versions: dict[str, int] = {}
    for _ in range(240):
        rid = f"R{rng.randrange(80)}"
        versions[rid] = versions.get(rid, 0) + 1
        r = reservation(rid, flights[int(rid[1:]) % len(flights)], versions[rid], seats=rng.randint(1, 4),
                        amount=float(rng.randrange(100, 1000)),
                        state="CANCELLED" if rng.random() < 0.1 else "NEW")
        events.append(("reservation", r, "upsert"))
    return events


def _metrics_on_localhost_only(workers: list[WorkerThread]) -> None:
    """By default a worker's metrics endpoint listens on 127.0.0.1 only, and answers there."""
    listening = {c.laddr.port: c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN}
    for w in workers:
        port = w.worker.metrics_port
        assert port is not None and listening[port] == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert f'fifolane_events_processed_total{{worker="{w.worker.opts.worker_id}"}}' in body


def test_pipeline_with_each_component_under_its_own_principal(secure: SecureSetup, spark: Any,
                                                              tmp_path: Path) -> None:
    s = secure.admin
    app = load_app("examples.flights:app")  # as `fifolane worker --app`: examples/ of the checkout
    from examples.flights import reference

    secure.grant("producer", "producer")
    secure.grant("worker", "worker", app="flights")
    secure.grant("listener-admin", "listener-admin")
    secure.grant("listener-reader", "listener-reader", listener="big")
    secure.grant("spark", "spark")

    # The listener admin registers; the reader follows it from the start, renewing its lease.
    register(secure.as_user("listener-admin"), ListenerSpec(
        "big", "value.state == 'CONFIRMED' && value.amount >= 500.0",
        convert='{"id": value.reservation_id, "seats": value.seats}', type="reservation", lease="10m"))
    reader = secure.as_user("listener-reader")
    client = ListenerClient(reader, "big", from_beginning=True)
    renewed = get_listener(s, "big").renewed_at
    client.renew()
    assert get_listener(s, "big").renewed_at != renewed  # the reader renewed its own lease
    assert get_listener(s, "big").principal == "User:listener-admin"

    events = _events()
    n = send_events(secure.as_user("producer"), events)
    ws = secure.as_user("worker")
    # --on-failure park: the worker role covers the parked topic too (read at every assignment).
    workers = [WorkerThread(ws, app, worker_id=f"w{i}", concurrency=8, listeners=ListenerRuntime(ws),
                            on_failure="park", metrics_port=0) for i in (1, 2)]
    for w in workers:
        w.__enter__()
    try:
        wait_accounted(workers, n, timeout=120)
        expected = reference(events)
        view = MaterializedView()
        wanted = {k: {"id": r["reservation_id"], "seats": r["seats"]} for k, r in expected.items()
                  if k.startswith("reservation/") and r["state"] == "CONFIRMED" and r["amount"] >= 500.0}
        wait_until(lambda: view.follow(client) >= 0 and view.data == wanted, timeout=60,
                   message=lambda: f"listener view has {len(view.data)} of {len(wanted)}")
        _metrics_on_localhost_only(workers)
    finally:
        client.close()
        for w in workers:
            w.stop()
    assert sum(w.stats.dead_lettered for w in workers) == 0
    table = {k: rec for k, (_v, rec) in read_table(s).items() if rec is not None}
    assert table == expected

    # Spark, as User:spark, over TLS (the CA as a PEM truststore) and SASL/SCRAM.
    out = tmp_path / "views"
    build_views(spark, secure.as_user("spark"), SchemaCatalog.load(s.schemas_dir), out)
    got = {tuple(r[c] for c in RESERVATION_COLUMNS) for r in read_view(spark, "reservations", out).collect()}
    assert got == {tuple(r[c] for c in RESERVATION_COLUMNS) for k, r in expected.items()
                   if k.startswith("reservation/")}
    sold = {r["flight_number"]: r["seats_sold"] for k, r in expected.items() if k.startswith("flight_load/")}
    seats = {r["flight_number"]: r["seats_sold"] for r in read_view(spark, "seats_per_flight", out).collect()}
    assert seats == sold
