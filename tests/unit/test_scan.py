"""The field scanner (fifolane.serde.scan) against fastavro: same values when it answers,
and never an answer for a body fastavro refuses."""

from __future__ import annotations

import random
from io import BytesIO
from typing import Any

import fastavro
import pytest

from fifolane.config import Settings
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.serde.scan import compile_reader, compile_scanner

SCHEMA = fastavro.parse_schema({
    "type": "record", "name": "Every", "fields": [
        {"name": "id", "type": "string"},
        {"name": "n", "type": "int"},
        {"name": "big", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "b", "type": "bytes"},
        {"name": "ok", "type": "boolean"},
        {"name": "nothing", "type": "null"},
        {"name": "color", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN", "BLUE"]}},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "maybe", "type": ["null", "string", "long"]},
        {"name": "group", "type": "string"},
        {"name": "version", "type": "long"},
    ],
}, named_schemas={})
WANTED = ("id", "group", "version", "maybe", "color", "ok", "b", "n")


def _record(rng: random.Random) -> dict[str, Any]:
    def text() -> str:
        return "".join(rng.choice("ab\u00e9\u4e2d\U0001f600") for _ in range(rng.randrange(0, 70)))

    return {
        "id": text(), "n": rng.randrange(-2**31, 2**31), "big": rng.randrange(-2**62, 2**62),
        "f": rng.random(), "d": rng.random() * 1e9, "b": rng.randbytes(rng.randrange(0, 90)),
        "ok": rng.random() < 0.5, "nothing": None, "color": rng.choice(["RED", "GREEN", "BLUE"]),
        "fx": rng.randbytes(4), "maybe": rng.choice([None, text(), rng.randrange(-10**12, 10**12)]),
        "group": text(), "version": rng.randrange(0, 2**40),
    }


def _encode(record: dict[str, Any]) -> bytes:
    out = BytesIO()
    fastavro.schemaless_writer(out, SCHEMA, record)
    return out.getvalue()


def _decode(body: bytes) -> dict[str, Any] | None:
    fo = BytesIO(body)
    try:
        record: dict[str, Any] = fastavro.schemaless_reader(fo, SCHEMA, None)
    except Exception:  # noqa: BLE001 - any refusal counts
        return None
    return record if fo.tell() == len(body) else None


def _corrupt(rng: random.Random) -> bytes:
    """A random record's body, cut, extended or with a byte or two changed."""
    body = bytearray(_encode(_record(rng)))
    how = rng.randrange(3)
    if how == 0:
        del body[rng.randrange(len(body)):]
    elif how == 1:
        body += rng.randbytes(rng.randrange(1, 4))
    else:
        for _ in range(rng.randrange(1, 3)):
            body[rng.randrange(len(body))] = rng.randrange(256)
    return bytes(body)


def test_scanner_reads_what_fastavro_reads() -> None:
    scan = compile_scanner(SCHEMA, WANTED)
    assert scan is not None
    rng = random.Random(7)
    for _ in range(2000):
        record = _record(rng)
        body = b"HDR" + _encode(record)
        assert scan(body, 3) == [record[name] for name in WANTED]


def test_scanner_never_accepts_what_fastavro_refuses() -> None:
    """Corrupt bodies (cut, extended, bytes changed): an answer only where fastavro agrees."""
    scan = compile_scanner(SCHEMA, WANTED)
    assert scan is not None
    rng = random.Random(11)
    answered = refused = 0
    for _ in range(6000):
        data = _corrupt(rng)
        got = scan(data, 0)
        expected = _decode(data)
        if got is None:
            refused += 1
            continue
        answered += 1
        assert expected is not None, f"scanner accepted a body fastavro refuses: {data.hex()}"
        assert got == [expected[name] for name in WANTED]
    assert answered > 100 and refused > 1000  # both branches exercised


def _same(got: dict[str, Any] | None, want: dict[str, Any] | None) -> bool:
    """The same record: field order, values and exact types (repr tells 1 from 1.0, -0.0 from 0.0)."""
    return got is not None and want is not None and list(got) == list(want) and \
        all(type(got[k]) is type(want[k]) and repr(got[k]) == repr(want[k]) for k in want)


def test_reader_reads_what_fastavro_reads() -> None:
    read = compile_reader(SCHEMA)
    assert read is not None
    rng = random.Random(5)
    for _ in range(2000):
        body = _encode(_record(rng))
        assert _same(read(b"HDR" + body, 3), _decode(body))


def test_reader_never_accepts_what_fastavro_refuses() -> None:
    """Corrupt bodies: a record only where fastavro gives the very same one."""
    read = compile_reader(SCHEMA)
    assert read is not None
    rng = random.Random(13)
    answered = refused = 0
    for _ in range(6000):
        data = _corrupt(rng)
        got = read(data, 0)
        if got is None:
            refused += 1
            continue
        answered += 1
        assert _same(got, _decode(data)), f"reader and fastavro differ on {data.hex()}"
    assert answered > 100 and refused > 1000


def test_reader_declines_what_is_not_flat() -> None:
    for field_type in ({"type": "array", "items": "int"}, {"type": "int", "logicalType": "date"}):
        schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
            {"name": "id", "type": "string"}, {"name": "other", "type": field_type}]}, named_schemas={})
        assert compile_reader(schema) is None


def test_codec_decodes_flat_values_without_fastavro(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values of a current flat schema take the reader; anything it declines (a cut value,
    trailing bytes) still gets fastavro's answer and error message."""
    import fifolane.serde.codec as codec_module

    codec = make_codec(Settings(), SchemaCatalog.load(Settings().schemas_dir))
    record = {"reservation_id": "R1", "flight_number": "F1", "customer_id": "c\u00e9", "seats": 2,
              "amount": 5.0, "state": "CONFIRMED", "version": 12}
    value = codec.encode("reservation", record)
    errors = []
    for bad in (value[:-1], value + b"\x00"):
        try:
            codec.decode(bad)
        except Exception as exc:  # noqa: BLE001 - the message is compared below
            errors.append(f"{type(exc).__name__}: {exc}")
    assert len(errors) == 2 and "trailing bytes" in errors[1]

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("fastavro was asked")

    monkeypatch.setattr(codec_module, "schemaless_reader", refuse)
    decoded = codec.decode(value)
    assert decoded.type.name == "reservation" and not decoded.is_delete and _same(decoded.record, record)
    deleted = codec.decode(codec.encode_delete("reservation", "R1", "F1", 13))
    assert deleted.is_delete and deleted.record == {"entity_type": "reservation", "key": "R1", "group": "F1",
                                                     "version": 13}


@pytest.mark.parametrize("field_type", [
    {"type": "record", "name": "Inner", "fields": [{"name": "x", "type": "int"}]},
    {"type": "array", "items": "int"},
    {"type": "map", "values": "int"},
    {"type": "int", "logicalType": "date"},
    {"type": "string", "logicalType": "uuid"},
])
def test_scanner_declines_schemas_that_are_not_flat(field_type: Any) -> None:
    schema = fastavro.parse_schema({"type": "record", "name": "R", "fields": [
        {"name": "id", "type": "string"}, {"name": "other", "type": field_type}]}, named_schemas={})
    assert compile_scanner(schema, ("id",)) is None


def test_a_field_asked_for_twice_is_returned_twice() -> None:
    """A type whose key is also its group (flight_load: flight_number)."""
    scan = compile_scanner(SCHEMA, ("group", "group", "version"))
    assert scan is not None
    record = _record(random.Random(3))
    assert scan(_encode(record), 0) == [record["group"], record["group"], record["version"]]


def test_scanner_declines_missing_or_unreturnable_fields() -> None:
    assert compile_scanner(SCHEMA, ("id", "no_such_field")) is None
    assert compile_scanner(SCHEMA, ("d",)) is None  # floats are skipped, never returned
    assert compile_scanner(SCHEMA, ("fx",)) is None


def test_codec_scanner_only_for_current_upserts_of_the_asked_types() -> None:
    catalog = SchemaCatalog.load(Settings().schemas_dir)
    codec = make_codec(Settings(), catalog)
    scan = codec.scanner({"reservation"})
    record = {"reservation_id": "R1", "flight_number": "F1", "customer_id": "c", "seats": 2,
              "amount": 5.0, "state": "CONFIRMED", "version": 12}
    value = codec.encode("reservation", record)
    found = scan(value)
    assert found is not None and found[0].name == "reservation" and found[1] == ["R1", "F1", 12]
    assert scan(codec.encode_delete("reservation", "R1", "F1", 13)) is None  # deletes: decode
    assert codec.scanner({"flight"})(value) is None  # not an asked type
    assert scan(value[:-1]) is None and scan(value + b"\x00") is None
    assert scan(b"\xc3\x01" + bytes(8) + b"\x02") is None  # unknown fingerprint
    assert scan(None) is None  # type: ignore[arg-type]
    assert scan(b"") is None and scan(b"\xc3") is None and scan(value[:9]) is None  # cut in the header
    assert scan(b"\x00" + value[1:]) is None  # not single-object encoding


def _history_writer(codec: Any, name: str) -> tuple[Any, bytes]:
    """A history writer schema of the bundled catalog and its single-object header."""
    from fifolane.serde.fingerprint import fingerprint_bytes

    writer = next(w for w in codec.catalog.writers.values() if w.where.endswith(name))
    return writer, b"\xc3\x01" + fingerprint_bytes(writer.fingerprint)


@pytest.mark.parametrize("version_file", ["reservation.v1.avsc", "reservation.v2.avsc"])
def test_codec_scanner_reads_older_writer_schemas_as_decode_does(version_file: str) -> None:
    """Values of an older schema version that resolve unchanged into the current one (v2
    lacks an enum symbol, v1 also a field with a default) take the scanner too, and it
    answers exactly what a decode answers, and nothing for a body decode refuses."""
    codec = make_codec(Settings(), SchemaCatalog.load(Settings().schemas_dir))
    writer, header = _history_writer(codec, version_file)
    assert writer.reader is not None  # an older version: decoded with resolution
    scan = codec.scanner({"reservation"})
    rng = random.Random(7)
    accepted = 0
    for i in range(400):
        record = {"reservation_id": f"R{i}\u00e9", "flight_number": f"F{rng.randrange(9)}", "customer_id": "c",
                  "seats": rng.randrange(-5, 9), "amount": rng.random(),
                  "state": rng.choice(["NEW", "CONFIRMED", "REJECTED", "CANCELLED"]),
                  "version": rng.randrange(0, 2**40)}
        body = BytesIO()
        fastavro.schemaless_writer(body, writer.schema, record)
        value = header + body.getvalue()
        if i % 2:  # damaged: cut, grown, or a byte changed
            b = bytearray(value)
            j = rng.randrange(10, len(b))
            value = bytes(b[:j]) if i % 3 == 0 else bytes(b) + b"\x00" if i % 3 == 1 else \
                bytes(b[:j]) + bytes([rng.randrange(256)]) + bytes(b[j + 1:])
        try:
            decoded = codec.decode(value)
            expected: list[Any] | None = [decoded.key, decoded.group, decoded.version]
        except Exception:  # noqa: BLE001 - any refusal counts
            expected = None
        found = scan(value)
        if found is not None:
            accepted += 1
            assert expected is not None, f"scanner accepted a value decode refuses: {value.hex()}"
            assert found[0].name == "reservation" and found[1] == expected
    assert accepted >= 200  # every intact value, and the damage that decodes the same


@pytest.mark.parametrize("change", ["promoted", "lost symbol", "alias", "no default", "renamed record"])
def test_writer_schemas_that_resolve_with_changes_are_decoded_not_scanned(change: str) -> None:
    """A writer schema whose values would change (or fail) on resolution gets no scanner."""
    from fifolane.serde.scan import reads_unchanged

    def schema(version: str = "long", symbols: tuple[str, ...] = ("A", "B"), name: str = "R",
               extra: dict[str, Any] | None = None, alias: bool = False) -> dict[str, Any]:
        fields: list[dict[str, Any]] = [
            {"name": "id", "type": "string", **({"aliases": ["ident"]} if alias else {})},
            {"name": "s", "type": {"type": "enum", "name": "S", "symbols": list(symbols)}},
            {"name": "version", "type": version}]
        return fastavro.parse_schema({"type": "record", "name": name,
                                      "fields": fields + ([extra] if extra else [])}, named_schemas={})

    reader = schema()
    assert reads_unchanged(schema(symbols=("A",)), reader)  # the reader gained a symbol
    assert reads_unchanged(schema(extra={"name": "gone", "type": "double"}), reader)  # dropped
    assert reads_unchanged(schema(), schema(extra={"name": "new", "type": "int", "default": 0}))
    writer, current = {
        "promoted": (schema(version="int"), reader),
        "lost symbol": (schema(symbols=("A", "B", "C")), reader),
        "alias": (schema(), schema(alias=True)),
        "no default": (schema(), schema(extra={"name": "new", "type": "int"})),
        "renamed record": (schema(name="Q"), reader),
    }[change]
    assert not reads_unchanged(writer, current)


def test_codec_decoder_answers_as_decode_does() -> None:
    """decoder() (the hot paths' decode) gives decode()'s answer or its very error, for current
    values, deletes, older schema versions, damaged values and garbage."""
    codec = make_codec(Settings(), SchemaCatalog.load(Settings().schemas_dir))
    decode, quick = codec.decode, codec.decoder()
    writer, header = _history_writer(codec, "reservation.v1.avsc")
    old = BytesIO()
    fastavro.schemaless_writer(old, writer.schema, {"reservation_id": "R0", "flight_number": "F0", "seats": 1,
                                                    "amount": 2.5, "state": "NEW", "version": 3})
    rng = random.Random(17)
    values: list[Any] = [header + old.getvalue(), codec.encode_delete("reservation", "R1", "F1", 13),
                         None, b"", b"\xc3\x01", b"garbage", b"\xc3\x01" + bytes(8) + b"\x02"]
    for i in range(300):
        record = {"reservation_id": f"R{i}\u00e9", "flight_number": f"F{i % 7}", "customer_id": "c",
                  "seats": rng.randrange(-5, 9), "amount": rng.random(),
                  "state": rng.choice(["NEW", "CONFIRMED", "REJECTED", "CANCELLED"]), "version": i}
        value = codec.encode("reservation", record)
        values.append(value)
        b = bytearray(value)
        b[rng.randrange(10, len(b))] = rng.randrange(256)
        values += [bytes(b), value[:-1], value + b"\x00"]

    def outcome(fn: Any, value: Any) -> Any:
        try:
            d = fn(value)
        except Exception as exc:  # noqa: BLE001 - the error itself is compared
            return type(exc), str(exc)
        return type(d), d.type.name, d.is_delete, [(k, type(v), repr(v)) for k, v in d.record.items()]

    answered = 0
    for value in values:
        want = outcome(decode, value)
        assert outcome(quick, value) == want, value
        answered += not issubclass(want[0], Exception)
    assert answered > 300


def test_codec_decodes_a_memoryview_as_before() -> None:
    """The compiled walk takes bytes only: other buffers go to fastavro, as before it."""
    codec = make_codec(Settings(), SchemaCatalog.load(Settings().schemas_dir))
    record = {"reservation_id": "R1", "flight_number": "F1", "customer_id": "c", "seats": 2,
              "amount": 5.0, "state": "CONFIRMED", "version": 12}
    value = codec.encode("reservation", record)
    buffer = memoryview(value)
    assert codec.decode(buffer).record == record  # type: ignore[arg-type]
    assert codec.decoder()(buffer).record == record  # type: ignore[arg-type]
