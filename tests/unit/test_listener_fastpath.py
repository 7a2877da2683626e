"""The listener sink's fast paths give exactly what the plain definition gives. No Kafka.

``ListenerRuntime.on_change`` decodes the old state only when an expression or an index
lookup needs it (the equality index reads the group and key fields of the old state from the
stored row and the entity key), runs simple filters natively and builds notification JSON from
parts. Checked here against (1) a brute-force reference that evaluates every listener with CEL
on complete contexts (the view semantics of docs/formats.md) and (2) ``ListenerSet.match`` on the
decoded change, on random listeners and random changes.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import cel

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.serde import SchemaCatalog, make_codec
from listeners.expr import compile_converter, compile_filter
from listeners.follower import RegistryRecord
from listeners.matcher import Change, ListenerSet
from listeners.model import ListenerSpec
from listeners.runtime import ListenerRuntime
from listeners.seq import DELTA
from listeners.standin import QuietRegistry, StandInContext
from services.worker.state import Row

STATES = ("NEW", "CONFIRMED", "REJECTED", "CANCELLED")
FILTERS = [
    'value.flight_number == "F1"',  # the group field: pure equality, indexed
    'value.flight_number == "F2" && value.seats > 1',  # indexed, with a native remainder
    'value.reservation_id == "R3"',  # the key field: indexed
    'value.customer_id == "c1"',  # indexed, but not known from the row: decodes
    "value.seats == 2",  # indexed on an int
    "value.amount > 500.0",  # general filters; these differ in literals only: run together
    "value.amount > 300.0",
    'value.amount > 300.0 && value.state == "CONFIRMED"',
    'value.amount > 450.0 && value.state == "NEW"',
    'value.seats >= 1 && value.amount < 500.0 && value.customer_id != "c2"',
    "value.version > 700",
    "size(value.customer_id) > 1 && value.seats >= 2",  # CEL only
    "true",
    'key == "R1"',
    "old != null && old.amount != value.amount",  # transition filters
    'kind == "removed"',
    "meta.partition == 1 && value.seats > 0",
    "value.capacity > 5",  # a field only flight_load has (errors on reservations)
    "value.missing > 1",  # errors everywhere
]
CONVERTERS = [
    None,
    None,
    '{"id": key, "amount": value.amount}',  # native
    '{"now": value.amount, "was": old == null ? 0.0 : old.amount, "k": kind}',  # CEL, old
    '{"v": meta.version, "p": meta.partition}',
]
KINDS = [("created", "modified", "removed"), ("created", "removed"), ("modified",), ("removed",)]


def _codec() -> Any:
    return make_codec(Settings(), SchemaCatalog.load(PROJECT_ROOT / "schemas"))


class CountingCodec:
    """The worker's codec, counting decodes."""

    def __init__(self, codec: Any) -> None:
        self.codec = codec
        self.catalog = codec.catalog
        self.decodes = 0

    def decode(self, data: bytes) -> Any:
        self.decodes += 1
        return self.codec.decode(data)

    def encode(self, type_name: str, record: dict[str, Any]) -> bytes:
        return bytes(self.codec.encode(type_name, record))


def _runtime(specs: list[ListenerSpec]) -> tuple[ListenerRuntime, StandInContext]:
    """A runtime over a stand-in worker that owns partitions 0-2, with these listeners."""
    worker = StandInContext(CountingCodec(_codec()))
    rt = ListenerRuntime(Settings(), topic_partitions=lambda _t: 3, follower=QuietRegistry(),  # type: ignore[arg-type]
                         housekeeping_interval=float("inf"))
    rt.open(worker)
    rt.on_assign([0, 1, 2])
    assert rt.ready()
    rt.apply_records([RegistryRecord(s.name, s.to_json(), i) for i, s in enumerate(specs)])
    return rt, worker


def _random_specs(rng: random.Random, n: int) -> list[ListenerSpec]:
    return [
        ListenerSpec(name=f"l{i}", filter=rng.choice(FILTERS), convert=rng.choice(CONVERTERS),
                     kinds=rng.choice(KINDS),
                     type=rng.choice([None, None, "reservation", "flight_load"]))
        for i in range(n)
    ]  # fmt: skip


def _record(type_: str, key: str, rng: random.Random, version: int) -> dict[str, Any]:
    if type_ == "flight_load":
        return {"flight_number": key, "seats_sold": rng.randint(0, 9), "capacity": rng.randint(0, 9),
                "rejected_seats": 0, "version": version}  # fmt: skip
    return {"reservation_id": key, "flight_number": rng.choice(["F1", "F2", "F3"]),
            "customer_id": rng.choice(["c1", "c2", "c33"]), "seats": rng.randint(0, 3),
            "amount": rng.choice([100.0, 400.0, 600.0]), "state": rng.choice(STATES),
            "version": version}  # fmt: skip


def _group(type_: str, rec: dict[str, Any]) -> str:
    return str(rec["flight_number"])


# -- the reference: every listener evaluated with CEL on complete contexts ------------------
def _test(src: str, variables: dict[str, Any]) -> bool:
    try:
        result = compile_filter(src).program.execute(cel.Context(variables))
    except Exception:  # noqa: BLE001 - a failing filter does not match
        return False
    return result is True


def _project(src: str, variables: dict[str, Any]) -> dict[str, Any] | None:
    try:
        result = compile_converter(src).program.execute(cel.Context(variables))
    except Exception:  # noqa: BLE001 - a failing converter sends nothing
        return None
    return result if isinstance(result, dict) else None


def _expected(specs: list[ListenerSpec], type_: str, key: str, new: dict[str, Any] | None,
              old: dict[str, Any] | None, table_change: str,
              meta: dict[str, Any]) -> list[tuple[str, str, Any]]:  # fmt: skip
    out = []
    for s in specs:
        if s.type is not None and s.type != type_:
            continue
        if {"old", "kind"} & compile_filter(s.filter).variables:  # a transition filter
            hit = _test(s.filter, {"key": key, "value": new, "old": old, "kind": table_change,
                                   "meta": meta})  # fmt: skip
            kind: str | None = table_change if hit else None
        else:
            a = old is not None and _test(s.filter, {"key": key, "value": old, "meta": meta})
            b = new is not None and _test(s.filter, {"key": key, "value": new, "meta": meta})
            kind = ("modified" if a else "created") if b else ("removed" if a else None)
        if kind is None or kind not in s.kinds:
            continue
        value: Any = None
        if kind != "removed":
            value = new
            if s.convert is not None:
                value = _project(s.convert, {"key": key, "value": new, "old": old, "kind": kind,
                                             "meta": meta})  # fmt: skip
                if value is None:
                    continue
        out.append((s.name, kind, value))
    return sorted(out, key=lambda t: t[0])


def test_random_changes_match_the_reference_and_the_plain_path() -> None:
    rng = random.Random(20240611)
    specs = _random_specs(rng, 60)
    rt, worker = _runtime(specs)
    plain = ListenerSet()
    for s in specs:
        plain.add(s)
    codec = worker.codec
    rows: dict[bytes, tuple[Row, dict[str, Any]]] = {}
    entities = [("reservation", f"R{i}") for i in range(8)] + [("flight_load", "F1"),
                                                               ("flight_load", "F2")]  # fmt: skip
    version = 0
    compared = Counter[str]()
    seqs: dict[tuple[str, int], list[int]] = {}
    for offset in range(1500):
        type_, key = rng.choice(entities)
        ekey = f"{type_}/{key}".encode()
        version += 1
        prev = rows.get(ekey)
        old_row, old_rec = prev if prev is not None else (None, None)
        if prev is not None and rng.random() < 0.15:  # a delete
            new_row, new_rec = Row(version, True, old_row.group, None), None  # type: ignore[union-attr]
            rows.pop(ekey)
            table_change = "removed"
        else:
            new_rec = _record(type_, key, rng, version)
            new_row = Row(version, False, _group(type_, new_rec), codec.encode(type_, new_rec))
            rows[ekey] = (new_row, new_rec)
            table_change = "created" if prev is None else "modified"
        if prev is None and new_rec is None:
            continue
        p = rng.randrange(3)
        worker.sent.clear()
        # The worker hands over the decoded new record (or None: then the sink decodes it).
        rt.on_change(p, offset, 1000 + offset, ekey, old_row, new_row,
                     new_rec if rng.random() < 0.8 else None)
        got = sorted(([d["listener"], d["kind"], d["value"]] for d in
                      (json.loads(v) for _t, v, _k, _p in worker.sent)), key=lambda t: t[0])  # fmt: skip
        for d in (json.loads(v) for _t, v, _k, _p in worker.sent):
            seqs.setdefault((d["listener"], p), []).append(d["seq"])
            assert (d["key"], d["type"], d["table_change"], d["partition"], d["offset"],
                    d["version"], d["ts"]) == (key, type_, table_change, p, offset, version,
                                               1000 + offset)  # fmt: skip
        meta = {"partition": p, "offset": offset, "timestamp": 1000 + offset, "version": version,
                "type": type_}  # fmt: skip
        want = _expected(specs, type_, key, new_rec, old_rec, table_change, meta)
        assert got == json.loads(json.dumps(want)), (type_, key, old_rec, new_rec)
        # The plain path (decoded old state, a Change): the same notifications, same order.
        notes = plain.match(Change(type_, key, new_rec, old_rec, table_change, meta))
        assert [(d["listener"], d["kind"]) for d in
                (json.loads(v) for _t, v, _k, _p in worker.sent)] == [
            (n.listener, n.kind) for n in notes]  # fmt: skip
        compared.update(k for _n, k, _v in want)
        compared["changes"] += 1
    assert min(compared.values()) > 50, compared  # every kind occurred often
    # Per listener and partition the numbers stay consecutive, from the start of a run.
    for numbers in seqs.values():
        assert numbers[0] % DELTA == 0
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))


def test_old_state_is_decoded_for_listeners_that_read_it() -> None:
    rt, worker = _runtime([
        ListenerSpec(name="delta", filter="old != null && old.amount != value.amount",
                     convert='{"was": old.amount, "now": value.amount}'),
    ])  # fmt: skip
    codec = worker.codec
    r1 = _record("reservation", "R1", random.Random(1), 1) | {"amount": 100.0}
    r2 = r1 | {"amount": 250.0, "version": 2}
    row1 = Row(1, False, "F1", codec.encode("reservation", r1))
    row2 = Row(2, False, "F1", codec.encode("reservation", r2))
    rt.on_change(0, 1, 1, b"reservation/R1", None, row1, r1)
    assert worker.sent == []  # no old state: the filter is false
    rt.on_change(0, 2, 2, b"reservation/R1", row1, row2, r2)
    (doc,) = [json.loads(v) for _t, v, _k, _p in worker.sent]
    assert (doc["kind"], doc["value"]) == ("modified", {"was": 100.0, "now": 250.0})
    assert codec.decodes == 1


def test_nothing_matches_nothing_is_decoded_or_sent() -> None:
    # Per-flight and per-reservation listeners on values no change has: the index decides
    # from the new record, the stored row's group and the entity key.
    specs = [ListenerSpec(name=f"f{i}", type="reservation", filter=f'value.flight_number == "X{i}"')
             for i in range(1000)]  # fmt: skip
    specs += [ListenerSpec(name=f"r{i}", filter=f'value.reservation_id == "X{i}" && value.seats > 0')
              for i in range(1000)]  # fmt: skip
    rt, worker = _runtime(specs)
    codec = worker.codec
    rng = random.Random(3)
    old: dict[bytes, Row] = {}
    for i in range(400):
        rec = _record("reservation", f"R{i % 50}", rng, i + 1)
        ekey = f"reservation/R{i % 50}".encode()
        row = Row(i + 1, False, rec["flight_number"], codec.encode("reservation", rec))
        rt.on_change(0, i, i, ekey, old.get(ekey), row, rec)
        old[ekey] = row
    assert worker.sent == [] and codec.decodes == 0
    assert rt.listeners.evaluations == 0


def test_leaving_a_group_listener_is_seen_without_decoding() -> None:
    rt, worker = _runtime([
        ListenerSpec(name="f1", filter='value.flight_number == "F1"'),
        ListenerSpec(name="f2", filter='value.flight_number == "F2"'),
    ])  # fmt: skip
    codec = worker.codec
    r1 = _record("reservation", "R1", random.Random(1), 1) | {"flight_number": "F1"}
    r2 = r1 | {"flight_number": "F2", "version": 2}
    row1 = Row(1, False, "F1", codec.encode("reservation", r1))
    row2 = Row(2, False, "F2", codec.encode("reservation", r2))
    rt.on_change(0, 1, 1, b"reservation/R1", None, row1, r1)
    rt.on_change(0, 2, 2, b"reservation/R1", row1, row2, r2)
    rt.on_change(0, 3, 3, b"reservation/R1", row2, Row(3, True, "F2", None),
                 None)  # fmt: skip
    docs = [(d["listener"], d["kind"], d["value"]) for d in
            (json.loads(v) for _t, v, _k, _p in worker.sent)]  # fmt: skip
    assert docs == [("f1", "created", r1), ("f1", "removed", None), ("f2", "created", r2),
                    ("f2", "removed", None)]  # fmt: skip
    assert codec.decodes == 0


def test_rows_that_do_not_carry_their_group_turn_the_shortcut_off() -> None:
    rt, worker = _runtime([ListenerSpec(name="f1", filter='value.flight_number == "F1"')])
    codec = worker.codec
    r1 = _record("reservation", "R1", random.Random(1), 1) | {"flight_number": "F1"}
    r2, r3 = r1 | {"version": 2}, r1 | {"version": 3}
    row1 = Row(1, False, "F1", codec.encode("reservation", r1))
    # A row whose group is not its record's group field (not written like the worker does).
    odd = Row(2, False, "elsewhere", codec.encode("reservation", r2))
    row3 = Row(3, False, "F1", codec.encode("reservation", r3))
    rt.on_change(0, 1, 1, b"reservation/R1", None, row1, r1)
    assert codec.decodes == 0
    rt.on_change(0, 2, 2, b"reservation/R1", row1, odd, r2)
    rt.on_change(0, 3, 3, b"reservation/R1", odd, row3, r3)
    kinds = [json.loads(v)["kind"] for _t, v, _k, _p in worker.sent]
    assert kinds == ["created", "modified", "modified"]  # the odd row's state was decoded
    assert codec.decodes == 2


def test_sequence_numbers_roll_back_with_an_aborted_transaction() -> None:
    rt, worker = _runtime([ListenerSpec(name="all", filter="true"),
                           ListenerSpec(name="f1", filter='value.flight_number == "F1"')])  # fmt: skip
    codec = worker.codec
    rec = _record("reservation", "R1", random.Random(1), 1) | {"flight_number": "F1"}
    row = Row(1, False, "F1", codec.encode("reservation", rec))
    offset = 0
    runs: dict[tuple[str, int], int] = {}  # the first number of the current run

    def change(p: int) -> None:
        nonlocal offset
        offset += 1
        rt.on_change(p, offset, offset, f"reservation/R{offset}".encode(), None, row, rec)

    def numbers() -> list[tuple[str, int, int | str]]:
        """(listener, partition, number within its run, or "new run" for a run's first)."""
        out: list[tuple[str, int, int | str]] = []
        for d in (json.loads(v) for _t, v, _k, _p in worker.sent):
            k, seq = (d["listener"], d["partition"]), d["seq"]
            start = runs.get(k)
            if start is None or seq - start >= DELTA or seq < start:
                assert seq % DELTA == 0 and (start is None or seq - start >= DELTA)
                runs[k] = seq
                out.append((*k, "new run"))
            else:
                out.append((*k, seq - start))
        worker.sent.clear()
        return out

    for p in (0, 0, 1):
        change(p)
    rt.after_commit()  # committed: 0..1 on partition 0, 0 on partition 1
    for p in (0, 2):
        change(p)
    assert numbers() == [("all", 0, "new run"), ("f1", 0, "new run"), ("all", 0, 1), ("f1", 0, 1),
                         ("all", 1, "new run"), ("f1", 1, "new run"), ("all", 0, 2), ("f1", 0, 2),
                         ("all", 2, "new run"), ("f1", 2, "new run")]  # fmt: skip
    rt.after_abort()  # the open transaction (2 on partition 0, 0 on 2) was aborted
    del runs[("all", 2)], runs[("f1", 2)]  # its run on partition 2 never reached anyone
    for p in (0, 2, 1):
        change(p)
    assert numbers() == [("all", 0, 2), ("f1", 0, 2), ("all", 2, "new run"), ("f1", 2, "new run"),
                         ("all", 1, 1), ("f1", 1, 1)]  # fmt: skip
    rt.after_commit()
    rt.on_release([0])  # partition 0 moves away and comes back: a new run
    rt.on_assign([0])
    assert rt.ready()
    for p in (0, 1):
        change(p)
    assert numbers() == [("all", 0, "new run"), ("f1", 0, "new run"), ("all", 1, 2), ("f1", 1, 2)]
    # A listener removed and registered again is a new stream: a new run, never a repeat.
    rt.apply_records([RegistryRecord("f1", None, 100)])
    rt.apply_records([RegistryRecord("f1", ListenerSpec(
        name="f1", filter='value.flight_number == "F1"').to_json(), 101)])  # fmt: skip
    change(1)
    assert numbers() == [("all", 1, 3), ("f1", 1, "new run")]


def test_only_plain_string_fields_are_taken_from_the_row() -> None:
    from listeners.hints import string_path as _string_path

    inner = {"type": "record", "name": "In", "fields": [{"name": "code", "type": "string"}]}
    schema = {"type": "record", "name": "T", "fields": [
        {"name": "s", "type": "string"}, {"name": "n", "type": "long"},
        {"name": "u", "type": ["null", "string"]}, {"name": "id", "type": {"type": "string",
                                                                            "logicalType": "uuid"}},
        {"name": "plain", "type": {"type": "string"}}, {"name": "in", "type": inner},
    ]}  # fmt: skip
    assert _string_path(schema, "s") == ("s",)
    assert _string_path(schema, "plain") == ("plain",)
    assert _string_path(schema, "in.code") == ("in", "code")
    for path in ("n", "u", "id", "in", "missing", "s.x", "in.missing"):
        assert _string_path(schema, path) is None, path
    catalog = _codec().catalog
    res = catalog.types["reservation"]
    assert _string_path(res.schema, res.group_path) == ("flight_number",)
    assert _string_path(res.schema, res.key_path) == ("reservation_id",)


def test_needs_records_only_for_types_a_listener_can_match() -> None:
    """The worker asks before reading only key/group/version: a type without listeners is
    never decoded for them."""
    rt, _worker = _runtime([ListenerSpec(name="loads", filter="true", type="flight_load")])
    assert rt.needs_records(["flight_load"]) and rt.needs_records(["reservation", "flight_load"])
    assert not rt.needs_records(["reservation"])
    untyped, _ = _runtime([ListenerSpec(name="all", filter="true")])
    assert untyped.needs_records(["reservation"])
    empty, _ = _runtime([])
    assert not empty.needs_records(["reservation", "flight_load"])
