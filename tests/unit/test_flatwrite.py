"""The fast flat-record writer (fifolane.serde.flatwrite) against fastavro: the same bytes
whenever it answers, and through the codec the same bytes or the same refusal always."""

from __future__ import annotations

import enum
import json
import random
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from fractions import Fraction
from io import BytesIO
from pathlib import Path
from typing import Any

import pytest
from fastavro import schemaless_writer

from fifolane.errors import SerializationError
from fifolane.serde import SchemaCatalog, SingleObjectCodec
from fifolane.serde.catalog import parse
from fifolane.serde.codec import SINGLE_OBJECT_MAGIC, _write
from fifolane.serde.confluent import ConfluentCodec, RegistryClient
from fifolane.serde.fake_registry import FakeSchemaRegistry
from fifolane.serde.fingerprint import fingerprint_bytes
from fifolane.serde.flatwrite import compile_writer, explain_refusal
from schemas import SCHEMAS_DIR

CATALOG = SchemaCatalog.load()
CODEC = SingleObjectCodec(CATALOG)
HISTORY = {p.name: parse(json.loads(p.read_text()), p.name) for p in (SCHEMAS_DIR / "history").glob("*.avsc")}
RESERVATION = {"reservation_id": "R-1", "flight_number": "LX318", "customer_id": "C-7", "seats": 2,
               "amount": 310.5, "state": "CONFIRMED", "version": 12}

SIMPLE = ["null", "boolean", "int", "long", "float", "double", "string", "bytes", "Color"]
EVERYTHING: dict[str, Any] = {
    "type": "record", "name": "Everything", "namespace": "test.flat", "fifolane.type": "everything",
    "fields": [
        {"name": "id", "type": "string", "fifolane.key": True},
        {"name": "grp", "type": "string", "fifolane.group": True},
        {"name": "version", "type": "long", "fifolane.version": True},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}},
        *({"name": f"x_{t.lower()}", "type": t} for t in SIMPLE),
        *({"name": f"on_{t.lower()}", "type": ["null", t]} for t in SIMPLE[1:]),
        *({"name": f"no_{t.lower()}", "type": [t, "null"]} for t in SIMPLE[1:]),
        {"name": "ds", "type": {"type": "string"}},
        {"name": "dd", "type": {"type": "double"}},
        {"name": "i_def", "type": "int", "default": 7},
        {"name": "s_def", "type": "string", "default": "dflt"},
        {"name": "d_def", "type": "double", "default": 1},
        {"name": "f_def", "type": "float", "default": 2.5},
        {"name": "b_def", "type": "boolean", "default": True},
        {"name": "e_def", "type": "Color", "default": "GREEN"},
        {"name": "by_def", "type": "bytes", "default": "\u00ff"},  # fastavro refuses it when used
        {"name": "on_def", "type": ["null", "string"], "default": None},
        {"name": "no_def", "type": ["string", "null"], "default": "dflt"},
    ],
}


class Small(enum.IntEnum):
    THREE = 3


class Text(str):
    pass


class Loud(str):
    def encode(self, *args: Any, **kwargs: Any) -> bytes:  # type: ignore[override,unused-ignore]
        return b"LOUD"


class Record(Mapping[str, Any]):
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


ODD: list[Any] = [
    None, True, False, 0, 1, -1, 1.0, 1.5, -0.0, float("nan"), float("inf"), 1e39, 2**31, -(2**31) - 1,
    2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64, 2**1100, "", "x", "NaN", "1.5", "\ud800", "é🙂",
    "RED", "PURPLE", Text("RED"), Loud("BLUE"), b"", b"x", bytearray(b"y"), memoryview(b"m"), Small.THREE,
    Decimal("2.5"), Fraction(5, 2), [], {}, ("string", "x"), (1, 2), object(),
]


def _defaultdict(record: dict[str, Any]) -> Mapping[str, Any]:
    return defaultdict(int, record)  # fastavro: a missing field is missing, not 0


CONTAINERS: list[Callable[[dict[str, Any]], Mapping[str, Any]]] = [dict, OrderedDict, Record, _defaultdict]


def _fastavro(schema: dict[str, Any], record: Any) -> bytes | str:
    """fastavro's body, or the name of the exception it raises."""
    fo = BytesIO()
    try:
        schemaless_writer(fo, schema, record)
    except Exception as exc:
        return type(exc).__name__
    return fo.getvalue()


def _string(rng: random.Random) -> str:
    alphabet = "abcXYZ09 -_/éß中文🙂\u0000\u07ff\uffff"
    n = rng.choice([0, 1, 5, 20, 63, 64, 200, 5000])
    return "".join(rng.choice(alphabet) for _ in range(n))


def _value(t: Any, rng: random.Random, named: Mapping[str, Any]) -> Any:
    """A random valid value of a simple type (32-bit ints, so that they read back)."""
    if isinstance(t, list):
        return None if rng.random() < 0.3 else _value(next(b for b in t if b != "null"), rng, named)
    t = named.get(t, t) if isinstance(t, str) else t
    kind = t["type"] if isinstance(t, dict) else t
    if kind == "enum":
        return rng.choice(t["symbols"])
    bounds = {"int": 31, "long": 63}.get(kind)
    if bounds:
        edge = [0, -1, 1, 63, -64, 64, 4095, 4096, 2**bounds - 1, -(2**bounds)]
        return rng.choice(edge) if rng.random() < 0.4 else rng.randint(-(2**bounds), 2**bounds - 1)
    makers: dict[str, Callable[[], Any]] = {
        "null": lambda: None,
        "boolean": lambda: rng.random() < 0.5,
        "float": lambda: rng.choice([0.0, -0.0, 1.5, float("inf"), float("-inf"), rng.uniform(-1e30, 1e30), 7]),
        "double": lambda: rng.choice([0.0, -0.0, 1e308, float("-inf"), rng.uniform(-1e300, 1e300), 12]),
        "string": lambda: _string(rng),
        "bytes": lambda: rng.randbytes(rng.choice([0, 3, 64, 300])),
    }
    return makers[kind]()


def _records(schema: dict[str, Any], n: int, seed: int = 7) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    named = schema.get("__named_schemas", {})
    for _ in range(n):
        record = {}
        for f in schema["fields"]:
            if "default" in f and f["type"] != "bytes" and rng.random() < 0.2:
                continue  # omitted: fastavro writes the default
            record[f["name"]] = _value(f["type"], rng, named)
        yield record


def _everything_codec(tmp_path: Path) -> SingleObjectCodec:
    (tmp_path / "everything.avsc").write_text(json.dumps(EVERYTHING))
    return SingleObjectCodec(SchemaCatalog.load(tmp_path))


# --- every schema of the catalog -----------------------------------------------------------
def test_which_catalog_schemas_compile() -> None:
    compiled = {t.name for t in CATALOG if compile_writer(t.schema) is not None}
    assert compiled == {"reservation", "flight_load", "ticket"}  # flight has a date
    assert compile_writer(CATALOG.delete.schema) is not None
    assert all(compile_writer(s) is not None for s in HISTORY.values())


@pytest.mark.parametrize("name", ["flight_load", "reservation", "ticket"])
def test_catalog_types_identical_to_fastavro_and_read_back(name: str) -> None:
    schema = CATALOG.entity(name).schema
    fast = compile_writer(schema)
    assert fast is not None
    for record in _records(schema, 1500):
        body = fast(record)
        assert body == _fastavro(schema, record)
        data = CODEC.encode(name, record)
        assert data[10:] == body
        decoded = CODEC.decode(data).record
        assert CODEC.encode(name, decoded) == data
        assert all(decoded[k] == v for k, v in record.items())


@pytest.mark.parametrize("file", sorted(HISTORY))
def test_history_schemas_identical_to_fastavro_and_read_back(file: str) -> None:
    schema = HISTORY[file]
    fast = compile_writer(schema)
    assert fast is not None
    fp = next(fp for fp, w in CATALOG.writers.items() if w.where.endswith(file))
    for record in _records(schema, 500, seed=11):
        body = fast(record)
        assert body == _fastavro(schema, record)
        decoded = CODEC.decode(SINGLE_OBJECT_MAGIC + fingerprint_bytes(fp) + body).record
        assert all(decoded[k] == v for k, v in record.items())


def test_delete_uses_the_same_bytes() -> None:
    for key, version in (("R-1", 0), ("", -(2**63)), ("é🙂" * 50, 2**63 - 1)):
        record = {"entity_type": "reservation", "key": key, "group": "G", "version": version}
        data = CODEC.encode_delete("reservation", key, "G", version)
        assert data[10:] == _fastavro(CATALOG.delete.schema, record)
        assert CODEC.decode(data).record == record


def test_confluent_codec_uses_the_fast_writer() -> None:
    client = RegistryClient("http://registry.invalid", transport=FakeSchemaRegistry().transport())
    codec = ConfluentCodec(CATALOG, client)
    first = codec.encode("reservation", RESERVATION)  # registers, then compiles
    assert "reservation" in codec._fast
    assert codec.encode("reservation", RESERVATION) == first
    assert first[5:] == _fastavro(CATALOG.entity("reservation").schema, RESERVATION)
    with pytest.raises(SerializationError, match=r"field 'seats': expected int, got str"):
        codec.encode("reservation", {**RESERVATION, "seats": "two"})
    client.close()


# --- refusals ----------------------------------------------------------------------------
@pytest.mark.parametrize(("changes", "message"), [
    ({"seats": "two"}, r"cannot encode reservation: field 'seats': expected int, got str 'two'"),
    ({"seats": None}, r"field 'seats': expected int, got NoneType None"),
    ({"seats": 2**64}, r"field 'seats': expected int, got int 18446744073709551616 \(.*too large"),
    ({"version": -(2**63) - 1}, r"field 'version': expected long, got int"),
    ({"amount": None}, r"field 'amount': expected double, got NoneType"),
    ({"amount": "lots"}, r"field 'amount': expected double, got str 'lots'"),
    ({"customer_id": 7}, r"field 'customer_id': expected string, got int 7"),
    ({"customer_id": b"C-7"}, r"field 'customer_id': expected string, got bytes"),
    ({"reservation_id": "\ud800"}, r"field 'reservation_id': expected string, got str .*surrogates"),
    ({"state": "PENDING"}, r"field 'state': expected enum ReservationState \(NEW, CONFIRMED, .*got str 'PENDING'"),
    ({"state": None}, r"field 'state': expected enum ReservationState"),
    ({"flight_number": ...}, r"field 'flight_number': missing, and its schema has no default"),
])
def test_bad_records_refused_like_fastavro(changes: dict[str, Any], message: str) -> None:
    record = {k: v for k, v in {**RESERVATION, **changes}.items() if v is not ...}
    assert isinstance(_fastavro(CATALOG.entity("reservation").schema, record), str)  # fastavro refuses
    with pytest.raises(SerializationError, match=message):
        CODEC.encode("reservation", record)


def test_not_a_record_refused() -> None:
    for record in (None, ["R-1"], "R-1"):
        with pytest.raises(SerializationError, match=r"cannot encode reservation: expected a record"):
            CODEC.encode("reservation", record)  # type: ignore[arg-type]


def test_what_fastavro_accepts_the_codec_writes_identically() -> None:
    schema, prefix = CATALOG.entity("reservation").schema, CODEC._encoders["reservation"][0]
    lenient: list[Mapping[str, Any]] = [
        {**RESERVATION, "seats": 1.5}, {**RESERVATION, "seats": True}, {**RESERVATION, "seats": 2**40},
        {**RESERVATION, "seats": Small.THREE}, {**RESERVATION, "amount": "NaN"}, {**RESERVATION, "amount": 3},
        {**RESERVATION, "state": Text("NEW")}, {**RESERVATION, "customer_id": Loud("x")},
        {**RESERVATION, "extra": object()}, OrderedDict(RESERVATION), Record(RESERVATION),
        {k: v for k, v in RESERVATION.items() if k != "customer_id"},
    ]
    for record in lenient:
        expected = _fastavro(schema, record)
        assert isinstance(expected, bytes), record
        assert CODEC.encode("reservation", record) == prefix + expected


# --- what does not compile ---------------------------------------------------------------
@pytest.mark.parametrize("field_type", [
    {"type": "int", "logicalType": "date"},
    ["null", {"type": "long", "logicalType": "timestamp-millis"}],
    {"type": "string", "logicalType": "uuid"},
    {"type": "record", "name": "Inner", "fields": [{"name": "a", "type": "int"}]},
    {"type": "array", "items": "int"},
    {"type": "map", "values": "string"},
    {"type": "fixed", "name": "Four", "size": 4},
    ["null", "string", "int"], ["int", "string"], ["null"],
    ["null", {"type": "array", "items": "int"}],
])
def test_not_flat_schemas_do_not_compile(field_type: Any) -> None:
    schema = parse({"type": "record", "name": "R", "fields": [
        {"name": "ok", "type": "string"}, {"name": "x", "type": field_type}]}, "test")
    assert compile_writer(schema) is None
    assert compile_writer({"type": "string"}) is None


def test_named_record_reference_does_not_compile() -> None:
    schema = parse({"type": "record", "name": "R", "fields": [
        {"name": "a", "type": {"type": "record", "name": "In", "fields": [{"name": "v", "type": "int"}]}},
        {"name": "b", "type": ["null", "In"]}]}, "test")
    assert compile_writer(schema) is None


# --- every simple type, differentially ------------------------------------------------------
def test_everything_schema_random_records_identical(tmp_path: Path) -> None:
    codec = _everything_codec(tmp_path)
    schema = codec.catalog.entity("everything").schema
    fast = compile_writer(schema)
    assert fast is not None
    for record in _records(schema, 3000, seed=3):
        body = fast(record)
        assert body == _fastavro(schema, record)
        decoded = codec.decode(codec.encode("everything", record)).record
        assert codec.encode("everything", decoded)[10:] == body


def test_everything_schema_odd_values_same_outcome(tmp_path: Path) -> None:
    """Random odd values (wrong types, edges, subclasses, other mappings): the fast writer
    answers only with fastavro's bytes, and the codec writes or refuses exactly as before."""
    codec = _everything_codec(tmp_path)
    schema = codec.catalog.entity("everything").schema
    prefix = codec._encoders["everything"][0]
    fast = compile_writer(schema)
    assert fast is not None
    quick = codec.encoder()
    rng = random.Random(5)
    good = list(_records(schema, 4000, seed=9))
    answered = 0
    for record in good:
        for name in rng.sample(sorted(record), rng.choice([0, 1, 1, 2])):
            if rng.random() < 0.1:
                del record[name]
            else:
                record[name] = rng.choice(ODD)
        candidate = rng.choices(CONTAINERS, [8, 1, 1, 1])[0](record)
        expected = _fastavro(schema, candidate)
        try:
            body = fast(candidate)
        except Exception:
            pass
        else:
            answered += 1
            assert body == expected, candidate
        try:
            before: bytes | str = _write(prefix, schema, candidate, "everything")
        except SerializationError:
            before = "refused"
        try:
            after: bytes | str = codec.encode("everything", candidate)
        except SerializationError as exc:
            after = "refused"
            assert str(exc).startswith("cannot encode everything: ")
            with pytest.raises(SerializationError) as quick_refusal:
                quick.encode("everything", candidate)  # the hot path's encode: the same error
            assert str(quick_refusal.value) == str(exc)
        else:
            assert quick.encode("everything", candidate) == after
        assert after == before
        assert (after == "refused") == isinstance(expected, str)
    assert answered > 1000  # the fast path did most of the work


def test_explain_names_the_field_fastavro_refuses(tmp_path: Path) -> None:
    schema = _everything_codec(tmp_path).catalog.entity("everything").schema
    record = next(_records(schema, 1))
    assert explain_refusal(schema, record) is None
    record.update(x_int=1.5, on_int=1.5)  # the first is truncated by fastavro, the second refused
    assert (explain_refusal(schema, record) or "").startswith(
        "field 'on_int': expected null or int, got float 1.5")
    record.update(on_int=None, e_def="PURPLE")
    assert (explain_refusal(schema, record) or "").startswith(
        "field 'e_def': expected enum Color (RED, GREEN, BLUE), got str 'PURPLE'")
    del record["e_def"], record["by_def"]
    assert (explain_refusal(schema, record) or "").startswith(
        "field 'by_def': missing, and its default expected bytes, got str 'ÿ'")
