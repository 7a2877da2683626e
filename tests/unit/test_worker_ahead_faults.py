"""Lanes dispatched ahead (services/worker/scheduler.py, ``ahead``) meeting faults, without a
broker: an abort while calls wait in the handler threads' queue, not started yet."""

from __future__ import annotations

import threading
from pathlib import Path

from fake_kafka import FakeMsg
from kafka_fixtures import wait_until
from test_state_records_held import _flight
from test_worker_guarantees import CODEC, _msg, _state, _worker

from fifolane.errors import TransactionAbortedError
from services.worker.app import App, Event, GroupState


def _held_app(slow: str) -> tuple[App, threading.Event, list[str]]:
    """A pool handler; the call for group ``slow`` waits for ``gate``. ``started``: the calls
    that began, in order."""
    app = App("held")
    gate = threading.Event()
    started: list[str] = []

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        started.append(f"{event.group}/{event.key}")
        if event.group == slow:
            assert gate.wait(10)
        assert event.value is not None
        state.put("reservation", event.value)

    return app, gate, started


def test_an_abort_does_not_start_the_calls_waiting_for_a_thread(tmp_path: Path) -> None:
    """concurrency 1: F0's call runs, F1's waits for the thread (dispatched ahead). A send
    fails: the abort waits for the call that runs, and drops the one that waits. Its event
    is replayed, so starting it after the abort only called the handler once more for
    nothing (twice per event: a duplicate side effect), and made the abort wait for it too
    (an abort waited for up to twice ``concurrency`` calls)."""
    app, gate, started = _held_app("F0")
    w, clients = _worker(tmp_path, app, concurrency=1)
    batch = [_msg(0, 100, "R1", "F0", 1), _msg(0, 101, "R2", "F1", 1)]
    w.take(batch)
    w.processing.pump(block=False)  # type: ignore[union-attr]
    wait_until(lambda: started == ["F0/R1"], timeout=10, message="F0's call runs")
    assert len(w.sched.busy) == 2 and w.calls.outstanding == 2  # F1's call waits for the thread
    clients.fake_producer.fail = TransactionAbortedError("broker gone", code="_STATE", abortable=True)
    threading.Timer(0.3, gate.set).start()  # F0's call ends while the abort waits for it
    w.take([FakeMsg(0, 102, b"F9", CODEC.encode("flight", _flight("F9", 1)))])  # its state record fails
    assert w.stats.aborts == 1 and ("in", 0, 100) in clients.fake_consumer.seeks
    assert w.sched.idle() and w.calls.outstanding == 0 and w.calls.completions.empty()
    assert started == ["F0/R1"], "a call not started before the abort ran after it"
    w.take([*batch, FakeMsg(0, 102, b"F9", CODEC.encode("flight", _flight("F9", 1)))])  # the replay
    w.drain()
    w.checkpoint()
    assert started == ["F0/R1", "F0/R1", "F1/R2"]
    assert sorted(_state(clients)) == [(b"flight/F9", 1), (b"reservation/R1", 1), (b"reservation/R2", 1)]
    assert clients.fake_producer.offsets[-1] == [("in", 0, 103), ("in", 1, 200)]
    w.calls.shutdown()


def test_a_later_event_of_a_group_parked_meanwhile_is_held_at_concurrency_1(tmp_path: Path) -> None:
    """--on-failure park, --concurrency 1: group F1's reservation R1 (offset 100, its NEW
    stage's lane) fails; the flight F1 (offset 101, lane F1) comes after it. With one call at
    a time the flight's lane was dispatched only once R1 had parked the group, so it was held
    behind R1 (and replayed after it on release). Dispatched ahead, it passes the check for a
    parked group before R1 fails, and is applied while R1, before it in its group, is held."""
    from confluent_kafka import TopicPartition
    from fake_kafka import FakeClients
    from test_worker_guarantees import CATALOG

    from fifolane.config import Settings
    from services.worker.options import WorkerOptions
    from services.worker.runtime import Worker

    app = App("park-stages")
    gate = threading.Event()
    applied: list[str] = []

    @app.handler("reservation", stage="NEW")
    def new(event: Event, state: GroupState) -> None:
        assert gate.wait(10)
        raise RuntimeError("poison")

    @app.handler("flight")
    def flight(event: Event, state: GroupState) -> None:
        applied.append(f"{event.type}/{event.key}")
        assert event.value is not None
        state.put("flight", event.value)

    clients = FakeClients({("in", 0): 100, ("in", 1): 200})
    w = Worker(Settings(home=tmp_path / "h", input_topic="in", state_topic="state", dlq_topic="dlq",
                        directory_topic="dir", parked_topic="parked"),
               app, WorkerOptions(worker_id="w", state_dir=tmp_path / "s", retries=0, on_failure="park",
                                  concurrency=1), catalog=CATALOG, clients=clients)
    w.connect()
    clients.fake_consumer.callbacks["on_assign"](None, [TopicPartition("in", 0), TopicPartition("in", 1)])
    wait_until(lambda: w.poll_once() or w.assigned_partitions == [0, 1], timeout=10, message="restored")
    w.take([_msg(0, 100, "R1", "F1", 1), FakeMsg(0, 101, b"F1", CODEC.encode("flight", _flight("F1", 1)))])
    w.processing.pump(block=False)  # type: ignore[union-attr]
    gate.set()
    w.drain()
    assert w.parking is not None and list(w.parking.groups) == ["F1"]
    assert applied == [], "a later event of the parked group was applied"
    assert [h.offset for h in w.parking.groups["F1"].held] == [100, 101]
    w.calls.shutdown()
