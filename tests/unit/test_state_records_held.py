"""State records held back to the end of a batch (TableApplier.write -> PartitionStore.unsent
-> TableApplier.send_unsent), without a broker: counts, per-entity order, every record in the
transaction of its write (revoke, loss, at-least-once, move-outs), and Kafka errors while
sending (an abort, never a hang). Written by a review that tried to break the change; the
end-to-end counterpart is tests/integration/test_flights_example.py."""

from __future__ import annotations

import threading
from datetime import date
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from fake_kafka import FakeClients, FakeMsg
from kafka_fixtures import wait_until
from test_worker_guarantees import CODEC, _counting_app, _msg, _state_records, _worker

from fifolane.errors import TransactionAbortedError
from services.worker.app import App, Event, GroupState


def _flight(fid: str, version: int) -> dict[str, Any]:
    return {"flight_number": fid, "origin": "FRA", "destination": "JFK", "departure": date(2026, 1, 1),
            "capacity": 3, "version": version}


def _delete(p: int, offset: int, rid: str, flight: str, version: int) -> FakeMsg:
    return FakeMsg(p, offset, flight.encode(), CODEC.encode_delete("reservation", rid, flight, version))


def _records_in_commits(clients: FakeClients) -> list[int]:
    """Wrap the fake producer's commit: the number of records produced at each commit."""
    at: list[int] = []
    commit = clients.fake_producer.commit

    def wrapped(timeout: float) -> None:
        at.append(len(clients.fake_producer.records))
        commit(timeout)

    clients.fake_producer.commit = wrapped  # type: ignore[method-assign]
    return at


# -- counters -----------------------------------------------------------------------------------

def test_a_held_tombstone_an_upsert_replaces_counts_as_coalesced(tmp_path: Path) -> None:
    """Table handler: upsert R1 v1 (sent), delete R1 v2 (held), upsert R1 v3 (sent, drops the
    held tombstone). 4 writes, 3 state records: the replaced one counts as coalesced, so
    records = state_writes - state_coalesced (as the end-to-end test asserts)."""
    w, clients = _worker(tmp_path)
    w.take([_msg(0, 100, "R1", "F1", 1), _delete(0, 101, "R1", "F1", 2), _msg(0, 102, "R1", "F1", 3),
            _msg(0, 103, "R2", "F1", 1)])
    w.checkpoint()
    records = _state_records(clients)
    assert records == [(b"reservation/R1", 1), (b"reservation/R1", 3), (b"reservation/R2", 1)]
    assert w.stats.state_writes == 4
    assert len(records) == w.stats.state_writes - w.stats.state_coalesced


def test_a_held_handler_write_an_upsert_replaces_counts_as_coalesced(tmp_path: Path) -> None:
    """An app handler (reservation) writes a flight entity, whose own type is the table
    handler's; in the same batch a flight upsert (fast path) replaces the held write."""
    app = App("writes-flight")

    @app.handler("reservation", inline=True)
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        state.put("reservation", event.value)
        state.put("flight", _flight(event.group, 5))

    w, clients = _worker(tmp_path, app)
    w.take([_msg(0, 100, "R1", "F1", 1), FakeMsg(0, 101, b"F1", CODEC.encode("flight", _flight("F1", 6)))])
    w.checkpoint()
    records = _state_records(clients)
    assert sorted(records) == [(b"flight/F1", 6), (b"reservation/R1", 1)]  # the held v5: replaced
    assert w.stats.state_writes == 3
    assert len(records) == w.stats.state_writes - w.stats.state_coalesced


def test_coalesced_counts_are_rolled_back_with_an_abort(tmp_path: Path) -> None:
    """state_coalesced is transactional: counted writes of an aborted commit go."""
    w, clients = _worker(tmp_path, _counting_app(inline=True))
    w.take([_msg(0, 100 + i, f"R{i}", "F1", 1) for i in range(3)])
    assert w.stats.state_coalesced == 2
    clients.fake_producer.commit = lambda timeout: (_ for _ in ()).throw(  # type: ignore[method-assign]
        TransactionAbortedError("refused", code="_STATE", abortable=True))
    w.checkpoint()
    assert w.stats.aborts == 1 and w.stats.state_coalesced == 0


# -- order --------------------------------------------------------------------------------------

def test_write_upsert_write_of_one_entity_keeps_order(tmp_path: Path) -> None:
    """delete v2 (held), upsert v3 (sent now), delete v4 (held again): v3 then a v4 tombstone;
    never the v2 tombstone after v3. Across batches too."""
    w, clients = _worker(tmp_path)
    w.take([_msg(0, 100, "R1", "F1", 1), _delete(0, 101, "R1", "F1", 2), _msg(0, 102, "R1", "F1", 3),
            _delete(0, 103, "R1", "F1", 4)])
    w.take([_msg(0, 104, "R1", "F1", 5), _delete(0, 105, "R1", "F1", 6)])
    w.checkpoint()
    got = [(k, v, dict(h).get("fifolane.version")) for t, v, k, _p, h in clients.fake_producer.records
           if t == "state"]
    versions = [CODEC.decode(v).version if v is not None else int(hv) for _k, v, hv in got]
    assert versions == [1, 3, 4, 5, 6]


def test_non_inline_handler_and_table_upserts_interleave_in_order(tmp_path: Path) -> None:
    """A pool handler writes the flight (held), then the fast path upserts newer flight
    versions in later batches while more handler writes come: the flight's records rise."""
    app = App("pool-writes-flight")

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        cur = state.get("flight", event.group)
        state.put("reservation", event.value)
        state.put("flight", {**_flight(event.group, 0), "capacity": 7,
                             "version": (cur["version"] if cur else 0) + 1})

    w, clients = _worker(tmp_path, app, concurrency=4)
    off = 100
    for round_ in range(6):
        batch = [_msg(0, off, f"R{round_}", "F1", 1)]
        off += 1
        w.take(batch)
        w.poll_once()
        ver = w.stores.stores[0].get(b"flight/F1")
        batch = [FakeMsg(0, off, b"F1", CODEC.encode("flight", _flight("F1", (ver.version if ver else 0) + 1)))]
        off += 1
        w.take(batch)
        if round_ % 2:
            w.checkpoint()
    w.drain()
    w.checkpoint()
    flights = [v for k, v in _state_records(clients) if k == b"flight/F1"]
    assert flights == sorted(set(flights)), flights
    assert flights[-1] == w.stores.stores[0].get(b"flight/F1").version  # type: ignore[union-attr]
    w.calls.shutdown()


# -- every record in the transaction of its write -----------------------------------------------

def test_records_held_at_a_revoke_go_into_the_commit_before_it(tmp_path: Path) -> None:
    """Pool handler writes still held (not yet through a send point) when the rebalance
    revokes: on_revoke's checkpoint drains, sends them, then commits; nothing after."""
    app = _counting_app(inline=False)
    w, clients = _worker(tmp_path, app, concurrency=4)
    at = _records_in_commits(clients)
    w.take([_msg(0, 100 + i, f"R{i}", "F1", 1) for i in range(4)] + [_msg(1, 200, "R9", "F2", 1)])
    clients.fake_consumer.callbacks["on_revoke"](None, [TopicPartition("in", 0), TopicPartition("in", 1)])
    assert at == [len(clients.fake_producer.records)]
    records = _state_records(clients)
    assert (b"flight_load/F1", 4) in records and (b"flight_load/F2", 1) in records
    assert w.assigned_partitions == [] and not w.stores.stores
    w.calls.shutdown()


def test_a_lost_partition_drops_its_held_records(tmp_path: Path) -> None:
    """Partitions lost with writes in the open transaction: aborted, nothing held survives
    (the store closes; nothing is sent later)."""
    w, clients = _worker(tmp_path, _counting_app(inline=True))
    w.take([_msg(0, 100, "R1", "F1", 1)])
    n = len(clients.fake_producer.records)
    clients.fake_consumer.callbacks["on_lost"](None, [TopicPartition("in", 0)])
    assert w.stats.aborts == 1 and clients.fake_producer.aborts == 1
    assert all(not st.unsent and not st.overlay for st in w.stores.stores.values())
    w.poll_once()
    assert len(clients.fake_producer.records) == n


def test_at_least_once_sends_held_records_before_the_offset_commit(tmp_path: Path) -> None:
    w, clients = _worker(tmp_path, _counting_app(inline=False), concurrency=4, guarantee="at-least-once")
    flushed: list[int] = []
    clients.fake_producer.flush = lambda timeout: flushed.append(len(clients.fake_producer.records)) or 0  # type: ignore
    w.take([_msg(0, 100 + i, f"R{i}", "F1", 1) for i in range(3)])
    w.checkpoint(drain=True)
    assert (b"flight_load/F1", 3) in _state_records(clients)
    assert flushed and flushed[-1] == len(clients.fake_producer.records)
    w.calls.shutdown()


# -- a Kafka error in send_unsent ---------------------------------------------------------------

def test_a_send_failing_half_way_in_checkpoint_aborts_whole(tmp_path: Path) -> None:
    """The second held record of a checkpoint's send fails: the transaction aborts (no
    commit), nothing stays held or staged, and the replay sends each entity's latest row."""
    w, clients = _worker(tmp_path, _counting_app(inline=False), concurrency=4)
    w.take([_msg(0, 100, "R1", "F1", 1), _msg(0, 101, "R2", "F1", 1), _msg(1, 200, "R9", "F2", 1)])
    w.sched.dispatch(w.processing._start)  # the calls start (pump would also apply their results)
    wait_until(lambda: w.calls.completions.qsize() == 2, timeout=10)
    produce = clients.fake_producer.produce
    calls = [0]

    def failing(*args: Any, **kw: Any) -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise TransactionAbortedError("broker gone", code="_STATE", abortable=True)
        produce(*args, **kw)

    clients.fake_producer.produce = failing  # type: ignore[method-assign]
    commits = clients.fake_producer.commits
    w.checkpoint()
    assert w.stats.aborts == 1 and clients.fake_producer.commits == commits
    assert all(not st.unsent and not st.overlay for st in w.stores.stores.values())
    assert w.stats.state_writes == w.stats.state_coalesced == 0
    clients.fake_producer.produce = produce  # type: ignore[method-assign]
    clients.fake_producer.records.clear()  # the aborted transaction's
    w.take([_msg(0, 100, "R1", "F1", 1), _msg(0, 101, "R2", "F1", 1), _msg(1, 200, "R9", "F2", 1)])
    w.drain()
    w.checkpoint()
    assert (b"flight_load/F1", 2) in _state_records(clients)
    w.calls.shutdown()


def test_a_send_failing_in_poll_once_aborts(tmp_path: Path) -> None:
    """A pool call's writes are held until poll_once's send after pump: a failure there
    aborts (rewinds), leaves nothing held."""
    app = _counting_app(inline=False)
    w, clients = _worker(tmp_path, app, concurrency=4)
    w.take([_msg(0, 100, "R1", "F1", 1)])
    w.sched.dispatch(w.processing._start)
    wait_until(lambda: w.calls.completions.qsize() == 1, timeout=10)
    clients.fake_producer.fail = TransactionAbortedError("broker gone", code="_STATE", abortable=True)
    w._next_checkpoint = float("inf")
    w.poll_once()
    assert w.stats.aborts == 1 and ("in", 0, 100) in clients.fake_consumer.seeks
    assert all(not st.unsent and not st.overlay for st in w.stores.stores.values())
    w.calls.shutdown()


# -- a write while no transaction is open -------------------------------------------------------

def _poll_in_thread(w: Any, seconds: float = 5.0) -> bool:
    """Run poll_once on a thread; True if it returned within ``seconds``. If it hangs in
    Processing.forget (waiting for a completion no call will send), it is let go."""
    t = threading.Thread(target=w.poll_once, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        for _ in range(w.sched.in_flight or 1):
            w.calls.completions.put(None)  # unblock forget()
        t.join(10)
        return False
    return True


def _slow_app(gate: threading.Event) -> App:
    app = App("slow")

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        if event.key == "R1" and event.group == "F1" and event.version == 2:
            assert gate.wait(10)
        assert event.value is not None
        state.put("reservation", event.value)

    return app


def _flight_op(offset: int, op: str) -> FakeMsg:
    if op == "delete-claimed":  # of a flight not live here: write() claims it (ckpt.produce) first
        return FakeMsg(0, offset, b"F1", CODEC.encode_delete("flight", "F9", "F1", 2))
    if op == "upsert":
        return FakeMsg(0, offset, b"F1", CODEC.encode("flight", _flight("F1", 2)))
    return FakeMsg(0, offset, b"F1", CODEC.encode_delete("flight", "F1", "F1", 2))


@pytest.mark.parametrize("op", ["upsert", "delete", "delete-claimed"])
def test_a_queued_table_write_whose_send_fails(tmp_path: Path, op: str) -> None:
    """The transaction is open; a flight op of group F1 (table handler) waits behind a pool
    call of F1. The call ends, the dispatch applies the flight op inside Processing._start,
    and a record fails to send (an upsert's there, a claim's there, a delete's held one
    after the pump). Lane F1 is busy with no call running: the abort waits only for calls
    that run (HandlerCalls.outstanding), so it does not hang (it waited for one completion
    per busy lane), and the replay applies everything."""
    gate = threading.Event()
    w, clients = _worker(tmp_path, _slow_app(gate), concurrency=4)
    w.take([_msg(0, 100, "R1", "F1", 1), FakeMsg(0, 101, b"F1", CODEC.encode("flight", _flight("F1", 1)))])
    w.drain()
    w.checkpoint()  # R1 and F1 live in F1: no directory claims below (they would send first)
    w.take([_msg(0, 102, "R1", "F1", 2), _flight_op(103, op)])
    w.sched.dispatch(w.processing._start)
    gate.set()
    wait_until(lambda: w.calls.completions.qsize() == 1, timeout=10)
    clients.fake_producer.fail = TransactionAbortedError("broker gone", code="_STATE", abortable=True)
    w._next_checkpoint = float("inf")
    assert _poll_in_thread(w), "poll_once hung in Processing.forget()"
    assert w.stats.aborts == 1
    assert all(not st.unsent and not st.overlay for st in w.stores.stores.values())
    w.take([_msg(0, 102, "R1", "F1", 2), _flight_op(103, op)])  # the replay
    w.drain()
    w.checkpoint()
    assert w.stats.aborts == 1 and (w.stats.processed, w.stats.dead_lettered) == (4, 0)
    w.calls.shutdown()


@pytest.mark.parametrize("op", ["upsert", "delete"])
def test_a_table_write_dispatched_with_no_transaction_open(tmp_path: Path, op: str) -> None:
    """A pool call R1 v2 of group F1 runs across a commit; a flight op of F1 (table handler,
    no directory claim: the flight is live there) waits behind it. R1 v3 (group F2)
    overtakes the call, so its late result opens no transaction. The dispatch of the flight
    op opens one (it produced outside any: refused, then the hang above)."""
    gate = threading.Event()
    w, clients = _worker(tmp_path, _slow_app(gate), concurrency=4)
    w.take([_msg(0, 100, "R1", "F1", 1), FakeMsg(0, 101, b"F1", CODEC.encode("flight", _flight("F1", 1)))])
    w.drain()
    w.checkpoint()
    w.take([_msg(0, 102, "R1", "F1", 2), _flight_op(103, op), _msg(0, 104, "R1", "F2", 3)])
    wait_until(lambda: w.poll_once() or w.calls.completions.qsize() == 0 and w.sched.in_flight == 1
               and w.sched.queued == 2, timeout=10)
    w.checkpoint()  # R1 v2 still runs
    assert not w.ckpt.is_open  # type: ignore[union-attr]
    n = len(clients.fake_producer.records)
    gate.set()
    wait_until(lambda: w.calls.completions.qsize() == 1, timeout=10)
    w._next_checkpoint = float("inf")
    assert _poll_in_thread(w), "poll_once hung in Processing.forget()"
    w.checkpoint()
    assert w.stats.aborts == 0  # the dispatch opened a transaction for the flight op
    flight = [r for r in clients.fake_producer.records[n:] if r[0] == "state" and r[2] == b"flight/F1"]
    assert len(flight) == 1 and (flight[0][1] is None) == (op == "delete")
    w.calls.shutdown()


# -- move-outs ----------------------------------------------------------------------------------

def _move_out(offset: int, ekey: str, group: str, version: int, to: str) -> FakeMsg:
    from services.worker.directory import MoveOut, move_out_record

    key, value, headers = move_out_record(MoveOut(ekey.encode(), group, version, to, False))
    return FakeMsg(0, offset, key, value, headers)  # type: ignore[arg-type]


def _load_app() -> App:
    """Each reservation stores itself and writes its flight's load at 10 x its version."""
    app = App("loads")

    @app.handler("reservation", inline=True)
    def handle(event: Event, state: GroupState) -> None:
        assert event.value is not None
        state.put("reservation", event.value)
        state.put("flight_load", {"flight_number": event.group, "seats_sold": 1, "capacity": 9,
                                  "rejected_seats": 0, "version": 10 * event.version})

    return app


def test_a_move_out_is_sent_in_order_before_the_commit(tmp_path: Path) -> None:
    """A move-out (dispatched by pump) removes flight_load/F1 that a handler wrote in the
    same transaction: its tombstone follows the handler's record, before the commit."""
    w, clients = _worker(tmp_path, _load_app())
    at = _records_in_commits(clients)
    w.take([_msg(0, 100, "R1", "F1", 1), _move_out(101, "flight_load/F1", "F1", 50, "F2")])
    w.checkpoint()
    assert at == [len(clients.fake_producer.records)]
    loads = [(v is None, dict(h).get("fifolane.version")) for t, v, k, _p, h in clients.fake_producer.records
             if t == "state" and k == b"flight_load/F1"]
    assert loads == [(False, None), (True, b"50")]
    assert w.stats.moves_applied == 1


def test_a_move_out_write_counts_and_its_replaced_record_is_coalesced(tmp_path: Path) -> None:
    """The move-out's tombstone is held; in the same pump a newer handler write of the entity
    replaces it: state_writes counts the move-out's write and state_coalesced its replaced
    record, so records = state_writes - state_coalesced holds with move-outs too."""
    w, clients = _worker(tmp_path, _load_app())
    w.take([_msg(0, 100, "R1", "F1", 1)])
    w.checkpoint()
    n = len(clients.fake_producer.records)
    w.take([_move_out(101, "flight_load/F1", "F1", 15, "F2"), _msg(0, 102, "R2", "F1", 2)])  # both queued
    w.checkpoint()
    state = [(k, v is None) for t, v, k, _p, _h in clients.fake_producer.records[n:] if t == "state"]
    s = w.stats
    assert sorted(state) == [(b"flight_load/F1", False), (b"reservation/R2", False)]  # the tombstone: replaced
    assert (s.state_writes, s.state_coalesced, s.moves_applied) == (5, 1, 1)  # a move-out's write counts
    assert len(state) + 2 == s.state_writes - s.state_coalesced
