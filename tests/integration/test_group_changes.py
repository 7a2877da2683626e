"""Entities that change their FIFO group (#12 item 14): a rebooking moves a reservation onto
another flight, often in another partition. The version decides: after a newer version in
the new group, no view shows the entity in its old group, and older versions arriving later
in either group are stale (docs/formats.md, "Group changes").

Against real Kafka, with worker processes (the built-in table handler, listeners on): the
state topic (no live copy left in an old partition), the table, and a listener's view
materialized from its notifications, after rebookings across partitions under a SIGKILL,
and with the move-out racing newer updates in the old group.
"""

from __future__ import annotations

import json
import random
import struct
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from kafka_fixtures import consume_all, wait_until
from worker_support import CATALOG, WorkerProcess, WorkerThread, accounted, read_dlq, reservation

from fifolane.config import Settings
from fifolane.serde import make_codec
from fifolane.testing.listener_check import materialize
from fifolane.testing.records import notifications_from, table_from
from listeners.model import ListenerSpec
from listeners.registry import register

pytestmark = pytest.mark.integration

#: (entity, flight, version, delete?)
Op = tuple[str, str, int, bool]


def _send(settings: Settings, ops: list[Op]) -> None:
    codec = make_codec(settings, CATALOG)
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all", "linger.ms": 2}))
    for rid, flight, v, delete in ops:
        value = (codec.encode_delete("reservation", rid, flight, v) if delete
                 else codec.encode("reservation", reservation(rid, flight, v, seats=v % 4 + 1)))
        producer.produce(settings.input_topic, value, flight.encode())
    assert producer.flush(30) == 0


def _reference(ops: list[Op]) -> dict[str, tuple[int, str | None]]:
    """Per entity key: the highest version and its flight (None: deleted)."""
    out: dict[str, tuple[int, str | None]] = {}
    for rid, flight, v, delete in ops:
        key = f"reservation/{rid}"
        if key not in out or v > out[key][0]:
            out[key] = (v, None if delete else flight)
    return out


def _observed(settings: Settings) -> tuple[dict[str, tuple[int, str | None]], dict[str, list[int]]]:
    """The state topic: per key the winning version and flight, and the partitions where the
    key's last record is live (an entity must be live in at most one)."""
    codec = make_codec(settings, CATALOG)
    msgs = consume_all(settings, settings.state_topic)
    table = table_from(msgs, codec)
    last: dict[tuple[int, str], Any] = {}
    for m in msgs:
        last[(m.partition(), m.key().decode())] = m.value()
    live: dict[str, list[int]] = defaultdict(list)
    for (p, key), value in sorted(last.items()):
        if value is not None:
            live[key].append(p)
    observed = {k: (e.version, None if e.value is None else str(e.value["flight_number"]))
                for k, e in table.items()}
    return observed, dict(live)


def _settled(settings: Settings, want: dict[str, tuple[int, str | None]]) -> bool:
    """Alive exactly as ``want`` says, each live in one partition, and no copy of an entity
    live anywhere once its winning version is a delete."""
    observed, live = _observed(settings)
    alive = {k: v for k, v in observed.items() if v[1] is not None}
    return alive == {k: v for k, v in want.items() if v[1] is not None} \
        and all(len(ps) == 1 for ps in live.values()) and set(live) == set(alive)


def _workers(settings: Settings, tmp_path: Path, n: int) -> list[WorkerProcess]:
    return [WorkerProcess(settings, f"g{i}", tmp_path, extra=["--group-id", f"fifolane-moves-{settings.input_topic}"])
            for i in range(n)]


def test_rebookings_across_partitions_under_a_kill(settings: Settings, topics: Any, tmp_path: Path) -> None:
    register(settings, ListenerSpec(name="all", filter="true"))
    register(settings, ListenerSpec(name="f3", filter='value.flight_number == "F3"'))
    rng = random.Random(5)
    flights = [f"F{i}" for i in range(12)]
    where = {f"R{i}": rng.choice(flights) for i in range(120)}
    ops: list[Op] = [(rid, flight, 1, False) for rid, flight in where.items()]
    for rid in list(where)[:80]:  # rebookings, half of them twice
        for v in (2, 3) if rng.random() < 0.5 else (2,):
            where[rid] = rng.choice([f for f in flights if f != where[rid]])
            ops.append((rid, where[rid], v, False))
    for rid in list(where)[80:100]:  # late, older updates in the old flight: stale
        ops.append((rid, rng.choice(flights), 0, False))
    for rid in list(where)[100:110]:  # deleted in its flight
        ops.append((rid, where[rid], 5, True))
    workers = _workers(settings, tmp_path, 2)
    for w in workers:
        w.start()
    try:
        _send(settings, ops[:150])
        wait_until(lambda: len(consume_all(settings, settings.state_topic)) >= 100, timeout=90,
                   message=lambda: workers[1].log_tail())
        workers[1].kill()  # SIGKILL mid-stream
        _send(settings, ops[150:])
        workers[1].start()
        want = _reference(ops)
        wait_until(lambda: _settled(settings, want), timeout=120, interval=0.5,
                   message=lambda: f"{_observed(settings)[1]}\n{workers[0].log_tail()}")
    finally:
        for w in workers:
            if w.alive():
                w.kill()
    observed, live = _observed(settings)
    assert {k: v for k, v in observed.items() if v[1] is not None} == \
        {k: v for k, v in want.items() if v[1] is not None}
    assert all(len(ps) == 1 for ps in live.values()), {k: ps for k, ps in live.items() if len(ps) > 1}
    # A client's view of the listeners equals the filtered table.
    notes = notifications_from(consume_all(settings, settings.listener_output_topic))
    table = {k: v for k, v in observed.items() if v[1] is not None}
    view = materialize(notes, "all")
    assert {f"reservation/{k}": (v["version"], v["flight_number"]) for k, v in view.items()} == table
    f3 = materialize(notes, "f3")
    assert {f"reservation/{k}" for k in f3} == {k for k, v in table.items() if v[1] == "F3"}
    moved_out = [n for n in notes if n.kind == "removed" and n.listener == "all"]
    assert moved_out, "rebookings must remove entities from their old flights"


@pytest.mark.parametrize("race", ["newer-in-old-group", "older-late-in-old-group", "back-and-forth",
                                  "deleted-in-another-group"])
def test_move_out_racing_updates_in_the_old_group(settings: Settings, topics: Any, tmp_path: Path,
                                                  race: str) -> None:
    """The move-out travels through the directory while the old group goes on: the version
    decides which copy stays, whatever arrives first."""
    # Flights in different partitions of the 3 (the test producer's partitioner: CRC-32).
    a, b = "FA1", next(f"FB{i}" for i in range(10) if zlib.crc32(f"FB{i}".encode()) % 3 != zlib.crc32(b"FA1") % 3)
    ops: list[Op] = [("E1", a, 1, False), ("E2", a, 1, False), ("E3", a, 1, False)]
    if race == "newer-in-old-group":  # moved to b at v2, then a newer update in a at v3
        ops += [("E1", b, 2, False), ("E1", a, 3, False), ("E2", b, 2, False), ("E2", a, 3, True)]
    elif race == "older-late-in-old-group":  # moved to b at v5, an older update in a comes later
        ops += [("E1", b, 5, False), ("E1", a, 4, False), ("E2", b, 5, False), ("E2", a, 2, True)]
    elif race == "back-and-forth":  # a -> b -> a -> b
        ops += [("E1", b, 2, False), ("E1", a, 3, False), ("E1", b, 4, False), ("E3", b, 9, False)]
    else:  # deleted in a group it never was in: its copy in a goes (it stayed live there once)
        ops += [("E1", b, 2, True), ("E3", b, 4, True), ("E2", b, 1, True)]
    want = _reference(ops)
    workers = _workers(settings, tmp_path, 2)
    for w in workers:
        w.start()
    try:
        _send(settings, ops)
        wait_until(lambda: _settled(settings, want), timeout=90, interval=0.5,
                   message=lambda: f"{_observed(settings)}\n{workers[0].log_tail()}")
    finally:
        for w in workers:
            if w.alive():
                w.kill()
    observed, live = _observed(settings)
    assert {k: v for k, v in observed.items() if v[1] is not None} == \
        {k: v for k, v in want.items() if v[1] is not None}
    assert all(len(ps) == 1 for ps in live.values()), live
    assert set(live) == {k for k, v in want.items() if v[1] is not None}, live


def test_a_delete_in_a_group_the_entity_was_moved_out_of_removes_its_copy_elsewhere(
        settings: Settings, topics: Any, tmp_path: Path) -> None:
    """E1 moves a -> b, and only once a holds the move-out's tombstone does a delete come in
    a, at a higher version: the copy in b must go (no claim was made for it once)."""
    a, b = "FA1", next(f"FB{i}" for i in range(10) if zlib.crc32(f"FB{i}".encode()) % 3 != zlib.crc32(b"FA1") % 3)
    register(settings, ListenerSpec(name="all", filter="true"))
    first: list[Op] = [("E1", a, 1, False), ("E1", b, 2, False), ("E2", a, 1, False)]
    workers = _workers(settings, tmp_path, 1)
    workers[0].start()
    try:
        _send(settings, first)
        wait_until(lambda: _settled(settings, _reference(first)), timeout=90, interval=0.5,
                   message=lambda: f"{_observed(settings)}\n{workers[0].log_tail()}")
        ops = [*first, ("E1", a, 3, True)]
        _send(settings, ops[3:])
        wait_until(lambda: _settled(settings, _reference(ops)), timeout=90, interval=0.5,
                   message=lambda: f"{_observed(settings)}\n{workers[0].log_tail()}")
    finally:
        workers[0].kill()
    assert set(_observed(settings)[1]) == {"reservation/E2"}
    # The move a -> b is a removal in a with moved_to b; the delete that won in a is no move:
    # b's copy goes with a plain removal.
    notes = [json.loads(m.value()) for m in consume_all(settings, settings.listener_output_topic)]
    removed = {(n["version"], n.get("moved_to")) for n in notes if n["key"] == "E1" and n["kind"] == "removed"}
    assert removed == {(2, b), (3, None)}, notes


def test_forged_directory_records_neither_stop_the_owner_nor_misplace_entities(
        settings: Settings, topics: Any, tmp_path: Path) -> None:
    """Records on the directory topic that no worker wrote: a claim of a group longer than a
    stored row keeps (it failed every commit of the directory's owner, which died again after
    each restart), and claims naming partitions the input topic does not have (the move-out
    the real claim then sends, Kafka would refuse). The owner keeps going, and the real
    entities are decided as if the forged records were not there."""
    claim = struct.Struct(">qBi")  # version, flags, partition; then the group (directory.py)
    a, b = "FA1", next(f"FB{i}" for i in range(10) if zlib.crc32(f"FB{i}".encode()) % 3 != zlib.crc32(b"FA1") % 3)
    forged = Producer(settings.kafka_config(**{"acks": "all", "partitioner": "murmur2_random"}))
    for key, value in ((b"reservation/Q1", claim.pack(0, 0, 9999) + b"FORGED"),
                       (b"reservation/Q2", claim.pack(0, 0, -5) + b"FORGED"),
                       (b"reservation/Q3", claim.pack(0, 0, 0) + b"g" * 70_000),
                       (b"reservation/LONG", claim.pack(1, 0, 0) + b"g" * 70_000)):
        forged.produce(settings.directory_topic, value, key)
    assert forged.flush(30) == 0
    ops: list[Op] = [("Q1", a, 1, False), ("Q2", a, 1, False), ("Q3", a, 1, False),
                     ("Q1", b, 2, False), ("Q2", b, 2, False), ("Q3", b, 2, False)]
    want = _reference(ops)
    [worker] = _workers(settings, tmp_path, 1)
    worker.start()
    try:
        _send(settings, ops[:3])
        wait_until(lambda: _settled(settings, _reference(ops[:3])), timeout=90, interval=0.5,
                   message=lambda: f"{_observed(settings)}\n{worker.log_tail()}")
        _send(settings, ops[3:])  # rebooked: each must leave a
        wait_until(lambda: _settled(settings, want), timeout=90, interval=0.5,
                   message=lambda: f"{_observed(settings)}\n{worker.log_tail()}")
        assert worker.alive(), worker.log_tail()
        log = worker.log_tail(400)
    finally:
        worker.kill()
    observed, live = _observed(settings)
    assert {k: v for k, v in observed.items() if v[1] is not None} == \
        {f"reservation/{q}": (2, b) for q in ("Q1", "Q2", "Q3")}
    assert all(len(ps) == 1 for ps in live.values()), live
    assert "Traceback" not in log
    assert log.count("ignoring a record that is not a claim") == 2  # the two long groups
    assert "partition 9999, which" in log and "partition -5, which" in log


def test_a_directory_record_whose_move_out_kafka_refuses_is_dead_lettered(
        settings: Settings, topics: Any) -> None:
    """Two forged claims of one entity whose key is longer than the input topic takes: the
    second wins, and its move-out (which carries the key) is refused by the broker, failing
    the transaction, and would on every replay. The bisection finds the directory record,
    which is dead-lettered with its origin; every real event is still applied."""
    admin = AdminClient(settings.kafka_config())
    change = ConfigResource("topic", settings.input_topic, incremental_configs=[
        ConfigEntry("max.message.bytes", "4096", incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([change]).values():
        future.result(30)
    claim = struct.Struct(">qBi")
    key = b"reservation/" + b"k" * 8000
    forged = Producer(settings.kafka_config(**{"acks": "all", "partitioner": "murmur2_random"}))
    forged.produce(settings.directory_topic, claim.pack(1, 0, 0) + b"G1", key)
    forged.produce(settings.directory_topic, claim.pack(2, 0, 1) + b"G2", key)  # the same partition
    assert forged.flush(30) == 0
    ops: list[Op] = [(f"R{i}", f"F{i % 4}", 1, False) for i in range(30)]
    _send(settings, ops)
    with WorkerThread(settings) as w:
        wait_until(lambda: w.stats.dead_letter_reasons["output-refused"] == 1 and accounted([w.stats]) == 30,
                   timeout=120, message=lambda: f"{w.stats}")
        wait_until(w.committed, timeout=30)
        # Not an input event: the dead letters of input events stay consumed - processed - superseded.
        assert w.stats.aborts >= 1 and w.stats.processed == 30 and w.stats.dead_lettered == 0
    [dead] = read_dlq(settings)
    assert dead["reason"] == "output-refused" and dead["key"] == key
    assert dead["topic"] == settings.directory_topic and dead["offset"] == "1"
    assert _settled(settings, _reference(ops))
