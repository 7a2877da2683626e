"""The worker's guarantees under client failures, without a broker (fake Kafka clients).

Each test stands for an item of issue #12; the same behaviours are shown against real Kafka
in tests/integration and tests/faults.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from fake_kafka import FakeClients, FakeMsg
from kafka_fixtures import wait_until

from fifolane.config import Settings
from fifolane.errors import (
    KafkaRetriableError,
    ProducerFatalError,
    ProducerFencedError,
    TransactionAbortedError,
)
from fifolane.serde import SchemaCatalog, make_codec
from services.worker.app import App, Event, GroupState
from services.worker.options import WorkerOptions
from services.worker.runtime import Worker
from services.worker.window import decode_skips

CATALOG = SchemaCatalog.load()
CODEC = make_codec(Settings(), CATALOG)


def _res(rid: str, flight: str, version: int) -> dict[str, Any]:
    return {"reservation_id": rid, "flight_number": flight, "customer_id": "c1", "seats": 1,
            "amount": 10.0, "state": "NEW", "version": version}


def _msg(p: int, offset: int, rid: str, flight: str, version: int) -> FakeMsg:
    return FakeMsg(p, offset, flight.encode(), CODEC.encode("reservation", _res(rid, flight, version)))


def _worker(tmp_path: Path, app: App | None = None, clients: FakeClients | None = None,
            **opts: Any) -> tuple[Worker, FakeClients]:
    """A worker on fake clients (``clients``: committed offsets in 100 and 200), restored."""
    clients = clients or FakeClients({("in", 0): 100, ("in", 1): 200})
    settings = Settings(home=tmp_path / "home", input_topic="in", state_topic="state", dlq_topic="dlq",
                        directory_topic="dir")
    w = Worker(settings, app, WorkerOptions(worker_id="w1", state_dir=tmp_path / "state", **opts),
               catalog=CATALOG, clients=clients)
    w.connect()
    clients.fake_consumer.callbacks["on_assign"](None, [TopicPartition("in", 0), TopicPartition("in", 1)])
    wait_until(lambda: w.poll_once() or w.assigned_partitions == [0, 1], timeout=10, message="restored")
    clients.fake_consumer.seeks.clear()
    return w, clients


def _state(clients: FakeClients) -> list[tuple[bytes, int]]:
    return [(k, CODEC.decode(v).version) for t, v, k, _p, _h in clients.fake_producer.records
            if t == "state" and v is not None]


def test_abort_mid_batch_rewinds_partitions_not_yet_in_the_transaction(tmp_path: Path) -> None:
    """#12 item 4: the producer fails at the first record of a batch; records of partition 1
    come later in that batch, so partition 1 has nothing in the transaction yet. Every
    assigned partition goes back to its committed offset, and the replay applies all."""
    w, clients = _worker(tmp_path)
    batch = [_msg(0, 100, "R1", "F0", 1), _msg(1, 200, "R2", "F1", 1), _msg(1, 201, "R3", "F1", 1)]
    clients.fake_producer.fail = TransactionAbortedError("queue in error state", code="_STATE", abortable=True)
    w.take(batch)
    assert w.stats.aborts == 1
    assert sorted(clients.fake_consumer.seeks) == [("in", 0, 100), ("in", 1, 200)]
    assert all(not st.overlay for st in w.stores.stores.values())
    w.take(batch)  # the replay
    w.checkpoint()
    assert sorted(_state(clients)) == [(b"reservation/R1", 1), (b"reservation/R2", 1), (b"reservation/R3", 1)]
    assert clients.fake_producer.offsets[-1] == [("in", 0, 101), ("in", 1, 202)]


@pytest.mark.parametrize("error", [
    ProducerFencedError("INVALID_PRODUCER_EPOCH", code="INVALID_PRODUCER_EPOCH", fatal=True),
    ProducerFatalError("INVALID_TXN_STATE", code="INVALID_TXN_STATE", fatal=True),
], ids=["fenced-epoch", "fatal"])
def test_fatal_producer_errors_get_a_new_producer_not_an_exit(tmp_path: Path, error: Exception) -> None:
    """#12 item 4: a fatal producer error (INVALID_PRODUCER_EPOCH after a transaction timed
    out on the coordinator, a fatal state after a failover) replaces the producer and
    replays; the worker goes on."""
    w, clients = _worker(tmp_path)
    clients.fake_producer.fail = error  # type: ignore[assignment]
    w.take([_msg(0, 100, "R1", "F0", 1)])
    assert (w.stats.aborts, clients.fake_producer.renewals) == (1, 1)
    w.take([_msg(0, 100, "R1", "F0", 1)])
    w.checkpoint()
    assert _state(clients) == [(b"reservation/R1", 1)]


def test_an_abort_that_times_out_gets_a_new_producer_not_an_exit(tmp_path: Path) -> None:
    """#12 item 2: with a partition's leader gone, abort_transaction itself times out
    (librdkafka's _TIMED_OUT, "retry call to resume"). The worker starts a new producer
    (which settles the old transaction), rewinds and replays; it does not exit."""
    w, clients = _worker(tmp_path)
    clients.fake_producer.fail = TransactionAbortedError("leader not available", code="_STATE", abortable=True)

    def abort(timeout: float) -> None:
        raise KafkaRetriableError("abort_transaction: timed out, retry call to resume", code="_TIMED_OUT",
                                  retriable=True)

    clients.fake_producer.abort = abort  # type: ignore[method-assign]
    w.take([_msg(0, 100, "R1", "F0", 1)])
    assert (w.stats.aborts, clients.fake_producer.renewals) == (1, 1)
    assert sorted(clients.fake_consumer.seeks) == [("in", 0, 100), ("in", 1, 200)]
    w.take([_msg(0, 100, "R1", "F0", 1)])  # the replay
    w.checkpoint()
    assert _state(clients) == [(b"reservation/R1", 1)]
    assert clients.fake_producer.offsets[-1] == [("in", 0, 101), ("in", 1, 200)]


class _SlowChangelog:
    """A restore consumer over an empty changelog that answers only once ``gate`` is set."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def get_watermark_offsets(self, tp: Any, timeout: float | None = None) -> tuple[int, int]:
        assert self.gate.wait(30), "the restore was never let go"
        return 0, 0

    def close(self) -> None:
        pass


def test_a_long_restore_runs_outside_the_open_transaction(tmp_path: Path) -> None:
    """#12 item 4: a partition assigned while the worker's transaction is open is restored in
    the background, paused; the rebalance callback returns at once, and the open transaction
    commits while the restore still runs (a long restore must not outlast
    transaction.timeout.ms)."""
    w, clients = _worker(tmp_path)
    gate = threading.Event()
    clients.restore_consumer = lambda conf: _SlowChangelog(gate)  # type: ignore[method-assign]
    w.take([_msg(0, 100, "R1", "F0", 1)])  # the transaction is open
    assigned = threading.Event()
    threading.Thread(target=lambda: (clients.fake_consumer.callbacks["on_assign"](None, [TopicPartition("in", 2)]),
                                     assigned.set()), daemon=True).start()
    try:
        assert assigned.wait(5), "on_assign waits for the restore, with the transaction open"
        assert ("in", 2) in clients.fake_consumer.paused
        w.checkpoint()  # while partition 2 restores
        assert clients.fake_producer.offsets[-1] == [("in", 0, 101), ("in", 1, 200)]
        assert _state(clients) == [(b"reservation/R1", 1)]
        assert w.assigned_partitions == [0, 1]
    finally:
        gate.set()
    wait_until(lambda: w.poll_once() or w.assigned_partitions == [0, 1, 2], timeout=10,
               message=lambda: f"partition 2 restored: {w.assigned_partitions}")
    assert ("in", 2) not in clients.fake_consumer.paused


def test_a_hung_commit_gets_a_new_producer_and_rewinds_every_partition(tmp_path: Path) -> None:
    """#12 item 1: send_offsets_to_transaction hangs past the watchdog (the transaction
    coordinator's broker died), the worker starts a new producer, and the transaction did not
    commit. Every assigned partition goes back to its committed offset (the input offsets
    must not move past effects that were aborted), and the replay applies everything."""
    w, clients = _worker(tmp_path)
    batch = [_msg(0, 100, "R1", "F0", 1), _msg(1, 200, "R2", "F1", 1)]
    w.take(batch)
    hung = ProducerFatalError("send_offsets_to_transaction did not return (_TIMED_OUT)", code="_TIMED_OUT",
                              fatal=True)

    def send_offsets(offsets: Any, group_metadata: Any, timeout: float) -> None:
        raise hung

    clients.fake_producer.send_offsets = send_offsets  # type: ignore[method-assign]
    w.checkpoint()
    assert (w.stats.aborts, clients.fake_producer.renewals) == (1, 1)
    assert sorted(clients.fake_consumer.seeks) == [("in", 0, 100), ("in", 1, 200)]
    assert all(not st.overlay for st in w.stores.stores.values())
    del clients.fake_producer.send_offsets  # the new producer works
    clients.fake_producer.records.clear()  # the aborted transaction's records: never read
    w.take(batch)  # the replay
    w.checkpoint()
    assert sorted(k for k, _v in _state(clients)) == [b"reservation/R1", b"reservation/R2"]
    assert clients.fake_producer.offsets[-1] == [("in", 0, 101), ("in", 1, 201)]


def test_commit_that_timed_out_here_but_committed_there_is_kept(tmp_path: Path) -> None:
    """Suspected in #12: a commit whose reply was lost. The committed offsets show it went
    through: its state is kept and nothing is replayed (which would duplicate outputs)."""
    w, clients = _worker(tmp_path)
    w.take([_msg(0, 100, "R1", "F0", 1), _msg(0, 101, "R2", "F0", 1)])
    lost = KafkaRetriableError("commit_transaction: timed out", code="_TIMED_OUT", retriable=True)

    def commit(timeout: float) -> None:
        clients.fake_consumer.offsets[("in", 0)] = 102  # the broker did commit
        raise lost

    clients.fake_producer.commit = commit  # type: ignore[method-assign]
    w.checkpoint()
    assert clients.fake_consumer.seeks == []  # no replay
    assert w.stores.stores[0].get(b"reservation/R2") is not None  # persisted
    assert not w.stores.stores[0].overlay
    assert w.ckpt is not None and w.ckpt.sources["in"].base == {0: 102, 1: 200}


def test_every_transaction_carries_the_offsets_of_every_partition(tmp_path: Path) -> None:
    """Suspected in #12: a transaction that consumed nothing (listener snapshots,
    housekeeping) would skip the group's fencing of a zombie. Each one sends the offsets of
    all assigned partitions."""
    w, clients = _worker(tmp_path)
    assert w.ckpt is not None
    w.ckpt.produce("some.topic", b"v", b"k")  # what a change sink does at a safe point
    w.checkpoint()
    assert clients.fake_producer.offsets == [[("in", 0, 100), ("in", 1, 200)]]


def test_group_too_long_and_bad_versions_are_dead_lettered(tmp_path: Path) -> None:
    """#12 item 5: row packing limits are checked at ingest (fast and general path), and in
    app-handler results, before anything is applied."""
    app = App("deletes")

    @app.handler("flight")
    def huge_delete(event: Event, state: GroupState) -> None:
        state.delete("reservation", "R9", 2**70)

    w, clients = _worker(tmp_path, app)
    long_group = "G" * 70_000
    rec = _res("R1", long_group, 1)
    flight = {"flight_number": "F1", "origin": "FRA", "destination": "JFK",
              "departure": __import__("datetime").date(2026, 1, 1), "capacity": 3, "version": 1}
    w.take([FakeMsg(0, 100, long_group.encode(), CODEC.encode("reservation", rec)),
            FakeMsg(0, 101, b"F1", CODEC.encode("flight", flight)),
            _msg(1, 200, "R2", "F1", 1)])
    w.drain()
    assert dict(w.stats.dead_letter_reasons) == {"group-too-long": 1, "bad-version": 1}
    assert (w.stats.processed, w.stats.dead_lettered) == (1, 2)
    assert _state(clients) == [(b"reservation/R2", 1)]


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-path"])
def test_a_state_record_too_large_for_kafka_is_dead_lettered(tmp_path: Path, fast: bool) -> None:
    """#12 item 3: an input record that fits its topic, but whose state record (its key is
    longer than the input key) would not: dead-lettered as too-large before anything is
    produced, counted once, and the records around it are applied."""
    w, clients = _worker(tmp_path)
    if not fast:
        w._fast._types = {}  # type: ignore[union-attr]  # every record takes the general path
    room = w.limits.room("state")
    rec = _res("R1", "F0", 1)
    rec["customer_id"] = ""
    bare = len(CODEC.encode("reservation", rec))
    rec["customer_id"] = "c" * (room - bare - len(b"reservation/R1") + 4)  # value + state key: over
    value = CODEC.encode("reservation", rec)
    assert len(b"F0") + len(value) <= room < len(b"reservation/R1") + len(value)
    w.take([_msg(0, 100, "R0", "F0", 1), FakeMsg(0, 101, b"F0", value), _msg(1, 200, "R2", "F1", 1)])
    w.drain()
    w.checkpoint()
    assert dict(w.stats.dead_letter_reasons) == {"too-large": 1}
    assert (w.stats.processed, w.stats.dead_lettered) == (2, 1)
    assert sorted(_state(clients)) == [(b"reservation/R0", 1), (b"reservation/R2", 1)]
    [dead] = [h for t, _v, _k, _p, h in clients.fake_producer.records if t == "dlq"]
    assert dict(dead)["fifolane.dlq.reason"] == b"too-large"
    assert clients.fake_producer.offsets[-1] == [("in", 0, 102), ("in", 1, 201)]


@pytest.mark.parametrize("raise_", [SystemExit, KeyboardInterrupt, asyncio.CancelledError])
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
def test_handler_raising_base_exceptions_is_a_handler_failure(tmp_path: Path, raise_: type[BaseException],
                                                              is_async: bool) -> None:
    """#12 item 12: SystemExit, KeyboardInterrupt or CancelledError from a handler is retried
    and then dead-lettered; the drain ends and the other events are applied."""
    app = App("bad")
    calls: list[str] = []

    def body(event: Event, state: GroupState) -> None:
        calls.append(event.key)
        if event.key == "BAD":
            raise raise_("from the handler")
        assert event.value is not None
        state.put("reservation", event.value)

    if is_async:
        @app.handler("reservation")
        async def handler(event: Event, state: GroupState) -> None:
            body(event, state)
    else:
        app.handler("reservation")(body)
    w, clients = _worker(tmp_path, app, retries=2, retry_backoff=0.001)
    w.take([_msg(0, 100, "BAD", "F0", 1), _msg(0, 101, "OK1", "F0", 1), _msg(1, 200, "OK2", "F1", 1)])
    done = threading.Event()
    threading.Thread(target=lambda: (w.drain(), done.set()), daemon=True).start()
    assert done.wait(20), "the drain hangs"
    assert calls.count("BAD") == 3  # the call and 2 retries
    assert (w.stats.processed, w.stats.dead_lettered) == (2, 1)
    assert dict(w.stats.dead_letter_reasons) == {"handler-error": 1}
    w.calls.shutdown()


def _slow_app() -> tuple[App, threading.Event, list[str]]:
    """An app whose handler waits on the gate for key SLOW (the calls' keys, in order)."""
    app = App("slow")
    gate = threading.Event()
    calls: list[str] = []

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        calls.append(event.key)
        if event.key == "SLOW":
            assert gate.wait(10)
        assert event.value is not None
        state.put("reservation", event.value)

    return app, gate, calls


def test_slow_calls_stay_running_across_a_commit(tmp_path: Path) -> None:
    """#16: a checkpoint does not wait for slow handler calls. It commits each partition up
    to its first unfinished event, with the finished ones after it in the offset metadata;
    a replay (after an abort, or by a new owner) skips exactly those."""
    app, gate, calls = _slow_app()
    w, clients = _worker(tmp_path, app)
    w.take([_msg(0, 100, "SLOW", "F1", 1), _msg(0, 101, "R2", "F2", 1), _msg(0, 102, "R3", "F3", 1)])
    wait_until(lambda: w.poll_once() or sorted(calls) == ["R2", "R3", "SLOW"] and w.sched.in_flight == 1,
               timeout=10, message=lambda: str(calls))
    w.checkpoint()  # SLOW still runs
    assert clients.fake_producer.offsets[-1] == [("in", 0, 100), ("in", 1, 200)]
    meta = clients.fake_producer.metadata[-1][("in", 0)]
    assert decode_skips(100, meta) == {101, 102}
    assert sorted(k for k, _v in _state(clients)) == [b"reservation/R2", b"reservation/R3"]
    gate.set()
    w.drain()
    w.checkpoint()
    assert clients.fake_producer.offsets[-1] == [("in", 0, 103), ("in", 1, 200)]
    assert clients.fake_producer.metadata[-1] == {}
    w.calls.shutdown()


def test_done_offsets_ahead_of_a_replay_stay_done_across_its_commits(tmp_path: Path) -> None:
    """After an abort the replay starts at the committed offset. Records that finished beyond
    it (the commit's offset metadata) stay done when a commit comes before the replay reaches
    them: in memory, and in that commit's metadata for a new owner. (They were handled, and
    their dead letters and outputs sent, once more.)"""
    app, gate, calls = _slow_app()
    w, clients = _worker(tmp_path, app)
    w.take([_msg(0, 100, "SLOW", "F1", 1), _msg(0, 101, "R2", "F2", 1), _msg(0, 102, "R3", "F3", 1)])
    wait_until(lambda: w.poll_once() or sorted(calls) == ["R2", "R3", "SLOW"] and w.sched.in_flight == 1,
               timeout=10, message=lambda: str(calls))
    w.checkpoint()  # SLOW still runs: 100 committed, 101 and 102 done
    assert decode_skips(100, clients.fake_producer.metadata[-1][("in", 0)]) == {101, 102}
    gate.set()
    w.drain()  # SLOW's effects are in the open transaction, which then aborts
    clients.fake_producer.fail = TransactionAbortedError("broker gone", code="_STATE", abortable=True)
    w.take([_msg(1, 200, "X", "F9", 1)])
    wait_until(lambda: w.poll_once() or w.stats.aborts == 1, timeout=10, message="no abort")
    calls.clear()
    w.take([_msg(0, 100, "SLOW", "F1", 1)])  # the replay has reached 100 only when it commits
    w.drain()
    w.checkpoint()
    assert clients.fake_producer.offsets[-1] == [("in", 0, 101), ("in", 1, 200)]
    assert decode_skips(101, clients.fake_producer.metadata[-1][("in", 0)]) == {101, 102}
    w.take([_msg(0, 101, "R2", "F2", 1), _msg(0, 102, "R3", "F3", 1), _msg(0, 103, "R4", "F4", 1)])
    w.drain()
    w.checkpoint()
    assert calls == ["SLOW", "R4"] and w.stats.replay_skipped == 2
    assert clients.fake_producer.offsets[-1] == [("in", 0, 104), ("in", 1, 200)]
    # SLOW was counted as consumed by the first commit (unfinished then): not again on its replay
    s = w.stats
    assert s.consumed == s.processed + s.superseded + s.dead_lettered == 4
    w.calls.shutdown()


def test_a_replay_skips_what_finished_after_the_committed_offset(tmp_path: Path) -> None:
    clients = FakeClients({("in", 0): 100, ("in", 1): 200})
    clients.fake_consumer.metadata[("in", 0)] = "fl1;103;" + __import__("base64").b64encode(bytes([0b001])).decode()
    settings = Settings(home=tmp_path / "home", input_topic="in", state_topic="state", dlq_topic="dlq",
                        directory_topic="dir")
    w = Worker(settings, None, WorkerOptions(worker_id="w1", state_dir=tmp_path / "state"),
               catalog=CATALOG, clients=clients)
    w.connect()
    clients.fake_consumer.callbacks["on_assign"](None, [TopicPartition("in", 0), TopicPartition("in", 1)])
    wait_until(lambda: w.poll_once() or w.assigned_partitions == [0, 1], timeout=10)
    # offset 100 was unfinished when committed; 101 and 102 finished: skipped on the replay
    w.take([_msg(0, 100, "A", "F1", 1), _msg(0, 101, "B", "F2", 1), _msg(0, 102, "C", "F3", 1),
            _msg(0, 103, "D", "F1", 1)])
    assert sorted(k for k, _v in _state(clients)) == [b"reservation/A", b"reservation/D"]
    assert (w.stats.replay_skipped, w.stats.processed) == (2, 2)


def test_window_metadata_round_trip_and_damage() -> None:
    """The commit metadata names exactly the finished offsets after the committed one; damaged
    or foreign metadata skips nothing (a replay is safe, a misread skip would lose events)."""
    from services.worker.window import MAX_WINDOW, Window

    win = Window()
    for o in range(100, 120):
        win.track(o)
    win.track(105)  # a second stage event of the same record
    for o in (101, 102, 105, 110, 119):
        win.untrack(o)
    off, meta = win.commit_point(120)
    assert off == 100
    assert decode_skips(off, meta) == {101, 102, 110, 119}  # 105 has one event left
    win.untrack(100)
    off, meta = win.commit_point(120)
    assert off == 103 and decode_skips(off, meta) == {110, 119}
    for o in set(range(100, 120)) - {100, 101, 102, 110, 119}:
        win.untrack(o)
    win.untrack(105)
    assert win.commit_point(120) == (120, "")
    for bad in ["", "x", "fl1;", "fl1;abc;AQ==", "fl1;130;AQ==", "fl1;105;!!", "fl1;99;AQ==",
                f"fl1;{100 + MAX_WINDOW + 1};AQ==", "other;metadata"]:
        assert decode_skips(100, bad) == set(), bad


def test_counts_are_of_committed_work(tmp_path: Path) -> None:
    """An aborted transaction's counts go with it: the replay counts its records again, so
    processed, superseded and dead-lettered add up to the input once, and Prometheus (which
    reads the committed marks) never sees a counter go back."""
    w, clients = _worker(tmp_path)
    batch = [_msg(0, 100, "R1", "F0", 2), _msg(0, 101, "R1", "F0", 1), _msg(1, 200, "R2", "F1", 1),
             FakeMsg(1, 201, b"F1", b"garbage")]
    w.take(batch)
    assert (w.stats.consumed, w.stats.processed, w.stats.superseded, w.stats.dead_lettered) == (4, 2, 1, 1)
    assert w.stats.mark["processed"] == 0  # not committed yet
    clients.fake_producer.fail = TransactionAbortedError("boom", code="_STATE", abortable=True)
    w.take([_msg(1, 202, "R3", "F1", 1)])  # fails: the open transaction aborts
    assert w.stats.aborts == 1
    assert (w.stats.consumed, w.stats.processed, w.stats.superseded, w.stats.dead_lettered) == (0, 0, 0, 0)
    assert not w.stats.dead_letter_reasons
    w.take([*batch, _msg(1, 202, "R3", "F1", 1)])  # the replay
    w.checkpoint()
    s = w.stats
    assert (s.consumed, s.processed, s.superseded, s.dead_lettered) == (5, 3, 1, 1)
    assert s.mark["processed"] == 3 and s.mark["dead_letter_reasons"] == {"undecodable": 1}


def test_a_call_finishing_after_a_commit_writes_in_a_new_transaction(tmp_path: Path) -> None:
    """A handler call still running at a commit finishes after it: its write (an update, so
    no directory claim opens a transaction first) goes into a new transaction, not to a
    producer with none open (librdkafka refuses that: an abort and a replay every time)."""
    app = App("slow-update")
    gate = threading.Event()

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        if event.version == 2:
            assert gate.wait(10)
        assert event.value is not None
        state.put("reservation", event.value)

    w, clients = _worker(tmp_path, app)
    w.take([_msg(0, 100, "R1", "F1", 1)])
    w.drain()
    w.checkpoint()
    w.take([_msg(0, 101, "R1", "F1", 2)])
    wait_until(lambda: w.poll_once() or w.sched.in_flight == 1, timeout=10, message="v2 running")
    w.checkpoint()  # v2 still runs: committed up to offset 101
    assert clients.fake_producer.offsets[-1] == [("in", 0, 101), ("in", 1, 200)]
    gate.set()
    w.drain()
    w.checkpoint()
    assert (w.stats.aborts, clients.fake_producer.aborts) == (0, 0)
    assert _state(clients) == [(b"reservation/R1", 1), (b"reservation/R1", 2)]
    assert clients.fake_producer.offsets[-1] == [("in", 0, 102), ("in", 1, 200)]
    w.calls.shutdown()


def test_an_exactly_once_commit_flushes_before_it_sends_the_offsets(tmp_path: Path) -> None:
    """#16: offsets sent while the transaction's first records still wait for
    AddPartitionsToTxn are refused and retried on a longer back-off, so the commit flushes
    first, for STALL_S. A flush that leaves records undelivered then (mostly: behind a record
    Kafka refused, which librdkafka never sends) sends the offsets anyway, and the commit flushes
    the rest in calls of STALL_S, each of which first checks whether the transaction failed: a
    slow flush commits, a refused record aborts (and the input is replayed)."""
    w, clients = _worker(tmp_path)
    fake = clients.fake_producer
    calls: list[str] = []
    left = [0]
    real_send, real_commit = fake.send_offsets, fake.commit
    outcomes: list[Exception | None] = []

    def flush(timeout: float) -> int:
        calls.append("flush")
        return left[0]

    def send_offsets(offsets: Any, group_metadata: Any, timeout: float) -> None:
        calls.append("send_offsets")
        real_send(offsets, group_metadata, timeout)

    def commit(timeout: float) -> None:
        calls.append("commit")
        outcome = outcomes.pop(0) if outcomes else None
        if outcome is not None:
            raise outcome
        real_commit(timeout)

    fake.flush = flush  # type: ignore[method-assign]
    fake.send_offsets = send_offsets  # type: ignore[method-assign]
    fake.commit = commit  # type: ignore[method-assign]
    w.take([_msg(0, 100, "R1", "F0", 1)])
    w.checkpoint()
    assert calls == ["flush", "send_offsets", "commit"]
    assert (fake.commits, w.stats.aborts) == (1, 0)
    left[0] = 3  # three records not delivered in STALL_S
    flushing = KafkaRetriableError("commit_transaction: Failed to flush all outstanding messages within the API "
                                   "timeout: 3 message(s) remaining", code="_TIMED_OUT", retriable=True)
    for then in (None, TransactionAbortedError(  # a slow flush; a record refused meanwhile
            "commit_transaction: Broker: Message size too large", code="MSG_SIZE_TOO_LARGE", abortable=True,
            refused=True)):
        calls.clear()
        outcomes[:] = [flushing, flushing, then]
        w.take([_msg(0, 101 if then is None else 102, "R2" if then is None else "R3", "F0", 1)])
        w.checkpoint()
        assert calls == ["flush", "send_offsets", "commit", "commit", "commit"]
    assert (fake.commits, w.stats.aborts) == (2, 1)
    assert sorted(clients.fake_consumer.seeks) == [("in", 0, 102), ("in", 1, 200)]
    assert w.stores.stores[0].get(b"reservation/R2") is not None
    assert w.stores.stores[0].get(b"reservation/R3") is None


def test_at_least_once_commits_when_the_input_pauses_not_at_every_gap(tmp_path: Path) -> None:
    """#16 and #13: at-least-once output is visible uncommitted, so a gap between fetches
    (the next record arrives within the 100 ms wait) does not commit, while a pause (the wait
    ends with nothing) commits at once rather than at the interval: the input offsets do not
    lag behind the output by a whole interval after a burst."""
    w, clients = _worker(tmp_path, guarantee="at-least-once", commit_interval=600.0)
    consumer = clients.fake_consumer
    arriving = [_msg(0, 101, "R2", "F0", 1)]
    consumer.poll = lambda timeout: arriving.pop(0) if arriving else None  # type: ignore[method-assign]
    consumer.batches.append([_msg(0, 100, "R1", "F0", 1)])
    w.poll_once()  # takes R1
    w.poll_once()  # nothing fetched; R2 arrives within the wait: taken, no commit
    assert (w.stats.commits, w.stats.consumed) == (0, 2)
    assert sorted(k for k, _v in _state(clients)) == [b"reservation/R1", b"reservation/R2"]
    w.poll_once()  # the wait ends with nothing: commit now
    assert w.stats.commits == 1
    assert w.committed
    w.poll_once()  # still nothing, and nothing open: no empty commits
    assert w.stats.commits == 1


def test_partitions_lost_while_a_call_outlives_the_commit(tmp_path: Path) -> None:
    """A worker paused past its session (SIGSTOP) loses its partitions while a handler call
    that outlived the last commit still runs, and no transaction is open: the call's result
    is dropped and every partition rewinds (the worker crashed with a KeyError on the lost
    partition when the call finished: tests/faults/test_worker_pauses.py in CI)."""
    app, gate, calls = _slow_app()
    w, clients = _worker(tmp_path, app)
    w.take([_msg(0, 100, "SLOW", "F1", 1), _msg(0, 101, "R2", "F2", 1), _msg(1, 200, "R3", "F3", 1)])
    wait_until(lambda: w.poll_once() or sorted(calls) == ["R2", "R3", "SLOW"] and w.sched.in_flight == 1,
               timeout=10, message=lambda: str(calls))
    w.checkpoint()  # SLOW still runs; R2 and R3 committed
    assert w.ckpt is not None and not w.ckpt.is_open
    aborts = w.stats.aborts
    threading.Timer(0.2, gate.set).start()  # SLOW finishes while the loss is handled
    clients.fake_consumer.callbacks["on_lost"](None, [TopicPartition("in", 0)])
    assert w.assigned_partitions == [1]
    assert w.sched.idle() and w.sched.in_flight == 0  # SLOW's result was dropped, not applied
    assert w.stats.aborts == aborts + 1 and clients.fake_producer.renewals == 0
    assert ("in", 1, 201) in clients.fake_consumer.seeks  # ours rewinds to its commit
    for _ in range(20):
        w.poll_once()  # and goes on: no KeyError for the lost partition
    w.checkpoint()
    assert sorted(k for k, _v in _state(clients)) == [b"reservation/R2", b"reservation/R3"]
    w.calls.shutdown()


def test_a_stop_racing_a_fenced_commit_leaves_cleanly(tmp_path: Path) -> None:
    """Seen in the fault suite: a rebalance fences the commit (ILLEGAL_GENERATION: in doubt,
    so the committed offsets decide) while SIGTERM is closing the consumer, which then cannot
    answer (_DESTROY). The worker must leave without an error: the transaction counts as not
    committed, and nothing reaches the local store (the next owner's restore catches up)."""
    w, clients = _worker(tmp_path)
    w.take([_msg(0, 100, "R1", "F0", 1)])
    fenced = TransactionAbortedError("send_offsets_to_transaction: Specified group generation id is not valid",
                                     code="ILLEGAL_GENERATION", abortable=True)

    def send_offsets(offsets: Any, group_metadata: Any, timeout: float) -> None:
        w.stop()  # SIGTERM arrives meanwhile
        raise fenced

    def committed(partitions: Any, timeout: float) -> Any:
        raise KafkaRetriableError("committed offsets: Local: Broker handle destroyed for termination",
                                  code="_DESTROY", retriable=True)

    clients.fake_producer.send_offsets = send_offsets  # type: ignore[method-assign]
    clients.fake_consumer.committed = committed  # type: ignore[method-assign]
    w.checkpoint()  # raised KafkaRetriableError before
    assert w.stats.aborts == 1 and w.stats.mark["processed"] == 0
    assert all(not st.overlay for st in w.stores.stores.values())
    assert w.stores.stores[0].committed_version(b"reservation/R1") is None


def test_inline_calls_leave_the_pool_calls_average_alone(tmp_path: Path) -> None:
    """The average call time sizes the group queues for handlers off the poll thread
    (services.worker.limits.buffer_limit); inline calls are not timed and leave it at 0, while
    the same handler on the pool sets it."""
    for inline in (True, False):
        app = App(f"inline-{inline}")
        seen: list[str] = []

        @app.handler("reservation", inline=inline)
        def handle(event: Event, state: GroupState, seen: list[str] = seen) -> None:
            assert event.value is not None
            seen.append(event.key)
            state.put("reservation", {**event.value, "state": "CONFIRMED"})

        w, clients = _worker(tmp_path / str(inline), app)
        w.take([_msg(0, 100, "R1", "F0", 1), _msg(0, 101, "R2", "F0", 1), _msg(1, 200, "R3", "F1", 1)])
        w.checkpoint(drain=True)
        assert sorted(seen) == ["R1", "R2", "R3"] and w.stats.processed == 3
        assert sorted(_state(clients)) == [(b"reservation/R1", 1), (b"reservation/R2", 1), (b"reservation/R3", 1)]
        assert (w.processing.avg_call == 0.0) is inline
        w.close()


def test_a_returned_output_kafka_cannot_take_is_dead_lettered_not_a_crash(tmp_path: Path) -> None:
    """Outputs a handler returns skip emit()'s checks: check_effects refuses them whole
    (a header value that is not bytes once stopped the worker with a TypeError)."""
    from services.worker.app import Output

    app = App("returns")

    @app.handler("reservation", inline=True)
    def handle(event: Event, state: GroupState) -> Any:
        assert event.value is not None
        state.put("reservation", event.value)
        return {"R1": Output("out", "k", b"v", (("h", 7),)),  # type: ignore[arg-type]
                "R2": Output("out", 42, b"v"),  # type: ignore[arg-type]
                "R4": {"topic": "out"},
                "R5": Output("out", "k", b"v", (["h", b"x"],))}.get(event.key, Output("out", event.key, b"v"))  # type: ignore[arg-type]

    w, clients = _worker(tmp_path, app, retries=0)
    w.take([_msg(0, 100, "R1", "F0", 1), _msg(0, 101, "R2", "F1", 1), _msg(0, 102, "R3", "F2", 1),
            _msg(0, 103, "R4", "F3", 1), _msg(0, 104, "R5", "F4", 1)])
    w.checkpoint()
    assert (w.stats.processed, w.stats.dead_lettered, w.stats.aborts) == (1, 4, 0)
    dead = [dict(h) for t, _v, _k, _p, h in clients.fake_producer.records if t == "dlq"]
    assert [d["fifolane.dlq.reason"] for d in dead] == [b"handler-error"] * 4
    assert b"a header must be a (str, bytes) pair" in dead[3]["fifolane.dlq.error"]  # a list: not for Kafka
    assert b"a header must be a (str, bytes) pair" in dead[0]["fifolane.dlq.error"]
    assert b"the key must be bytes, str or None, not int" in dead[1]["fifolane.dlq.error"]
    assert b"may return None, an Output or Outputs, got dict" in dead[2]["fifolane.dlq.error"]
    assert [k for t, _v, k, _p, _h in clients.fake_producer.records if t == "out"] == ["R3"]
    assert _state(clients) == [(b"reservation/R3", 1)]


def test_emit_takes_header_pairs_given_as_lists(tmp_path: Path) -> None:
    """confluent-kafka takes header pairs as tuples only (a list pair stopped the worker with a
    TypeError): emit() makes them tuples."""
    app = App("list-headers")

    @app.handler("reservation", inline=True)
    def handle(event: Event, state: GroupState) -> None:
        state.emit("out", event.key, b"v", [["h", b"x"], ("i", "y")])

    w, clients = _worker(tmp_path, app)
    w.take([_msg(0, 100, "R1", "F0", 1)])
    w.checkpoint()
    assert (w.stats.processed, w.stats.dead_lettered) == (1, 0)
    assert [h for t, _v, _k, _p, h in clients.fake_producer.records if t == "out"] == [[("h", b"x"), ("i", "y")]]


def _counting_app(inline: bool) -> App:
    """Each reservation is stored, and its flight's ``flight_load`` counts the seats: written
    once per event, as the flights app does."""
    app = App("counting")

    @app.handler("reservation", inline=inline)
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        load = state.get("flight_load", event.group)
        sold = load["seats_sold"] if load else 0
        state.put("reservation", event.value)
        state.put("flight_load", {"flight_number": event.group, "seats_sold": sold + 1, "capacity": 9,
                                  "rejected_seats": 0, "version": (load["version"] if load else 0) + 1})

    return app


def _state_records(clients: FakeClients) -> list[tuple[bytes, int | None]]:
    """(entity key, version) of every state record in order; None: a tombstone."""
    return [(k, None if v is None else CODEC.decode(v).version)
            for t, v, k, _p, _h in clients.fake_producer.records if t == "state"]


@pytest.mark.parametrize("inline", [True, False])
def test_an_entity_written_many_times_in_a_batch_gets_one_state_record(tmp_path: Path, inline: bool) -> None:
    """The state topic gets an entity's latest row once per consumed batch: a flight's load,
    written for each of its reservations, is one record (its last version), the reservations
    one each; the coalesced writes are counted, and every record is in the transaction that
    commits them (sent before the commit)."""
    w, clients = _worker(tmp_path, _counting_app(inline), concurrency=4)
    sent_at_commit: list[int] = []
    commit = clients.fake_producer.commit
    clients.fake_producer.commit = lambda timeout: (  # type: ignore[method-assign]
        sent_at_commit.append(len(clients.fake_producer.records)), commit(timeout))[1]
    w.take([_msg(0, 100 + i, f"R{i}", "F1", 1) for i in range(5)] + [_msg(1, 200, "R9", "F2", 1)])
    w.drain()
    w.checkpoint()
    state = _state_records(clients)
    loads = [(k, v) for k, v in state if k.startswith(b"flight_load/")]
    assert sorted(k for k, _v in state if k.startswith(b"reservation/")) == sorted(
        f"reservation/R{i}".encode() for i in (0, 1, 2, 3, 4, 9))
    if inline:  # one batch: one record per load, its last version
        assert sorted(loads) == [(b"flight_load/F1", 5), (b"flight_load/F2", 1)]
        assert w.stats.state_coalesced == 4
    else:  # calls finish apart: a load's records are of rising versions, the last one 5
        assert [v for k, v in loads if k == b"flight_load/F1"][-1] == 5
        assert [v for k, v in loads if k == b"flight_load/F1"] == sorted(v for k, v in loads if k == b"flight_load/F1")
        assert w.stats.state_coalesced == 6 - len(loads)
    assert w.stats.state_writes == 12
    assert sent_at_commit == [len(clients.fake_producer.records)]  # all before the commit
    w.take([_msg(0, 105, "R5", "F1", 1)])  # the next batch sends the load again
    w.drain()
    w.checkpoint()
    assert _state_records(clients)[-2:] in ([(b"reservation/R5", 1), (b"flight_load/F1", 6)],
                                            [(b"flight_load/F1", 6), (b"reservation/R5", 1)])
    w.calls.shutdown()


def test_an_abort_drops_the_state_records_a_batch_held_back(tmp_path: Path) -> None:
    """A transaction that aborts before its held-back state records went out sends none of
    them; its replay sends each entity's latest record once."""
    w, clients = _worker(tmp_path, _counting_app(inline=True), directory=False)  # no claims: the
    batch = [_msg(0, 100, "R1", "F1", 1), _msg(0, 101, "R2", "F1", 1)]  # first record sent is a held one
    clients.fake_producer.fail = TransactionAbortedError("queue in error state", code="_STATE", abortable=True)
    w.take(batch)  # the first record held back fails: the batch aborts
    assert clients.fake_producer.records == []
    assert w.stats.aborts == 1 and w.stats.state_coalesced == 0
    assert all(not st.unsent and not st.overlay for st in w.stores.stores.values())
    w.take(batch)  # the replay
    w.checkpoint()
    records = _state_records(clients)
    assert sorted(records[-3:]) == [(b"flight_load/F1", 2), (b"reservation/R1", 1), (b"reservation/R2", 1)]
    assert w.stats.state_coalesced == 1


def test_a_delete_held_back_never_follows_a_newer_upsert_of_its_entity(tmp_path: Path) -> None:
    """The table handler sends an upsert at once and holds a delete's tombstone to the end of
    the batch: a newer upsert in the same batch cancels the held tombstone, so the entity's
    last state record is the upsert."""
    w, clients = _worker(tmp_path)
    delete = FakeMsg(0, 101, b"F1", CODEC.encode_delete("reservation", "R1", "F1", 2))
    w.take([_msg(0, 100, "R1", "F1", 1), delete, _msg(0, 102, "R1", "F1", 3), _msg(0, 103, "R2", "F1", 1)])
    w.checkpoint()
    assert _state_records(clients) == [(b"reservation/R1", 1), (b"reservation/R1", 3), (b"reservation/R2", 1)]
    w.take([FakeMsg(0, 104, b"F1", CODEC.encode_delete("reservation", "R2", "F1", 2))])
    w.checkpoint()
    assert _state_records(clients)[-1] == (b"reservation/R2", None)  # a tombstone
    assert w.stats.processed == 5


def test_at_least_once_sends_each_write_at_once_in_write_order(tmp_path: Path) -> None:
    """At-least-once output is visible as it is sent, and a crash leaves a prefix of it: each
    write's record goes out at once, in write order (a flight's load after the reservation it
    counts), none held back or coalesced. (Held, the load went out at its first write of the
    batch, already counting later reservations whose records a crash could lose: a restart
    then counted their seats again.)"""
    w, clients = _worker(tmp_path, _counting_app(inline=True), guarantee="at-least-once")
    w.take([_msg(0, 100 + i, f"R{i}", "F1", 1) for i in range(3)])
    assert all(not st.unsent for st in w.stores.stores.values())
    assert _state_records(clients) == [(b"reservation/R0", 1), (b"flight_load/F1", 1), (b"reservation/R1", 1),
                                       (b"flight_load/F1", 2), (b"reservation/R2", 1), (b"flight_load/F1", 3)]
    w.checkpoint()
    assert (w.stats.state_writes, w.stats.state_coalesced) == (6, 0)


def test_at_least_once_commits_offsets_without_waiting_except_when_partitions_go(tmp_path: Path) -> None:
    """At-least-once sends its interval commits' offsets and goes on (the output they cover is
    flushed first); before partitions are given up, and when stopping, it waits for them."""
    w, clients = _worker(tmp_path, guarantee="at-least-once", commit_interval=600.0)
    consumer = clients.fake_consumer
    w.take([_msg(0, 100, "R1", "F0", 1), _msg(1, 200, "R2", "F1", 1)])
    w.checkpoint()
    assert consumer.commits == [([("in", 0, 101), ("in", 1, 201)], False)]
    assert clients.fake_producer.offsets == []  # never a transaction's offsets
    w.take([_msg(0, 101, "R3", "F0", 1)])
    consumer.callbacks["on_revoke"](None, [TopicPartition("in", 0), TopicPartition("in", 1)])
    assert consumer.commits[1] == ([("in", 0, 102), ("in", 1, 201)], True)
    assert sorted(_state(clients)) == [(b"reservation/R1", 1), (b"reservation/R2", 1), (b"reservation/R3", 1)]


def test_exactly_once_sends_offsets_with_the_transaction_only(tmp_path: Path) -> None:
    w, clients = _worker(tmp_path)
    w.take([_msg(0, 100, "R1", "F0", 1)])
    w.checkpoint()
    assert clients.fake_consumer.commits == []
    assert clients.fake_producer.offsets[-1] == [("in", 0, 101), ("in", 1, 200)]
