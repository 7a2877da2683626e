"""Parked groups (#17.1) on fake Kafka clients: a failing event parks its group, later events
of the group are held (others go on), a release replays them in order, an abort takes the
parking back. The same end to end, under worker kills, is in tests/integration/test_parking.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition
from fake_kafka import FakeClients, FakeMsg
from kafka_fixtures import wait_until

from fifolane.config import Settings
from fifolane.errors import TransactionAbortedError
from fifolane.serde import SchemaCatalog, make_codec
from services.worker.app import App, Event, GroupState
from services.worker.options import WorkerOptions
from services.worker.parking import parse_parked, release_record
from services.worker.runtime import Worker

CATALOG = SchemaCatalog.load()
CODEC = make_codec(Settings(), CATALOG)


def _msg(offset: int, rid: str, flight: str, version: int = 1, customer: str = "c") -> FakeMsg:
    rec = {"reservation_id": rid, "flight_number": flight, "customer_id": customer, "seats": 1,
           "amount": 1.0, "state": "NEW", "version": version}
    return FakeMsg(0, offset, flight.encode(), CODEC.encode("reservation", rec))


def _release(offset: int, flight: str, skip_head: bool = False) -> FakeMsg:
    value, headers = release_record(skip_head)
    return FakeMsg(0, offset, flight.encode(), value, headers)  # type: ignore[arg-type]


def _worker(tmp_path: Path, healed: list[bool]) -> tuple[Worker, FakeClients, list[str]]:
    app = App("park")
    applied: list[str] = []

    @app.handler("reservation", inline=True)
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        if event.value["customer_id"] == "poison" and not healed[0]:
            raise RuntimeError("poison")
        applied.append(event.key)
        state.put("reservation", event.value)

    clients = FakeClients({("in", 0): 0})
    w = Worker(Settings(home=tmp_path / "h", input_topic="in", state_topic="state", dlq_topic="dlq",
                        directory_topic="dir", parked_topic="parked"),
               app, WorkerOptions(worker_id="w", state_dir=tmp_path / "s", retries=0, on_failure="park"),
               catalog=CATALOG, clients=clients)
    w.connect()
    clients.fake_consumer.callbacks["on_assign"](None, [TopicPartition("in", 0)])
    wait_until(lambda: w.poll_once() or w.assigned_partitions == [0], timeout=10)
    return w, clients, applied


def _parked_topic(clients: FakeClients) -> dict[str, Any]:
    recs = [(k, v) for t, v, k, _p, _h in clients.fake_producer.records if t == "parked"]
    return parse_parked(recs, 0)


def test_a_failing_event_parks_its_group_and_a_release_replays_in_order(tmp_path: Path) -> None:
    healed = [False]
    w, clients, applied = _worker(tmp_path, healed)
    w.take([_msg(0, "A1", "FA"), _msg(1, "P1", "FP", customer="poison"), _msg(2, "B1", "FB"),
            _msg(3, "P2", "FP"), _msg(4, "A2", "FA"), _msg(5, "P3", "FP")])
    w.drain()
    assert applied == ["A1", "B1", "A2"]  # the other groups went on
    assert w.parking is not None and list(w.parking.groups) == ["FP"]
    w.checkpoint()
    parked = _parked_topic(clients)["FP"]
    assert [h.offset for h in parked.held] == [1, 3, 5] and "poison" in parked.error
    assert (w.stats.dead_lettered, w.stats.held) == (0, 3)
    w.take([_msg(6, "P4", "FP")])  # held behind the others
    healed[0] = True
    w.take([_release(7, "FP"), _msg(8, "P5", "FP")])  # P5 arrives while releasing: held last
    w.drain()
    assert applied == ["A1", "B1", "A2", "P1", "P2", "P3", "P4", "P5"]
    w.checkpoint()
    assert not w.parking.groups and _parked_topic(clients) == {}
    assert (w.stats.held, w.stats.replayed) == (0, 5)
    s = w.stats  # the release record counts too
    assert (s.consumed, s.processed, s.superseded, s.dead_lettered) == (9, 9, 0, 0)


def test_skip_head_dead_letters_it_and_a_failure_on_release_parks_again(tmp_path: Path) -> None:
    healed = [False]
    w, clients, applied = _worker(tmp_path, healed)
    w.take([_msg(0, "P1", "FP", customer="poison"), _msg(1, "P2", "FP"),
            _msg(2, "P3", "FP", customer="poison"), _msg(3, "P4", "FP")])
    w.drain()
    w.take([_release(4, "FP", skip_head=True)])  # P1 dead-lettered, P2 applied, P3 parks again
    w.drain()
    assert applied == ["P2"] and w.stats.dead_lettered == 1
    w.checkpoint()
    assert [h.offset for h in _parked_topic(clients)["FP"].held] == [2, 3]
    healed[0] = True
    w.take([_release(5, "FP")])
    w.drain()
    assert applied == ["P2", "P3", "P4"]


def test_an_abort_takes_the_parking_back(tmp_path: Path) -> None:
    healed = [False]
    w, clients, applied = _worker(tmp_path, healed)
    w.take([_msg(0, "P1", "FP", customer="poison")])
    w.drain()
    assert w.parking is not None and "FP" in w.parking.groups
    clients.fake_producer.fail = TransactionAbortedError("boom", code="_STATE", abortable=True)
    w.take([_msg(1, "A1", "FA")])  # the producer fails: the transaction aborts
    assert w.stats.aborts == 1 and not w.parking.groups  # replayed from offset 0 next
    w.take([_msg(0, "P1", "FP", customer="poison"), _msg(1, "A1", "FA")])
    w.drain()
    assert list(w.parking.groups) == ["FP"] and applied == ["A1", "A1"]  # once in the aborted one


def test_a_new_owner_holds_behind_the_held_records_without_reusing_their_keys(tmp_path: Path) -> None:
    """The group's record (with next_seq) is written when it parks, not per held record: a
    new owner that took next_seq from it alone gave the next held record the key of one
    already held, and compaction kept only one of the two (an event lost)."""
    from services.worker.parking import Held, Parking, held_key

    healed = [False]
    w, clients, _applied = _worker(tmp_path, healed)
    w.take([_msg(0, "P1", "FP", customer="poison"), _msg(1, "P2", "FP"), _msg(2, "P3", "FP")])
    w.drain()
    w.checkpoint()
    loaded = _parked_topic(clients)
    assert [h.seq for h in loaded["FP"].held] == [0, 1, 2] and loaded["FP"].next_seq == 3
    produced: list[tuple[str, bytes | None, bytes]] = []
    owner = Parking("parked", lambda topic, value, key, *_a: produced.append((topic, value, key)))
    owner.load(0, loaded)
    nxt = loaded["FP"].held[-1]
    owner.hold("FP", Held(-1, nxt.key, nxt.value, nxt.headers, 0, 3, nxt.timestamp))
    assert produced[-1][2] == held_key("FP", 3)
    assert [h.seq for h in owner.groups["FP"].held] == [0, 1, 2, 3]
