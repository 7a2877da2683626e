"""Multi-stage pipelines over the group index (#17.2), on fake Kafka clients: the stages of
one group run at the same time, one event per stage of a group, each stage in order."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from fake_kafka import FakeClients, FakeMsg
from kafka_fixtures import wait_until

from fifolane.config import Settings
from fifolane.errors import AppError
from fifolane.serde import SchemaCatalog, make_codec
from services.worker.app import App, Event, GroupState
from services.worker.options import WorkerOptions
from services.worker.runtime import Worker

CATALOG = SchemaCatalog.load()
CODEC = make_codec(Settings(), CATALOG)


def _msg(offset: int, rid: str, state: str = "NEW", version: int = 1) -> FakeMsg:
    rec = {"reservation_id": rid, "flight_number": "F1", "customer_id": "c", "seats": 1,
           "amount": 1.0, "state": state, "version": version}
    return FakeMsg(0, offset, b"F1", CODEC.encode("reservation", rec), [("test.seq", str(offset).encode())])


def _worker(tmp_path: Path, app: App) -> tuple[Worker, FakeClients]:
    clients = FakeClients({("in", 0): 0})
    w = Worker(Settings(home=tmp_path / "h", input_topic="in", state_topic="state", dlq_topic="dlq",
                        directory_topic="dir"),
               app, WorkerOptions(worker_id="w", state_dir=tmp_path / "s", concurrency=4),
               catalog=CATALOG, clients=clients)
    w.connect()
    clients.fake_consumer.callbacks["on_assign"](None, [TopicPartition("in", 0)])
    wait_until(lambda: w.poll_once() or w.assigned_partitions == [0], timeout=10)
    return w, clients


def test_stages_of_a_group_run_at_once_each_in_order(tmp_path: Path) -> None:
    """R2's NEW stage waits until R1's CONFIRMED stage runs, in the same group: this ends only
    if different stages of one group run concurrently. Within a stage, a group's events
    keep their order and never overlap."""
    app = App("stages")
    confirmed_r1 = threading.Event()
    log: list[tuple[str, str]] = []
    running: dict[str, int] = {"NEW": 0, "CONFIRMED": 0}
    lock = threading.Lock()

    def stage(event: Event, state: GroupState, nxt: str) -> None:
        assert event.stage is not None and event.value is not None
        with lock:
            running[event.stage] += 1
            assert running[event.stage] == 1, "two events of a group in one stage"
            log.append((event.stage, event.key))
        if event.stage == "NEW" and event.key == "R2":
            assert confirmed_r1.wait(5), "the CONFIRMED stage did not run while NEW was busy"
        if event.stage == "CONFIRMED" and event.key == "R1":
            confirmed_r1.set()
        state.put("reservation", {**event.value, "state": nxt})
        with lock:
            running[event.stage] -= 1

    app.handler("reservation", stage="NEW")(lambda e, s: stage(e, s, "CONFIRMED"))
    app.handler("reservation", stage="CONFIRMED")(lambda e, s: stage(e, s, "TICKETED"))
    w, clients = _worker(tmp_path, app)
    w.take([_msg(0, "R1"), _msg(1, "R2"), _msg(2, "R3")])
    done = threading.Event()
    threading.Thread(target=lambda: (w.drain(), done.set()), daemon=True).start()
    assert done.wait(15), f"the pipeline stalled: {log}"
    assert [k for s, k in log if s == "NEW"] == ["R1", "R2", "R3"]
    assert [k for s, k in log if s == "CONFIRMED"] == ["R1", "R2", "R3"]
    w.checkpoint()
    final = {k: CODEC.decode(v).record["state"] for t, v, k, _p, _h in clients.fake_producer.records
             if t == "state"}
    assert final == {b"reservation/R1": "TICKETED", b"reservation/R2": "TICKETED", b"reservation/R3": "TICKETED"}
    assert (w.stats.processed, w.stats.consumed) == (3, 3)  # each input event counted once
    w.calls.shutdown()


def test_an_event_enters_at_its_own_stage_and_a_newer_version_supersedes(tmp_path: Path) -> None:
    app = App("stages")
    seen: list[tuple[str, str, int]] = []

    def stage(event: Event, state: GroupState, nxt: str) -> None:
        assert event.stage is not None and event.value is not None
        seen.append((event.stage, event.key, event.version))
        state.put("reservation", {**event.value, "state": nxt})

    app.handler("reservation", stage="NEW", inline=True)(lambda e, s: stage(e, s, "CONFIRMED"))
    app.handler("reservation", stage="CONFIRMED", inline=True)(lambda e, s: stage(e, s, "TICKETED"))
    w, _clients = _worker(tmp_path, app)
    # R1 enters at CONFIRMED; R2 v1 and v2 (v1's later stage is superseded by v2 or runs first)
    w.take([_msg(0, "R1", "CONFIRMED"), _msg(1, "R2", "NEW", 1), _msg(2, "R2", "NEW", 2),
            _msg(3, "R3", "TICKETED")])
    w.drain()
    assert ("CONFIRMED", "R1", 1) in seen and ("NEW", "R1", 1) not in seen
    assert [(s, v) for s, k, v in seen if k == "R2"][-1] == ("CONFIRMED", 2)
    assert not [k for _s, k, _v in seen if k == "R3"]  # no handler for TICKETED: applied as is
    w.calls.shutdown()


def test_stage_declarations_are_checked() -> None:
    app = App("x")
    app.handler("reservation", stage="NEW")(lambda e, s: None)
    with pytest.raises(AppError, match="stage 'NEW' of type 'reservation' already has a handler"):
        app.handler("reservation", stage="NEW")(lambda e, s: None)
    with pytest.raises(AppError, match="either one handler or handlers per stage"):
        app.handler("reservation")(lambda e, s: None)


def test_an_async_handler_cannot_be_inline() -> None:
    """It would be called on the poll thread and return an un-awaited coroutine: every event
    would be dead-lettered. Refused when it is registered, saying what to change."""
    app = App("x")

    async def rule(event: Event, state: GroupState) -> None:
        return None

    with pytest.raises(AppError, match="handler 'rule' is async, .* cannot be inline: drop inline=True"):
        app.handler("reservation", inline=True)(rule)
    app.handler("reservation")(rule)  # not inline: fine


def test_a_type_without_group_index_cannot_have_stages(tmp_path: Path) -> None:
    app = App("x")
    app.handler("flight", stage="NEW")(lambda e, s: None)
    with pytest.raises(AppError, match="fifolane.group_index"):
        Worker(Settings(home=tmp_path), app, WorkerOptions(worker_id="w"), catalog=CATALOG,
               clients=FakeClients())


