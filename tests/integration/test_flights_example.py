"""The seeds' flight example: seat allocation is correct because each flight is handled in order."""

from __future__ import annotations

import random
from datetime import date
from typing import Any

import pytest
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
