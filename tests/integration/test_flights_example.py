"""The seeds' flight example: seat allocation is correct because each flight is handled in order."""

from __future__ import annotations

import random
from datetime import date
from typing import Any

import pytest
from kafka_fixtures import wait_until
from worker_support import WorkerThread, read_table, reservation, send_events, wait_accounted

from examples.flights import app, reference
from fifolane.config import Settings

pytestmark = pytest.mark.integration


def test_flights_app_matches_the_sequential_reference(settings: Settings, topics: Any) -> None:
    rng = random.Random(3)
    events: list[tuple[str, dict[str, Any], str]] = []
    flights = [f"LH{i}" for i in range(12)]
    for f in flights:
        events.append(("flight", {"flight_number": f, "origin": "FRA", "destination": "JFK",
                                  "departure": date(2026, 12, 1), "capacity": 20, "version": 1}, "upsert"))
    versions: dict[str, int] = {}
    for _i in range(900):
        rid = f"R{rng.randrange(300)}"
        flight = flights[int(rid[1:]) % len(flights)]
        versions[rid] = versions.get(rid, 0) + 1
        v = versions[rid] - (2 if rng.random() < 0.1 else 0)  # some stale updates
        r = reservation(rid, flight, v, seats=rng.randint(1, 4),
                        state="CANCELLED" if rng.random() < 0.1 else "NEW")
        events.append(("reservation", r, "delete" if rng.random() < 0.05 else "upsert"))
    n = send_events(settings, events)
    with WorkerThread(settings, app, concurrency=8) as w:
        wait_accounted([w], n)
    assert w.stats.dead_lettered == 0
    expected = reference(events)
    table = {k: rec for k, (_v, rec) in read_table(settings).items() if rec is not None}
    def shape(t: dict[str, Any]) -> dict[str, Any]:
        return {k: (r.get("state"), r.get("seats_sold"), r.get("rejected_seats"), r.get("seats"))
                for k, r in t.items()}

    assert shape(table) == shape(expected)
    loads = [r for k, r in table.items() if k.startswith("flight_load/")]
    assert loads and all(0 <= r["seats_sold"] <= 20 for r in loads)
    assert any(r["state"] == "REJECTED" for k, r in table.items() if k.startswith("reservation/"))


def test_a_rebooking_gives_the_old_flight_its_seats_back(settings: Settings, topics: Any) -> None:
    """A reservation rebooked onto another flight (or deleted in a flight it is not on) leaves
    its old flight through the entity directory's move-out, which calls the app's handler with
    a delete there: the old flight's seats sold drop. Capacities leave room for every booking,
    so the result does not depend on when a move-out arrives. Two workers split the flights."""
    rng = random.Random(8)
    flights = [f"LH{i}" for i in range(6)]
    events: list[tuple[str, dict[str, Any], str]] = [
        ("flight", {"flight_number": f, "origin": "FRA", "destination": "JFK", "departure": date(2026, 12, 1),
                    "capacity": 1000, "version": 1}, "upsert") for f in flights]
    where = {f"R{i}": rng.choice(flights) for i in range(120)}
    seats = {rid: rng.randint(1, 4) for rid in where}
    events += [("reservation", reservation(rid, f, 1, seats=seats[rid]), "upsert") for rid, f in where.items()]
    for v, rids in ((2, list(where)[:60]), (3, list(where)[:20])):  # rebookings, some twice
        for rid in rids:
            where[rid] = rng.choice([f for f in flights if f != where[rid]])
            events.append(("reservation", reservation(rid, where[rid], v, seats=seats[rid]), "upsert"))
    for rid in list(where)[100:110]:  # deleted in a flight they are not on
        other = next(f for f in flights if f != where[rid])
        events.append(("reservation", reservation(rid, other, 4, seats=seats[rid]), "delete"))
    expected = reference(events)
    want = {k: r["seats_sold"] for k, r in expected.items() if k.startswith("flight_load/")}
    n = send_events(settings, events)

    def loads() -> dict[str, int]:
        return {k: rec["seats_sold"] for k, (_v, rec) in read_table(settings).items()
                if rec is not None and k.startswith("flight_load/")}

    with WorkerThread(settings, app, worker_id="a", concurrency=8) as w1, \
            WorkerThread(settings, app, worker_id="b", concurrency=8) as w2:
        wait_accounted([w1, w2], n, timeout=120)
        wait_until(lambda: loads() == want, timeout=90, interval=0.5, message=lambda: f"{loads()} != {want}")
    assert w1.stats.dead_lettered + w2.stats.dead_lettered == 0
    assert w1.stats.moves_sent + w2.stats.moves_sent >= 80 + 10  # the directory's, and a partition's own
    table = {k: rec for k, (_v, rec) in read_table(settings).items() if rec is not None}
    live = {k: r for k, r in table.items() if k.startswith("reservation/")}
    assert {k.split("/", 1)[1]: r["flight_number"] for k, r in live.items()} == \
        {rid: f for rid, f in where.items() if not 100 <= int(rid[1:]) < 110}
    for f in flights:  # each flight's seats sold are the seats of its live confirmed reservations
        held = sum(r["seats"] for r in live.values() if r["flight_number"] == f and r["state"] == "CONFIRMED")
        assert table[f"flight_load/{f}"]["seats_sold"] == held, f
