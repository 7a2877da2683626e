"""The worker's hot-path shortcuts give what the slow paths they replace give: keys noted
absent from RocksDB (PartitionStore.absent), remembered decoded records (RecordCache), the
one-pass effects check. Found by an adversarial review of those changes."""

from __future__ import annotations

import math
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

import services.worker.state as state_mod
from services.worker.effects import Effects, Write, check_effects
from services.worker.limits import FRAMING, Limits
from services.worker.metrics import Stats
from services.worker.records import RecordCache
from services.worker.state import Row, StoreManager
from services.worker.table import STALE, TableApplier


# --------------------------------------------------------------------------- helpers
class _DbProxy:
    """An Rdict whose ``get`` runs ``hook`` after RocksDB answered and before the caller
    sees the answer: what another thread may do between those two moments."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.hook: Any = None

    def get(self, key: bytes) -> Any:
        data = self._db.get(key)
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


class _Entity:
    def __init__(self, name: str, schema: dict[str, Any]) -> None:
        self.name = name
        self.schema = schema


def _flat(name: str, field_type: Any) -> dict[str, Any]:
    return parse_schema({"type": "record", "name": name, "fields": [
        {"name": "id", "type": "string"}, {"name": "x", "type": field_type}]})


def _enc(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    fo = BytesIO()
    schemaless_writer(fo, schema, record)
    return fo.getvalue()


def _dec(schema: dict[str, Any], data: bytes) -> dict[str, Any]:
    return schemaless_reader(BytesIO(data), schema)  # type: ignore[return-value]


# --------------------------------------------------------- 2. PartitionStore.absent
def test_a_miss_read_while_a_commit_writes_the_row_never_hides_it(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler thread's ``store.get`` (CallState.get) runs while the poll thread commits
    (a call may outlive the commit that left it running). The handler's RocksDB read saw no
    row; the commit then wrote the row and forgot its keys' notes (apply); only then would
    the handler note the key absent. It must not: once the recent rows no longer hold the
    row, every read and the stale check would say "no row" although RocksDB has one."""
    monkeypatch.setattr(state_mod, "RECENT_ROWS", 4)
    mgr = StoreManager(tmp_path / "s", "g", group_index=True)
    st = mgr.open(0)
    proxy = _DbProxy(st.db)
    st.db = proxy
    ekey = b"reservation/R1"
    row = Row(7, False, "F1", b"v7")

    def other_thread_commits() -> None:  # the poll thread: another group's write of R1
        st.put(ekey, row, None)
        st.commit(1)

    proxy.hook = other_thread_commits
    assert st.get(ekey) is None  # the handler's read, answered before the commit
    # later commits push R1 out of the recent rows (at most RECENT_ROWS)
    for i in range(5):
        st.put(b"reservation/X%d" % i, Row(1, False, "F9", b"x"), None)
        st.commit(2 + i)
    assert proxy.get(b"e:" + ekey) is not None  # RocksDB has the row
    try:
        assert st.get(ekey) == row, "a committed row is reported absent"
        table = TableApplier(st, object(), state_topic="state", room=1 << 20, stats=Stats())  # type: ignore[arg-type]
        assert table.prior(ekey, 3) is STALE, "an older version would be applied over version 7"
    finally:
        mgr.close_all()


def test_absent_noted_by_the_stale_check_is_dropped_by_the_commit(tmp_path: Path) -> None:
    """The single-threaded sequence (stale check, handler read, write, commit, eviction of
    the recent rows) finds the row: coverage of TableApplier.prior's note."""
    mgr = StoreManager(tmp_path / "s", "g", group_index=True)
    st = mgr.open(0)
    table = TableApplier(st, object(), state_topic="state", room=1 << 20, stats=Stats())  # type: ignore[arg-type]
    ekey = b"reservation/R1"
    assert table.prior(ekey, 1) is None and ekey in st.absent
    st.put(ekey, Row(1, False, "F1", b"v1"), None)
    st.commit(1)
    st.recent.clear()
    assert ekey not in st.absent and table.prior(ekey, 1) is STALE
    # a wipe gives a new store: a table made for it sees its own (empty) set
    st2 = mgr.wipe(0)
    assert st2 is not st and st2.absent == set()
    mgr.close_all()


# --------------------------------------------------------------- 1. RecordCache
def test_a_remembered_write_is_what_decoding_its_bytes_gives_union_double_before_long() -> None:
    """fastavro writes an int into the first union branch that accepts it: in
    ["null", "double", "long"] that is the double, so 5 reads back as 5.0. The write check
    (round_trip_types) takes int as exact for that field, and the cache hands a later read of
    the stored bytes {x: 5} instead of {x: 5.0}."""
    schema = _flat("U", ["null", "double", "long"])
    cache = RecordCache(lambda d: _dec(schema, d), [_Entity("u", schema)])
    written = {"id": "k", "x": 5}
    data = _enc(schema, written)
    ekey = b"u/k"
    cache.wrote("u", data, written, ekey)
    got = cache.read(data, ekey)
    want = _dec(schema, data)
    assert type(want["x"]) is float
    assert type(got["x"]) is type(want["x"]), f"cache gives {got['x']!r}, decoding gives {want['x']!r}"


@pytest.mark.parametrize("field_type,value", [
    (["null", "int", "double"], 2**31), (["null", "int", "double"], -(2**31) - 1),
    (["null", "long", "double"], 2**63), (["null", "long", "double"], 2**70),
])
def test_an_int_too_large_for_its_union_branch_is_not_remembered_as_an_int(field_type: Any, value: int) -> None:
    """Too large for the int (or long) branch, an int is written into the double branch and
    decodes as a float: the cache must not hand out the int (found by an adversarial review)."""
    schema = _flat("L", field_type)
    cache = RecordCache(lambda d: _dec(schema, d), [_Entity("l", schema)])
    written = {"id": "k", "x": value}
    data = _enc(schema, written)
    cache.wrote("l", data, written, b"l/k")
    got, want = cache.read(data, b"l/k")["x"], _dec(schema, data)["x"]
    assert type(want) is float
    assert type(got) is float and got == want


@pytest.mark.parametrize("field_type,values", [
    ("double", [1.5, -0.0, math.inf, math.nan, 1e308]),
    (["null", "long"], [None, 1, -(1 << 63), (1 << 63) - 1]),
    (["long", "null"], [None, 0]),
    ({"type": "enum", "name": "E", "symbols": ["A", "B"]}, ["A", "B"]),
    (["null", "string"], [None, "", "\u00e9\x00"]),
    (["null", "boolean"], [True, False, None]),
    ("bytes", [b"", b"\x00\xff"]),
])
def test_shapes_remembered_as_exact_stay_exact_for_every_value(field_type: Any, values: list[Any]) -> None:
    """The per-shape answer is about types only; every value of an exact shape decodes to
    an equal value of the same type (NaN: a NaN; -0.0: its sign)."""
    schema = _flat("S", field_type)
    cache = RecordCache(lambda d: _dec(schema, d), [_Entity("s", schema)])
    for v in values:
        rec = {"id": "k", "x": v}
        data = _enc(schema, rec)
        cache.wrote("s", data, rec, b"s/k")
        got, want = cache.read(data, b"s/k")["x"], _dec(schema, data)["x"]
        assert type(got) is type(want)
        assert repr(got) == repr(want)


def test_mutating_after_put_or_read_does_not_reach_the_cache() -> None:
    schema = _flat("M", "long")
    cache = RecordCache(lambda d: _dec(schema, d), [_Entity("m", schema)])
    rec = {"id": "k", "x": 1}
    data = _enc(schema, rec)
    cache.wrote("m", data, rec, b"m/k")
    rec["x"] = 2  # the handler keeps using its dict
    first = cache.read(data, b"m/k")
    first["x"] = 3
    assert cache.read(data, b"m/k") == {"id": "k", "x": 1}


# ---------------------------------------------------------------- 4. check_effects
def test_a_delete_whose_key_kafka_would_refuse_is_refused_before_anything_is_applied() -> None:
    """Before the one-pass rewrite a delete was measured too (its key alone can exceed the
    room); now only writes with a value are, so the tombstone is produced and Kafka refuses
    it at the commit instead of the event being dead-lettered whole."""
    limits = Limits(client_max=FRAMING + 100)
    key = "k" * 200
    effects = Effects()
    w = Write("reservation", key, "F1", 3, None, None)
    effects.writes[w.entity_key] = w
    refusal = check_effects(effects, limits, "state")
    assert refusal is not None and refusal.reason == "too-large"


def test_bad_version_still_wins_over_too_large() -> None:
    limits = Limits(client_max=FRAMING + 100)
    effects = Effects()
    big = Write("reservation", "a", "F1", 1, b"x" * 500, {})
    bad = Write("reservation", "b", "F1", 1 << 63, b"y", {})
    effects.writes[big.entity_key] = big
    effects.writes[bad.entity_key] = bad
    refusal = check_effects(effects, limits, "state")
    assert refusal is not None and refusal.reason == "bad-version"
