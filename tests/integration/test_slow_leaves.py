"""A handler called for an entity leaving its group runs like any other call: off the poll
thread (unless inline), holding its own group only."""

from __future__ import annotations

import threading
import zlib
from datetime import date
from typing import Any

import pytest
from kafka_fixtures import wait_until
from worker_support import (
    WorkerThread,
    app_of,
    read_table,
    reservation,
    send_events,
    wait_accounted,
)

from examples.flights import on_reservation
from fifolane.config import Settings
from services.worker import Event, GroupState

pytestmark = pytest.mark.integration


def _flights(settings: Settings, n: int, partition: int) -> list[str]:
    return [g for g in (f"LH{i}" for i in range(400)) if zlib.crc32(g.encode()) % settings.partitions == partition][:n]


def _flight(f: str) -> tuple[str, dict[str, Any], str]:
    return ("flight", {"flight_number": f, "origin": "FRA", "destination": "JFK", "departure": date(2026, 12, 1),
                       "capacity": 100, "version": 1}, "upsert")


def _table(settings: Settings) -> dict[str, dict[str, Any]]:
    return {k: rec for k, (_v, rec) in read_table(settings).items() if rec is not None}


def _sold(settings: Settings) -> dict[str, int]:
    return {k.split("/", 1)[1]: r["seats_sold"] for k, r in _table(settings).items() if k.startswith("flight_load/")}


def _rebook_r1(settings: Settings, w: WorkerThread, n: int, to: str, leaving: threading.Event) -> int:
    """Once the ``n`` events sent are in, rebook R1 (3 seats) onto ``to`` at version 2, and
    wait until its old flight's handler is called for the leave; returns the events sent."""
    wait_accounted([w], n)
    n += send_events(settings, [("reservation", reservation("R1", to, 2, seats=3), "upsert")])
    assert leaving.wait(60), "the leave's handler was never called"
    return n


def _settles(settings: Settings, w: WorkerThread, n: int, want: dict[str, int]) -> None:
    """Every event is in, the flights' seats sold are ``want``, and nothing was dead-lettered."""
    wait_accounted([w], n)
    wait_until(lambda: _sold(settings) == want and w.committed(), timeout=60, message=lambda: str(_sold(settings)))
    assert w.stats.dead_lettered == 0 and not w.stats.dead_letter_reasons


@pytest.mark.parametrize("handler", ["sync", "async"])
def test_a_slow_leave_holds_its_own_group_only(settings: Settings, topics: Any, handler: str) -> None:
    """R1 is rebooked from A to C. A's handler for R1's leave does not return until the test
    lets it. Meanwhile B, in A's partition, goes on (R3 is booked there), while A's own next
    event (R4) waits behind the leave, in A's order. Once the leave returns, A gives R1's
    seats back and then books R4. (The leave ran on the poll thread: the whole worker
    waited.)"""
    a, b = _flights(settings, 2, 0)
    c = _flights(settings, 1, 1)[0]
    leaving, go_on = threading.Event(), threading.Event()

    def rule(event: Event, state: GroupState) -> None:
        if event.op == "delete" and event.group == a and event.key == "R1":
            leaving.set()
            go_on.wait(120)
        on_reservation(event, state)

    events = [_flight(f) for f in (a, b, c)]
    events += [("reservation", reservation("R1", a, 1, seats=3), "upsert"),
               ("reservation", reservation("R2", b, 1, seats=2), "upsert")]
    n = send_events(settings, events)
    with WorkerThread(settings, app_of("slow-leave", rule, handler), concurrency=4) as w:
        try:
            n = _rebook_r1(settings, w, n, c, leaving)
            n += send_events(settings, [("reservation", reservation("R3", b, 1, seats=4), "upsert"),
                                        ("reservation", reservation("R4", a, 1, seats=1), "upsert")])
            wait_until(lambda: _sold(settings).get(b) == 6, timeout=30, message=lambda: str(_sold(settings)))
            assert "reservation/R4" not in _table(settings)  # A's order: after the leave
            assert _sold(settings)[a] == 3
        finally:
            go_on.set()
        _settles(settings, w, n, {a: 1, b: 6, c: 3})
    assert w.stats.moves_applied == 1


@pytest.mark.parametrize("handler", ["sync", "async"])
def test_a_leave_whose_entity_is_taken_meanwhile_is_decided_again(settings: Settings, topics: Any,
                                                                  handler: str) -> None:
    """R1 is rebooked from A to C (another partition); while A's handler runs for that leave,
    R1 is rebooked again onto B, in A's partition, which takes A's copy (and sends A a
    move-out of its own, carrying the copy). The leave's result is not applied: the
    directory's move-out is decided again (nothing left to remove), and A gives R1's seats
    back once, on the second move-out. Applied twice, A would sell -3 seats."""
    a, b = _flights(settings, 2, 0)
    c = _flights(settings, 1, 1)[0]
    leaving, taken = threading.Event(), threading.Event()
    calls: list[tuple[str, int]] = []

    def rule(event: Event, state: GroupState) -> None:
        if event.op == "delete" and event.group == a and event.key == "R1":
            calls.append((event.group, event.version))
            prev, load = state.get("reservation", event.key), state.get("flight_load", event.group)
            if len(calls) == 1:  # reads, then waits (on I/O, say), then writes what it read
                leaving.set()
                taken.wait(120)
            assert prev is not None and load is not None
            state.delete("reservation", event.key, event.version)
            state.put("flight_load", {**load, "seats_sold": load["seats_sold"] - prev["seats"],
                                      "version": load["version"] + 1})
            return
        on_reservation(event, state)

    events = [_flight(f) for f in (a, b, c)]
    events += [("reservation", reservation("R1", a, 1, seats=3), "upsert")]
    n = send_events(settings, events)
    with WorkerThread(settings, app_of("taken-leave", rule, handler), concurrency=4) as w:
        try:
            n = _rebook_r1(settings, w, n, c, leaving)
            n += send_events(settings, [("reservation", reservation("R1", b, 3, seats=3), "upsert")])
            wait_until(lambda: _table(settings).get("reservation/R1", {}).get("flight_number") == b, timeout=30)
        finally:
            taken.set()
        _settles(settings, w, n, {a: 0, b: 3, c: 0})
    assert calls == [(a, 2), (a, 3)]  # the first call's result was dropped; the copy's move-out
    table = _table(settings)
    assert table["reservation/R1"]["flight_number"] == b and table["reservation/R1"]["version"] == 3



@pytest.mark.parametrize("handler", ["sync", "async"])
def test_a_leave_for_a_carried_copy_is_called_once_while_the_new_copy_changes(
        settings: Settings, topics: Any, handler: str) -> None:
    """R1 is rebooked from A to B in one partition: B's write takes A's copy and sends A a
    move-out carrying it. While A's handler runs for that leave, R1 is updated in B five
    times. The call read the carried copy, not B's row: it is applied as it is, once. (It
    was called again after each of B's updates, holding A meanwhile.)"""
    a, b = _flights(settings, 2, 0)
    leaving, go_on = threading.Event(), threading.Event()
    calls: list[int] = []

    def rule(event: Event, state: GroupState) -> None:
        if event.op == "delete" and event.group == a and event.key == "R1":
            calls.append(event.version)
            leaving.set()
            go_on.wait(120)
        on_reservation(event, state)

    n = send_events(settings, [_flight(a), _flight(b), ("reservation", reservation("R1", a, 1, seats=3), "upsert")])
    with WorkerThread(settings, app_of("carried-leave", rule, handler), concurrency=4) as w:
        try:
            n = _rebook_r1(settings, w, n, b, leaving)
            n += send_events(settings, [("reservation", reservation("R1", b, v, seats=3), "upsert") for v in range(3, 8)])
            wait_until(lambda: _table(settings).get("reservation/R1", {}).get("version") == 7, timeout=30)
        finally:
            go_on.set()
        _settles(settings, w, n, {a: 0, b: 3})
    assert calls == [2]
