"""The worker's ingest without a broker: the table fast path equals the general path.

``Worker.take`` applies well-formed table upserts on the fast path and hands everything else
to the general path; ``WorkerOptions(fast_path=False)`` sends everything to the general path.
Both must produce the same records, the same staged state and the same counters for any mix
of records; these tests run one batch both ways (on fake Kafka clients) and compare.
(The end-to-end behaviour against real Kafka is in tests/integration/test_worker_*.py.)
"""

from __future__ import annotations

from datetime import date
from io import BytesIO
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import TopicPartition
from fake_kafka import FakeClients, FakeMsg
from kafka_fixtures import wait_until

from fifolane.config import Settings
from fifolane.errors import StateError, TransactionAbortedError
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.serde.codec import SingleObjectCodec
from services.worker.app import App, Event, GroupState
from services.worker.options import WorkerOptions
from services.worker.runtime import Worker
from services.worker.state import Row

CATALOG = SchemaCatalog.load()


class RecordingSink:
    """A change sink (like the listener runtime) that records what it is told.

    ``record`` may be None for an upsert (the fast path does not decode): like the listener
    runtime, the sink then decodes the new value; ``given`` notes which records came given.
    """

    reads = False  # whether it needs decoded records (like a listener that reads them)

    def __init__(self) -> None:
        self.changes: list[tuple[str, str, int, int | None, bytes, int | None, int, dict[str, Any] | None]] = []
        self.given: list[bool] = []
        self.ctx: Any = None

    def open(self, ctx: Any) -> None:
        self.ctx = ctx

    def on_assign(self, partitions: list[int]) -> None:
        pass

    def ready(self) -> bool:
        return True

    def on_release(self, partitions: list[int]) -> None:
        pass

    def needs_records(self, types: Any) -> bool:
        return self.reads

    def on_change(self, partition: int, offset: int | None, timestamp: int, ekey: bytes, old: Any,
                  new: Any, record: dict[str, Any] | None, moved_to: str | None = None) -> None:
        self.given.append(record is not None)
        if record is None and not new.deleted:
            record = self.ctx.decode(new.value)
        type_, _, key = ekey.decode().partition("/")
        self.changes.append((type_, key, partition, offset, ekey,
                             None if old is None else old.version, new.version, record))

    def after_commit(self) -> None:
        pass

    def after_abort(self) -> None:
        pass

    def close(self) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}


def _settings(tmp_path: Path, state_headers: bool = False) -> Settings:
    return Settings(home=tmp_path / "home", input_topic="in", state_topic="state", dlq_topic="dlq",
                    state_headers=state_headers)


def _worker(tmp_path: Path, name: str, app: App | None = None, sink: Any = None,
            state_headers: bool = False, fast_path: bool = True) -> Worker:
    """A worker on fake clients that owns input partitions 0 and 1 (committed at 100 and 200)."""
    clients = FakeClients({("in", 0): 100, ("in", 1): 200})
    w = Worker(_settings(tmp_path, state_headers), app,
               WorkerOptions(worker_id="w1", state_dir=tmp_path / name, fast_path=fast_path),
               catalog=CATALOG, sink=sink, clients=clients)
    w.connect()
    clients.fake_consumer.callbacks["on_assign"](None, [TopicPartition("in", 0), TopicPartition("in", 1)])
    wait_until(lambda: w.poll_once() or w.assigned_partitions == [0, 1], timeout=10,
               message="partitions restored")
    return w


def _records(w: Worker) -> list[tuple[str, Any, Any, int, list[Any]]]:
    return w.clients.fake_producer.records  # type: ignore[attr-defined, no-any-return]


def _reservation(rid: str, flight: str, version: int, seats: int = 1) -> dict[str, Any]:
    return {"reservation_id": rid, "flight_number": flight, "customer_id": "c1", "seats": seats,
            "amount": 10.0 * seats, "state": "NEW", "version": version}


def _corrupt_reservations(valid: bytes) -> list[bytes]:
    """Reservation values a field scanner must leave to the decoder (which refuses them)."""
    header = valid[:10]  # single-object magic + the reservation fingerprint
    loose = fastavro.parse_schema({"type": "record", "name": "Loose", "fields": [
        {"name": "reservation_id", "type": "string"}, {"name": "flight_number", "type": "string"},
        {"name": "customer_id", "type": "bytes"}, {"name": "seats", "type": "int"},
        {"name": "amount", "type": "double"}, {"name": "state", "type": "int"},
        {"name": "version", "type": "long"}]}, named_schemas={})

    def body(**changes: Any) -> bytes:
        out = BytesIO()
        fastavro.schemaless_writer(out, loose, {**_reservation("R6", "F2", 1), "customer_id": b"c",
                                                "state": 0, **changes})
        return header + out.getvalue()

    return [valid[:-1], valid + b"\x00", body(customer_id=b"\xff\xfe"), body(state=9)]


def _batch() -> list[FakeMsg]:
    codec = make_codec(Settings(), CATALOG)
    enc = codec.encode
    corrupt = _corrupt_reservations(enc("reservation", _reservation("R6", "F2", 1)))
    specs: list[tuple[int, bytes | None, bytes | None]] = [
        (0, b"F1", enc("reservation", _reservation("R1", "F1", 1))),
        (0, b"F1", enc("reservation", _reservation("R2", "F1", 1))),
        (1, b"F2", enc("reservation", _reservation("R3", "F2", 5))),
        (0, b"F1", enc("reservation", _reservation("R1", "F1", 2, seats=3))),  # newer
        (0, b"F1", enc("reservation", _reservation("R1", "F1", 2))),  # duplicate version: stale
        (1, b"F2", enc("reservation", _reservation("R3", "F2", 4))),  # older: stale
        (0, b"F1", codec.encode_delete("reservation", "R2", "F1", 7)),  # delete (general path)
        (0, b"F1", enc("reservation", _reservation("R2", "F1", 6))),  # older than the delete
        (1, b"F9", enc("reservation", _reservation("R4", "F2", 1))),  # key is not the group
        (1, None, enc("reservation", _reservation("R5", "F2", 1))),  # no key
        (1, b"F2", b"\xc3\x01" + bytes(8) + b"\x02"),  # unknown schema (fingerprint 0)
        (1, b"F2", b"not avro"),  # undecodable
        (1, b"F2", None),  # null value
        (0, b"F3", enc("flight", {"flight_number": "F3", "origin": "FRA", "destination": "JFK",
                                  "departure": date(2026, 1, 1), "capacity": 3, "version": 1})),
        *[(1, b"F2", value) for value in corrupt],  # truncated, trailing byte, not UTF-8, enum 9
        (1, b"F2", enc("reservation", _reservation("R3", "F2", 9))),
    ]
    offsets = {0: 100, 1: 200}
    out = []
    for p, key, value in specs:
        out.append(FakeMsg(p, offsets[p], key, value, [("fifolane.seq", str(offsets[p]).encode())]))
        offsets[p] += 1
    return out


def _outcome(w: Worker) -> dict[str, Any]:
    s = w.stats
    assert w.ckpt is not None
    return {
        "records": _records(w),
        "overlay": {p: dict(st.overlay) for p, st in w.stores.stores.items()},
        "counts": (s.consumed, s.processed, s.superseded, s.dead_lettered, s.state_writes,
                   dict(s.dead_letter_reasons)),
        "offsets": dict(w.ckpt.sources["in"].next),
    }


def _same(fast: Worker, slow: Worker) -> None:
    """The fast and the general path's outcomes are equal; if not, say exactly where (the
    default diff of two long record lists is cut before the records that differ)."""
    a, b = _outcome(fast), _outcome(slow)
    if a == b:
        return
    lines = [f"{k}: fast {a[k]!r} != general {b[k]!r}" for k in a if k != "records" and a[k] != b[k]]
    ra, rb = a["records"], b["records"]
    if ra != rb:
        lines.append(f"records: {len(ra)} on the fast path, {len(rb)} on the general path")
        for i in range(max(len(ra), len(rb))):
            x, y = (ra[i] if i < len(ra) else None), (rb[i] if i < len(rb) else None)
            if x != y:
                lines.append(f"  [{i}] fast    {x!r}\n  [{i}] general {y!r}")
    raise AssertionError("\n".join(lines))


class ReadingSink(RecordingSink):
    """A sink with a listener for every type: it wants the records decoded up front."""

    reads = True


SCANS: list[Any] = []  # what the codec's field scanner answered, in the fast worker


@pytest.fixture(autouse=True)
def _count_scans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Record the answers of the codec's field scanner (the fast path reads upserts with it)."""
    SCANS.clear()
    make = SingleObjectCodec.scanner

    def scanner(self: Any, types: Any) -> Any:
        scan = make(self, types)

        def counted(value: bytes) -> Any:
            found = scan(value)
            SCANS.append(found)
            return found

        return counted

    monkeypatch.setattr(SingleObjectCodec, "scanner", scanner)


def _run_both(tmp_path: Path, app: App | None = None, with_sink: bool = False,
              state_headers: bool = False, sink: type[RecordingSink] = RecordingSink) -> tuple[Any, Any, Any, Any]:
    fast_sink, slow_sink = (sink(), sink()) if with_sink else (None, None)
    slow = _worker(tmp_path, "slow", app, slow_sink, state_headers, fast_path=False)
    fast = _worker(tmp_path, "fast", app, fast_sink, state_headers)
    SCANS.clear()
    fast.take(_batch())
    slow.take(_batch())
    fast.drain()
    slow.drain()
    return fast, slow, fast_sink, slow_sink


@pytest.mark.parametrize("state_headers", [False, True])
def test_fast_path_equals_general_path(tmp_path: Path, state_headers: bool) -> None:
    fast, slow, _, _ = _run_both(tmp_path, state_headers=state_headers)
    _same(fast, slow)
    s = fast.stats
    # 19 records: 7 applied (R1 twice, R2, R3 twice, the delete, the flight), 3 stale, 9 bad
    assert (s.consumed, s.processed, s.superseded, s.dead_lettered) == (19, 7, 3, 9)
    assert dict(s.dead_letter_reasons) == {"missing-group": 2, "unknown-schema": 1, "undecodable": 6}
    state = [(key, value, part, dict(h)) for topic, value, key, part, h in _records(fast)
             if topic == "state"]
    # upserts leave at once; the delete's tombstone (a write: TableApplier.send_unsent) at the
    # end of the batch
    assert [k for k, *_ in state] == [b"reservation/R1", b"reservation/R2", b"reservation/R3",
                                      b"reservation/R1", b"flight/F3", b"reservation/R3", b"reservation/R2"]
    tombstone_headers = {"fifolane.type": b"reservation", "fifolane.group": b"F1", "fifolane.version": b"7"}
    assert state[6][1] is None and state[6][3] == tombstone_headers  # a tombstone keeps its version
    # upserts carry group and version in their value; headers only if the settings ask
    upsert_headers = [h for i, (_k, _v, _p, h) in enumerate(state) if i != 6]
    if state_headers:
        assert state[3][3] == {"fifolane.type": b"reservation", "fifolane.group": b"F1", "fifolane.version": b"2"}
        assert state[4][3] == {"fifolane.type": b"flight", "fifolane.group": b"F3", "fifolane.version": b"1"}
    else:
        assert upsert_headers == [{}] * 6
    assert fast.ckpt.sources["in"].next == {0: 107, 1: 212}
    assert fast.ckpt.sources["in"].base == {0: 100, 1: 200}
    assert fast.clients.fake_producer.transactions == 1  # type: ignore[attr-defined]
    # the scanner answered for the 10 well-formed reservation upserts (R4 and R5 then fail the
    # key checks), and left the rest (the delete, the flight with its date, bad bytes) to decode
    assert sum(found is not None for found in SCANS) == 10


def test_a_full_producer_queue_loses_no_record(tmp_path: Path) -> None:
    """The table applier sends with the client's own produce; when the local queue is full
    (BufferError) it produces the record again through the producer that waits for room."""
    _fast, slow, _, _ = _run_both(tmp_path)
    fast = _worker(tmp_path, "full", None, None)
    fast.clients.fake_producer.full = 4  # type: ignore[attr-defined]
    fast.take(_batch())
    fast.drain()
    assert fast.clients.fake_producer.full == 0  # type: ignore[attr-defined]
    assert fast.clients.fake_producer.queue_full == 4  # type: ignore[attr-defined]  # each counted
    _same(fast, slow)


def test_fast_path_tells_change_sinks_the_same(tmp_path: Path) -> None:
    _fast, _slow, fast_sink, slow_sink = _run_both(tmp_path, with_sink=True)
    assert fast_sink.changes == slow_sink.changes
    assert [(c[1], c[5], c[6]) for c in fast_sink.changes] == [
        ("R1", None, 1), ("R2", None, 1), ("R3", None, 5), ("R1", 1, 2), ("R2", 1, 7), ("F3", None, 1), ("R3", 5, 9)]
    assert fast_sink.changes[3][7] == _reservation("R1", "F1", 2, seats=3)
    # scanned upserts reach the sink undecoded (it decodes only if a listener needs it); only
    # the flight (a date field: decoded) comes with its record, and a delete has none
    assert fast_sink.given == [False, False, False, False, False, True, False]
    assert all(slow_sink.given[i] for i in (0, 1, 2, 3, 5, 6))


def test_fast_path_decodes_for_sinks_that_read_records(tmp_path: Path) -> None:
    """When a listener will read the records, the fast path decodes them once, up front."""
    fast, _slow, fast_sink, slow_sink = _run_both(tmp_path, with_sink=True, sink=ReadingSink)
    assert fast_sink.changes == slow_sink.changes
    assert fast_sink.given == [True, True, True, True, False, True, True]  # all but the delete
    assert SCANS == []  # the scanner was not used


def test_app_handler_types_skip_the_fast_path(tmp_path: Path) -> None:
    def app_seeing(seen: list[tuple[str, int]]) -> App:
        app = App("t")

        @app.handler("reservation", inline=True)
        def on_reservation(event: Event, state: GroupState) -> None:
            seen.append((event.key, event.version))
            if event.value is None:
                state.delete("reservation", event.key, event.version)
            else:
                state.put("reservation", event.value)

        return app

    # One app per worker: what each worker's handler saw, not the two interleaved.
    seen_slow: list[tuple[str, int]] = []
    seen_fast: list[tuple[str, int]] = []
    slow = _worker(tmp_path, "slow", app_seeing(seen_slow), None, False, fast_path=False)
    fast = _worker(tmp_path, "fast", app_seeing(seen_fast), None, False)
    SCANS.clear()
    fast.take(_batch())
    slow.take(_batch())
    fast.drain()
    slow.drain()
    _same(fast, slow)
    # types without an app handler (the flight) take the fast path; reservations do not
    assert [found[0].name for found in SCANS if found is not None] == []  # a flight has a date
    assert seen_fast == seen_slow
    assert seen_fast[:4] == [("R1", 1), ("R2", 1), ("R3", 5), ("R1", 2)]


def test_busy_group_keeps_arrival_order(tmp_path: Path) -> None:
    """An event whose group has queued work waits behind it, also on the fast path."""
    w = _worker(tmp_path, "busy")
    codec = w.codec
    first = _batch()[0]
    w.take([first])
    event = Event("reservation", "R9", "F1", 1, "upsert", _reservation("R9", "F1", 1), 0, 99, 0,
                  codec.encode("reservation", _reservation("R9", "F1", 1)))
    w.sched.submit(event)  # F1 now has a queued event
    later = FakeMsg(0, 101, b"F1", codec.encode("reservation", _reservation("R1", "F1", 2)))
    w.take([later])
    assert w.sched.queued == 2  # queued behind the F1 event, not applied inline
    w.drain()
    keys = [(k, codec.decode(v).version) for t, v, k, _p, _h in _records(w) if t == "state"]
    assert keys == [(b"reservation/R1", 1), (b"reservation/R9", 1), (b"reservation/R1", 2)]


def test_store_without_group_index(tmp_path: Path) -> None:
    from services.worker.state import StoreManager

    mgr = StoreManager(tmp_path / "s", "g", group_index=False)
    st = mgr.open(0)
    st.put(b"reservation/R1", Row(1, False, "F1", b"v1"), None)
    st.commit(5)
    keys = [bytes(k) for k in st.db.keys()]  # noqa: SIM118 - Rdict iteration yields items
    assert b"e:reservation/R1" in keys and not [k for k in keys if k.startswith(b"i:")]
    with pytest.raises(StateError, match="no group index"):
        list(st.scan_group("F1"))
    st.restore_batch([(b"reservation/R2", 1, False, "F1", b"v2")], 9)
    assert not [k for k in st.db.keys() if bytes(k).startswith(b"i:")]  # noqa: SIM118
    mgr.close_all()
    # An app that scans groups needs the index: the store is rebuilt (from the changelog).
    mgr2 = StoreManager(tmp_path / "s", "g", group_index=True)
    st2 = mgr2.open(0)
    assert st2.is_empty() and st2.changelog_offset == 0
    st2.put(b"reservation/R1", Row(1, False, "F1", b"v1"), None)
    st2.commit(1)
    assert [k for k, _ in st2.scan_group("F1")] == [b"reservation/R1"]
    mgr2.close_all()
    # Going back to a table-only worker keeps the rows (the index is merely not maintained).
    mgr3 = StoreManager(tmp_path / "s", "g", group_index=False)
    st3 = mgr3.open(0)
    assert st3.get(b"reservation/R1") == Row(1, False, "F1", b"v1") and st3.changelog_offset == 1
    mgr3.close_all()
    # ... and an indexed store reopened by an app after that is rebuilt again
    mgr4 = StoreManager(tmp_path / "s", "g", group_index=True)
    assert mgr4.open(0).is_empty()
    mgr4.close_all()


def test_abort_with_handler_calls_in_flight(tmp_path: Path) -> None:
    """An abort while handlers run (the producer failed while a result was applied) must not
    let their late results reach the scheduler, and replays every assigned partition from
    its committed offset."""
    import threading

    app = App("slow")
    release = threading.Event()
    calls: list[str] = []

    @app.handler("reservation")
    def slow(event: Event, state: GroupState) -> None:
        calls.append(event.key)
        release.wait(5)
        assert event.value is not None
        state.put("reservation", event.value)

    w = _worker(tmp_path, "rewind", app)
    consumer = w.clients.fake_consumer  # type: ignore[attr-defined]
    msgs = [m for m in _batch() if m.partition() == 0][:2]  # R1 and R2 of F1 (one group)
    other = FakeMsg(1, 300, b"F2", make_codec(Settings(), CATALOG).encode(
        "reservation", _reservation("R7", "F2", 1)))
    w.take([*msgs, other])
    w.poll_once()
    assert w.sched.in_flight == 2  # F1's head and F2's only event run; R2 waits behind R1
    w.clients.fake_producer.fail = TransactionAbortedError("boom", code="_STATE", abortable=True)  # type: ignore[attr-defined]
    consumer.seeks.clear()
    threading.Timer(0.2, release.set).start()
    wait_until(lambda: w.poll_once() or w.stats.aborts == 1, timeout=10, message="the abort")
    assert w.sched.idle() and w.calls.completions.empty()
    # Rewound to the last commit. One may have been taken while the handlers ran (a windowed
    # commit: partition 1's first record is 300, unfinished; partition 0's 100 and 101).
    producer = w.clients.fake_producer  # type: ignore[attr-defined]
    if producer.commits:
        assert producer.metadata[-1] == {("in", 0): "fl1;102;Aw==", ("in", 1): "fl1;301;AQ=="}
        assert sorted(consumer.seeks) == [("in", 0, 100), ("in", 1, 300)]
    else:
        assert sorted(consumer.seeks) == [("in", 0, 100), ("in", 1, 200)]
    assert all(not st.overlay for st in w.stores.stores.values())
    assert sorted(calls) == ["R1", "R7"]
    # the worker goes on: the replayed events run and nothing stale turns up
    w.take([*msgs, other])
    w.drain()
    assert sorted(calls) == ["R1", "R1", "R2", "R7", "R7"]
    assert w.stats.processed == 3
    w.calls.shutdown()


def _as_restored_raw(w: Worker) -> None:
    """Rewrite a worker's persisted upserts as a restore without group index writes them:
    raw rows, version and group read from the value on first use."""
    for st in w.stores.stores.values():
        rows = [(bytes(k)[2:], st.unpack(v)) for k, v in st.db.items() if bytes(k).startswith(b"e:")]
        st.restore_batch([(k, None, False, "", r.value) if not r.deleted else (k, r.version, True, r.group, None)
                          for k, r in rows if r is not None], 0)


@pytest.mark.parametrize("raw", [False, True], ids=["packed", "raw-restored"])
def test_fast_path_equals_general_path_over_persisted_state(tmp_path: Path, raw: bool) -> None:
    """The same batch again after the first one reached RocksDB: the stale checks now read
    persisted rows (versions only, or whole rows for change sinks), packed by a commit or
    raw from a restore."""
    codec = make_codec(Settings(), CATALOG)
    newer = [FakeMsg(0, 200, b"F1", codec.encode("reservation", _reservation("R1", "F1", 3))),
             FakeMsg(1, 300, b"F2", codec.encode("reservation", _reservation("R3", "F2", 9))),
             FakeMsg(1, 301, b"F2", codec.encode("reservation", _reservation("R3", "F2", 10))),
             FakeMsg(0, 201, b"F1", codec.encode("reservation", _reservation("R2", "F1", 8)))]
    outcomes = []
    for with_sink in (False, True):
        sinks = (RecordingSink(), RecordingSink()) if with_sink else (None, None)
        workers = []
        for name, sink in zip(("fast", "slow"), sinks, strict=True):
            w = _worker(tmp_path, f"{name}-{with_sink}", sink=sink, fast_path=name == "fast")
            w.take(_batch())
            for st in w.stores.stores.values():
                st.commit(None)
            if raw:
                _as_restored_raw(w)
            _records(w).clear()
            w.take(newer)
            workers.append(w)
        fast, slow = workers
        _same(fast, slow)
        # R1 v3 applies, R3 v9 is a duplicate of the persisted v9, R3 v10 applies, R2 v8 is
        # newer than the persisted delete (v7) and applies
        assert [(k, codec.decode(v).version) for t, v, k, _p, _h in _records(fast) if t == "state"] == [
            (b"reservation/R1", 3), (b"reservation/R3", 10), (b"reservation/R2", 8)]
        if with_sink:
            assert sinks[0] is not None and sinks[1] is not None
            assert sinks[0].changes == sinks[1].changes
            assert [(c[1], c[5], c[6]) for c in sinks[0].changes][-3:] == [("R1", 2, 3), ("R3", 9, 10), ("R2", 7, 8)]
        outcomes.append(fast.stats.superseded)
    assert outcomes == [4, 4]  # 3 in the first batch, 1 in the second


def test_raw_rows_are_read_on_first_use(tmp_path: Path) -> None:
    """A restore without group index keeps values raw; every reader sees the real row."""
    w = _worker(tmp_path, "raw")
    codec = w.codec
    st = w.stores.stores[0]
    value = codec.encode("reservation", _reservation("R1", "F1", 4))
    st.restore_batch([(b"reservation/R1", None, False, "", value),
                      (b"reservation/X", None, False, "", b"not an entity"),
                      (b"reservation/R2", 6, True, "F1", None)], 10)
    assert st.db.get(b"e:reservation/R1")[:8] == b"\x80" + bytes(7)  # stored raw (RAW_VERSION)
    assert st.get(b"reservation/R1") == Row(4, False, "F1", value)
    assert st.get(b"reservation/X") is None  # not an entity value: as if never restored
    assert st.get(b"reservation/R2") == Row(6, True, "F1", None)
    assert [k for k, _r in st.iter_committed()] == [b"reservation/R1"]
    assert st.committed_version(b"reservation/R1") == 4
    st.commit(None)  # a later commit leaves raw rows alone
    assert st.get(b"reservation/R1") == Row(4, False, "F1", value)
    w.take([FakeMsg(0, 11, b"F1", codec.encode("reservation", _reservation("R1", "F1", 4))),
            FakeMsg(0, 12, b"F1", codec.encode("reservation", _reservation("R1", "F1", 5)))])
    assert (w.stats.superseded, w.stats.processed) == (1, 1)
    assert st.get(b"reservation/R1").version == 5  # type: ignore[union-attr]


@pytest.mark.parametrize("fast_path", [True, False])
def test_a_header_with_a_null_value_is_an_ordinary_header(tmp_path: Path, fast_path: bool) -> None:
    """Kafka allows null header values (confluent-kafka gives ``(name, None)``): the record is
    processed like any other, on both paths (compiled code checks declared types)."""
    codec = make_codec(Settings(), CATALOG)
    w = _worker(tmp_path, "w", fast_path=fast_path)
    try:
        value = codec.encode("reservation", _reservation("R1", "F1", 1))
        w.clients.fake_consumer.batches = [[FakeMsg(0, 100, b"F1", value, [("traceparent", None)]),  # type: ignore[attr-defined]
                                            FakeMsg(0, 101, b"F1", value, [("fifolane.control", None)])]]
        wait_until(lambda: w.poll_once() or w.stats.consumed == 2, timeout=10, message="both records taken")
        assert (w.stats.processed, w.stats.superseded) == (1, 0)
        assert w.stats.dead_lettered == 1  # a control header without a known control: refused, not fatal
        assert [r[0] for r in _records(w)].count("state") == 1
    finally:
        w.close()
