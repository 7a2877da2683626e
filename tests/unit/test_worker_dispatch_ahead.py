"""Lanes dispatched ahead (services/worker/scheduler.py, ``ahead``), without a broker.

Sync handlers run on ``concurrency`` threads; the scheduler dispatches as many lanes again,
which wait for a thread. A thread that finishes a call takes the next waiting one at once,
without the poll thread. Never more than ``concurrency`` calls run, a group never has two
events dispatched, and the stats count only running calls as in flight. (End to end: the
slow suite in benchmarks/, and tests/integration/test_worker_order.py.)
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from kafka_fixtures import wait_until
from test_worker_guarantees import _msg, _state, _worker

from fifolane.errors import ConfigError
from services.worker.app import App, Event, GroupState
from services.worker.scheduler import GroupScheduler


class _Lane:
    def __init__(self, lane: str) -> None:
        self.lane = lane


def test_scheduler_dispatches_ahead_lanes_and_counts_only_running_ones() -> None:
    sched: GroupScheduler[_Lane] = GroupScheduler(2, ahead=2)
    events = [_Lane(f"g{i % 5}") for i in range(10)]  # 5 groups, 2 events each
    for e in events:
        sched.submit(e)
    started: list[_Lane] = []
    assert sched.dispatch(started.append) == 4
    assert [e.lane for e in started] == ["g0", "g1", "g2", "g3"]  # one per group, in arrival order
    assert (sched.in_flight, sched.ready_groups, sched.max_in_flight) == (2, 1 + 2, 2)
    sched.complete(started[0])  # g0's first event: its second becomes ready behind g4
    assert sched.dispatch(started.append) == 1 and started[-1].lane == "g4"
    assert sched.dispatch(started.append) == 0  # 4 lanes dispatched: the bound
    assert sched.max_in_flight == 2


def test_scheduler_without_ahead_is_bound_by_concurrency() -> None:
    sched: GroupScheduler[_Lane] = GroupScheduler(3)
    for i in range(6):
        sched.submit(_Lane(f"g{i}"))
    assert sched.dispatch(lambda e: None) == 3
    assert (sched.in_flight, sched.ready_groups) == (3, 3)
    with pytest.raises(ConfigError, match="concurrency must be >= 1"):
        GroupScheduler(0, ahead=5)


def _gated_app() -> tuple[App, threading.Semaphore, list[str], dict[str, int]]:
    """A pool handler that waits for a permit per call; it records the calls that started
    and the most that ran at once."""
    app = App("gated")
    gate = threading.Semaphore(0)
    started: list[str] = []
    running = {"now": 0, "max": 0}
    lock = threading.Lock()

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        with lock:
            started.append(f"{event.group}/{event.key}")
            running["now"] += 1
            running["max"] = max(running["max"], running["now"])
        gate.acquire()
        with lock:
            running["now"] -= 1
        assert event.value is not None
        state.put("reservation", event.value)

    return app, gate, started, running


def test_a_finished_thread_takes_a_waiting_lane_without_the_poll_thread(tmp_path: Path) -> None:
    app, gate, started, running = _gated_app()
    w, clients = _worker(tmp_path, app, concurrency=2)
    assert w.sched.bound == 4
    # 3 groups: F0 has three events, F1 and F2 one each (all on partition 0)
    msgs = [_msg(0, 100, "R1", "F0", 1), _msg(0, 101, "R2", "F1", 1), _msg(0, 102, "R3", "F0", 2),
            _msg(0, 103, "R4", "F2", 1), _msg(0, 104, "R1", "F0", 3)]
    w.take(msgs)
    w.processing.pump(block=False)  # type: ignore[union-attr]
    wait_until(lambda: len(started) == 2, timeout=10, message="two calls started")
    assert sorted(started) == ["F0/R1", "F1/R2"]
    assert len(w.sched.busy) == 3  # F0, F1 running; F2 dispatched, waiting for a thread
    assert (w.sched.in_flight, w.sched.ready_groups) == (2, 1)
    gate.release()  # one call finishes: its thread goes on with F2's, the poll thread idle
    wait_until(lambda: len(started) == 3, timeout=10, message="the waiting lane started")
    assert started[2] == "F2/R4"
    for _ in range(4):
        gate.release()
    w.drain()
    w.checkpoint()
    assert running["max"] == 2  # never more calls at once than threads
    assert [s for s in started if s.startswith("F0/")] == ["F0/R1", "F0/R3", "F0/R1"]  # group order
    # R1's two writes in one transaction: one state record, its latest (exactly-once)
    assert sorted(_state(clients)) == [(b"reservation/R1", 3), (b"reservation/R2", 1),
                                       (b"reservation/R3", 2), (b"reservation/R4", 1)]
    assert (w.stats.processed, w.stats.state_writes, w.stats.state_coalesced, w.stats.max_in_flight) == (5, 5, 1, 2)
    w.calls.shutdown()


def test_an_app_with_async_handlers_dispatches_nothing_ahead(tmp_path: Path) -> None:
    """Async calls run on the worker's event loop, all at once: ``concurrency`` is the bound."""
    app = App("async")

    @app.handler("reservation")
    async def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        state.put("reservation", event.value)

    w, clients = _worker(tmp_path, app, concurrency=3)
    assert w.sched.bound == 3
    w.take([_msg(0, 100 + i, f"R{i}", f"F{i}", 1) for i in range(8)])
    w.drain()
    w.checkpoint()
    assert len(_state(clients)) == 8 and w.stats.max_in_flight == 3
    w.calls.shutdown()
