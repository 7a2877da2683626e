"""The seeds' flight example: seat allocation is correct because each flight is handled in order."""

from __future__ import annotations

import random
from datetime import date
from typing import Any

import pytest
from kafka_fixtures import wait_until
from worker_support import (
    WorkerThread,
    app_of,
    read_dlq,
    read_table,
    reservation,
    send_events,
    wait_accounted,
)

from examples.flights import app, on_reservation, reference
from fifolane.config import Settings
from services.worker import App, Event, GroupState

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


@pytest.mark.parametrize(("concurrency", "guarantee"), [(1, "exactly-once"), (8, "exactly-once"),
                                                        (1, "at-least-once")])
def test_the_state_topic_has_each_entity_once_per_batch_in_order(settings: Settings, topics: Any,
                                                                 concurrency: int, guarantee: str) -> None:
    """A flight's load is written for each of its reservations; exactly-once, the state topic
    gets an entity's latest row once per consumed batch (what a transaction writes twice
    leaves once); at-least-once, whose output is visible as it is sent, every write's record.
    Read back committed: per entity, versions only rise; the topic holds exactly the writes
    less the coalesced ones (counted); its last record per entity is the reference's."""
    from kafka_fixtures import consume_all
    from worker_support import CATALOG

    from fifolane.serde import make_codec

    flights = [f"LH{i}" for i in range(4)]
    events: list[tuple[str, dict[str, Any], str]] = [
        ("flight", {"flight_number": f, "origin": "FRA", "destination": "JFK", "departure": date(2026, 12, 1),
                    "capacity": 500, "version": 1}, "upsert") for f in flights]
    events += [("reservation", reservation(f"R{i}", flights[i % 4], 1, seats=1), "upsert") for i in range(400)]
    events += [("reservation", reservation(f"R{i}", flights[i % 4], 2, seats=1), "delete") for i in range(0, 400, 7)]
    n = send_events(settings, events)
    with WorkerThread(settings, app, concurrency=concurrency, guarantee=guarantee) as w:
        wait_accounted([w], n)
    s = w.stats
    assert (s.processed, s.superseded, s.dead_lettered, s.aborts) == (n, 0, 0, 0)
    codec = make_codec(settings, CATALOG)
    versions: dict[str, list[int]] = {}
    for msg in consume_all(settings, settings.state_topic):
        key = msg.key().decode()
        value = msg.value()
        version = codec.decode(value).version if value is not None else int(dict(msg.headers())["fifolane.version"])
        versions.setdefault(key, []).append(version)
    assert all(v == sorted(set(v)) for v in versions.values()), versions  # per entity: rising, no repeat
    assert sum(map(len, versions.values())) == s.state_writes - s.state_coalesced
    loads = sum(len(v) for k, v in versions.items() if k.startswith("flight_load/"))
    if guarantee == "exactly-once":
        assert s.state_coalesced > 0 and loads < 400  # 400 bookings and 58 deletes changed the 4 loads
    else:
        assert s.state_coalesced == 0 and loads == 400 + 58
    table = {k: rec for k, (_v, rec) in read_table(settings).items() if rec is not None}
    assert table == {k: r for k, r in reference(events).items()}


@pytest.mark.parametrize("handler", ["sync", "async"])
def test_a_rebooking_gives_the_old_flight_its_seats_back(settings: Settings, topics: Any, handler: str) -> None:
    """A reservation rebooked onto another flight (or deleted in a flight it is not on) leaves
    its old flight through the entity directory's move-out, which calls the app's handler with
    a delete there: the old flight's seats sold drop. Capacities leave room for every booking,
    so the result does not depend on when a move-out arrives. Two workers split the flights.
    An async handler is called for the leave too (it was skipped: the seats stayed sold)."""
    the_app = app if handler == "sync" else app_of("flights", on_reservation, "async")
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

    with WorkerThread(settings, the_app, worker_id="a", concurrency=8) as w1, \
            WorkerThread(settings, the_app, worker_id="b", concurrency=8) as w2:
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


def test_forged_move_outs_and_chains_of_leaves_do_not_corrupt_the_app(settings: Settings, topics: Any) -> None:
    """Move-out records no worker wrote, carrying a copy of a reservation that was never on the
    flight, or a damaged copy of one that is: the first calls no handler, the others read the
    copy the store has (its seats come back), and none stops the worker."""
    import base64
    import json

    from confluent_kafka import Producer
    from worker_support import CATALOG, accounted

    from fifolane.serde import make_codec

    codec = make_codec(settings, CATALOG)
    flight = {"flight_number": "F1", "origin": "FRA", "destination": "JFK", "departure": date(2026, 12, 1),
              "capacity": 100, "version": 1}
    events = [("flight", flight, "upsert"), ("flight", {**flight, "flight_number": "F2"}, "upsert"),
              ("reservation", reservation("R1", "F1", 1, seats=3), "upsert"),
              ("reservation", reservation("R2", "F1", 1, seats=4), "upsert")]
    n = send_events(settings, events)
    forged = codec.encode("reservation", {**reservation("R9", "F1", 1, seats=50), "state": "CONFIRMED"})
    bodies = [{"key": "reservation/R9", "version": 5, "to": "F2", "copy": base64.b64encode(forged).decode()},
              {"key": "reservation/R1", "version": 5, "to": "F2", "copy": base64.b64encode(b"\x00junk").decode()},
              {"key": "reservation/R1", "version": 2**63, "to": "F2"}]
    producer = Producer(settings.kafka_config())
    for body in bodies:
        producer.produce(settings.input_topic, json.dumps(body).encode(), b"F1",
                         headers=[("fifolane.control", b"move-out")])
    assert producer.flush(30) == 0
    with WorkerThread(settings, app, concurrency=4) as w:
        wait_until(lambda: accounted([w.stats]) >= n + len(bodies) and w.committed(), timeout=60)
    assert (w.stats.dead_lettered, dict(w.stats.dead_letter_reasons)) == (1, {"undecodable": 1})  # 2**63
    table = {k: rec for k, (_v, rec) in read_table(settings).items() if rec is not None}
    assert table["flight_load/F1"]["seats_sold"] == 4  # R1 left (its 3 seats back), R9 was never there
    assert "reservation/R1" not in table and table["reservation/R2"]["state"] == "CONFIRMED"


def test_a_handler_that_takes_another_copy_when_its_entity_leaves_starts_no_chain(
        settings: Settings, topics: Any) -> None:
    """Tokens w -> u -> v -> w: when one leaves a group, the handler takes the next one into
    that group (a write that replaces the next token's copy in another group of the same
    partition). Move-outs carrying copies would chain for ever; only the first leave calls a
    handler, and the worker settles."""
    import zlib


    nxt = {"w": "u", "u": "v", "v": "w"}
    loop = App("loop")

    @loop.handler("reservation", inline=True)
    def handle(event: Event, state: GroupState) -> None:
        if event.op == "upsert":
            assert event.value is not None
            state.put("reservation", event.value)
        elif event.key in nxt:  # leaving: take the next token here
            state.put("reservation", reservation(nxt[event.key], event.group, event.version + 10))

    same = [g for g in (f"G{i}" for i in range(200)) if zlib.crc32(g.encode()) % settings.partitions == 0][:3]
    g1, g2, g3 = same
    events = [("reservation", reservation("w", g1, 1), "upsert"), ("reservation", reservation("u", g2, 1), "upsert"),
              ("reservation", reservation("v", g3, 1), "upsert"), ("reservation", reservation("w", g2, 2), "upsert")]
    n = send_events(settings, events)
    with WorkerThread(settings, loop, concurrency=2) as w:
        wait_accounted([w], n)
        wait_until(lambda: w.stats.moves_sent >= 2 and w.committed(), timeout=30)
        sent = w.stats.moves_sent
        wait_until(lambda: w.stats.processed >= n + sent and w.committed(), timeout=30)
        settled = w.stats.moves_sent
        import time
        time.sleep(2)  # nothing more may come
        assert w.stats.moves_sent == settled <= 4, w.stats


def test_rebooked_away_and_back_within_a_partition_counts_the_seats_once(settings: Settings, topics: Any) -> None:
    """R1 on A, then on B, then on A again, A and B in one partition: A handles R1's return
    before the move-out that tells it R1 left (that record is written when B takes R1, after
    the return was sent). A gives back the first booking's seats all the same, and B the second's."""
    import zlib

    a, b = [g for g in (f"LH{i}" for i in range(200)) if zlib.crc32(g.encode()) % settings.partitions == 0][:2]
    events: list[tuple[str, dict[str, Any], str]] = [
        ("flight", {"flight_number": f, "origin": "FRA", "destination": "JFK", "departure": date(2026, 12, 1),
                    "capacity": 100, "version": 1}, "upsert") for f in (a, b)]
    events += [("reservation", reservation("R1", a, 1, seats=3), "upsert"),
               ("reservation", reservation("R1", b, 2, seats=4), "upsert"),
               ("reservation", reservation("R1", a, 3, seats=5), "upsert")]
    n = send_events(settings, events)

    def sold() -> dict[str, int]:
        return {k.split("/", 1)[1]: rec["seats_sold"] for k, (_v, rec) in read_table(settings).items()
                if rec is not None and k.startswith("flight_load/")}

    with WorkerThread(settings, app, concurrency=4) as w:
        wait_accounted([w], n)
        wait_until(lambda: sold() == {a: 5, b: 0} and w.committed(), timeout=60, message=lambda: str(sold()))


@pytest.mark.parametrize("handler", ["sync", "async"])
def test_a_call_overtaken_by_a_newer_version_in_another_group_applies_nothing(
        settings: Settings, topics: Any, handler: str) -> None:
    """R1 booked on A (v1), then rebooked on B (v2), A and B in one partition. A's call is
    slow, so B's runs beside it (another group) and is applied first. When A's call ends, R1
    is at v2 already: the event is superseded whole. Its stale write alone was dropped before,
    and A kept R1's 3 seats (no move-out ever came to give them back)."""
    import time
    import zlib

    a, b = [g for g in (f"LH{i}" for i in range(200)) if zlib.crc32(g.encode()) % settings.partitions == 0][:2]

    def rule(event: Event, state: GroupState) -> None:
        if event.key == "R1" and event.version == 1:
            time.sleep(2)  # B's v2 is applied meanwhile
        on_reservation(event, state)

    slow = app_of("overtaken", rule, handler)

    events: list[tuple[str, dict[str, Any], str]] = [
        ("flight", {"flight_number": f, "origin": "FRA", "destination": "JFK", "departure": date(2026, 12, 1),
                    "capacity": 100, "version": 1}, "upsert") for f in (a, b)]
    events += [("reservation", reservation("R1", a, 1, seats=3), "upsert"),
               ("reservation", reservation("R1", b, 2, seats=3), "upsert"),
               ("reservation", reservation("R2", a, 1, seats=2), "upsert"),
               ("reservation", reservation("R3", b, 1, seats=1), "upsert")]
    n = send_events(settings, events)
    want = {k: r["seats_sold"] for k, r in reference(events).items() if k.startswith("flight_load/")}
    assert want == {f"flight_load/{a}": 2, f"flight_load/{b}": 4}

    def sold() -> dict[str, int]:
        return {k: rec["seats_sold"] for k, (_v, rec) in read_table(settings).items()
                if rec is not None and k.startswith("flight_load/")}

    with WorkerThread(settings, slow, concurrency=4) as w:
        wait_accounted([w], n)
        wait_until(lambda: w.committed(), timeout=30)
    assert (w.stats.processed, w.stats.superseded, w.stats.dead_lettered) == (n - 1, 1, 0)
    assert sold() == want
    table = {k: rec for k, (_v, rec) in read_table(settings).items() if rec is not None}
    assert table["reservation/R1"]["flight_number"] == b and table["reservation/R1"]["version"] == 2


@pytest.mark.parametrize("handler", ["sync", "async"])
def test_a_leave_whose_handler_fails_is_dead_lettered_with_its_reason(
        settings: Settings, topics: Any, handler: str) -> None:
    """R1 and R2 are rebooked from A to B. On R1's leave the handler raises (retried once,
    counted); on R2's it writes a flight load over the state topic's limit. Each move-out
    record is dead-lettered with its reason (``handler-error``, ``too-large``), the copies
    are removed all the same, and the worker goes on."""
    import zlib

    a, b = [g for g in (f"LH{i}" for i in range(200)) if zlib.crc32(g.encode()) % settings.partitions == 0][:2]

    def rule(event: Event, state: GroupState) -> None:
        if event.op == "delete" and event.group == a and event.key == "R1":
            raise RuntimeError("no leaving today")
        if event.op == "delete" and event.group == a and event.key == "R2":
            state.put("reservation", {**reservation("R9", a, 1), "customer_id": "c" * 2_000_000})
            return
        on_reservation(event, state)

    failing = app_of("leave-fails", rule, handler)

    events: list[tuple[str, dict[str, Any], str]] = [
        ("flight", {"flight_number": f, "origin": "FRA", "destination": "JFK", "departure": date(2026, 12, 1),
                    "capacity": 100, "version": 1}, "upsert") for f in (a, b)]
    events += [("reservation", reservation(r, a, 1, seats=2), "upsert") for r in ("R1", "R2", "R3")]
    n = send_events(settings, events)
    with WorkerThread(settings, failing, concurrency=4, retries=1, retry_backoff=0.01) as w:
        wait_accounted([w], n)
        events2 = [("reservation", reservation(r, b, 2, seats=2), "upsert") for r in ("R1", "R2")]
        n += send_events(settings, events2)
        wait_accounted([w], n)
        wait_until(lambda: len(read_dlq(settings)) == 2 and w.committed(), timeout=60,
                   message=lambda: str(read_dlq(settings)))
    letters = read_dlq(settings)
    assert sorted(d["reason"] for d in letters) == ["handler-error", "too-large"], letters
    assert all(d["error"].startswith(f"on leaving group {a}: ") for d in letters)
    assert any("no leaving today" in d["error"] for d in letters)
    assert w.stats.handler_retries >= 1 and w.stats.dead_lettered == 0  # not input events
    assert dict(w.stats.dead_letter_reasons) == {"handler-error": 1, "too-large": 1}
    table = {k: rec for k, (_v, rec) in read_table(settings).items() if rec is not None}
    assert {k: r["flight_number"] for k, r in table.items() if k.startswith("reservation/")} == \
        {"reservation/R1": b, "reservation/R2": b, "reservation/R3": a}
    assert table[f"flight_load/{b}"]["seats_sold"] == 4


@pytest.mark.parametrize("handler", ["sync", "async"])
def test_a_retried_leave_reads_the_copy_as_it_was(settings: Settings, topics: Any, handler: str) -> None:
    """R1 is rebooked from A to B in one partition. The leave's first attempt changes the
    copy it read (0 seats, cancelled) and fails; the retry reads the copy as it was, and A
    gives back R1's 2 seats (the retry read the failed attempt's change, and A kept them)."""
    import zlib

    a, b = [g for g in (f"LH{i}" for i in range(200)) if zlib.crc32(g.encode()) % settings.partitions == 0][:2]
    failed: list[str] = []

    def rule(event: Event, state: GroupState) -> None:
        if event.op == "delete" and event.group == a and not failed:
            prev = state.get("reservation", event.key)
            assert prev is not None
            prev.update(seats=0, state="CANCELLED")
            failed.append(event.key)
            raise TimeoutError("transient")
        on_reservation(event, state)

    events: list[tuple[str, dict[str, Any], str]] = [
        ("flight", {"flight_number": f, "origin": "FRA", "destination": "JFK", "departure": date(2026, 12, 1),
                    "capacity": 100, "version": 1}, "upsert") for f in (a, b)]
    events += [("reservation", reservation("R1", a, 1, seats=2), "upsert"),
               ("reservation", reservation("R1", b, 2, seats=2), "upsert")]
    n = send_events(settings, events)

    def sold() -> dict[str, int]:
        return {k.split("/", 1)[1]: rec["seats_sold"] for k, (_v, rec) in read_table(settings).items()
                if rec is not None and k.startswith("flight_load/")}

    with WorkerThread(settings, app_of("leave-retry", rule, handler), concurrency=4, retries=2,
                      retry_backoff=0.01) as w:
        wait_accounted([w], n)
        wait_until(lambda: sold() == {a: 0, b: 2} and w.committed(), timeout=60, message=lambda: str(sold()))
    assert failed == ["R1"] and w.stats.handler_retries == 1 and not read_dlq(settings)
