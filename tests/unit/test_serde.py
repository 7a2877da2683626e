"""Codecs: both wire formats round trip, evolve, and fail with the specific error."""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from fifolane.config import Settings
from fifolane.errors import SerializationError, UnknownSchemaError, ValidationError
from fifolane.serde import Codec, Decoded, SchemaCatalog, SingleObjectCodec, make_codec
from fifolane.serde.confluent import ConfluentCodec, RegistryClient, SchemaRegistryError
from fifolane.serde.fake_registry import FakeSchemaRegistry
from fifolane.serde.fingerprint import fingerprint_bytes
from schemas import SCHEMAS_DIR

CATALOG = SchemaCatalog.load()
RESERVATION = {
    "reservation_id": "R-1001", "flight_number": "LX318", "customer_id": "C-7",
    "seats": 2, "amount": 310.5, "state": "CONFIRMED", "version": 12,
}
FLIGHT = {
    "flight_number": "LX318", "origin": "ZRH", "destination": "LHR",
    "departure": dt.date(2025, 6, 1), "capacity": 180, "version": 3,
}


@pytest.fixture(params=["single-object", "confluent"])
def codec(request: pytest.FixtureRequest) -> Iterator[Codec]:
    if request.param == "single-object":
        yield SingleObjectCodec(CATALOG)
    else:
        client = RegistryClient("http://registry.invalid", transport=FakeSchemaRegistry().transport())
        yield ConfluentCodec(CATALOG, client)
        client.close()


def _confluent(registry: FakeSchemaRegistry) -> ConfluentCodec:
    return ConfluentCodec(CATALOG, RegistryClient("http://registry.invalid", transport=registry.transport()))


# --- round trips -------------------------------------------------------------------------
def test_round_trip_entities(codec: Codec) -> None:
    for type_name, record in (("reservation", RESERVATION), ("flight", FLIGHT)):
        decoded = codec.decode(codec.encode(type_name, record))
        assert decoded == Decoded(CATALOG.entity(type_name), record, False)
        assert decoded.key == record[CATALOG.entity(type_name).key_path]
        assert (decoded.group, decoded.version) == ("LX318", record["version"])


def test_round_trip_delete(codec: Codec) -> None:
    decoded = codec.decode(codec.encode_delete("reservation", "R-1001", "LX318", 13))
    assert decoded.is_delete
    assert decoded.type is CATALOG.entity("reservation")
    assert decoded.record == {"entity_type": "reservation", "key": "R-1001", "group": "LX318", "version": 13}
    assert (decoded.key, decoded.group, decoded.version) == ("R-1001", "LX318", 13)


def test_delete_of_unknown_type_refused_at_encode(codec: Codec) -> None:
    with pytest.raises(UnknownSchemaError, match=r"unknown entity type 'booking'"):
        codec.encode_delete("booking", "k", "g", 1)


def test_single_object_framing() -> None:
    data = SingleObjectCodec(CATALOG).encode("reservation", RESERVATION)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == fingerprint_bytes(CATALOG.entity("reservation").fingerprint)


def test_confluent_framing_and_id_cache() -> None:
    registry = FakeSchemaRegistry()
    codec = _confluent(registry)
    first = codec.encode("reservation", RESERVATION)
    codec.encode("reservation", RESERVATION)
    assert first[0] == 0
    schema_id = int.from_bytes(first[1:5], "big")
    assert registry.subjects == {"fifolane.flights.Reservation": [schema_id]}
    assert registry.requests.count(("POST", "/subjects/fifolane.flights.Reservation/versions")) == 1
    # A second process (fresh codec) knows the id only from the registry: fetched once.
    reader = _confluent(registry)
    for _ in range(3):
        assert reader.decode(first).record == RESERVATION
    assert registry.requests.count(("GET", f"/schemas/ids/{schema_id}")) == 1


def test_confluent_over_real_http() -> None:
    registry = FakeSchemaRegistry()
    with registry.serve() as url:
        codec = make_codec(Settings(schema_registry_url=url, schemas_dir=SCHEMAS_DIR))
        assert isinstance(codec, ConfluentCodec)
        assert codec.decode(codec.encode("flight", FLIGHT)).record == FLIGHT


def test_make_codec_without_registry_is_single_object() -> None:
    assert isinstance(make_codec(Settings(schemas_dir=SCHEMAS_DIR)), SingleObjectCodec)


@settings(max_examples=200, deadline=None)
@given(
    reservation_id=st.text(min_size=1), flight=st.text(min_size=1), customer=st.text(),
    seats=st.integers(-(2**31), 2**31 - 1),
    amount=st.floats(allow_nan=False), state=st.sampled_from(["NEW", "CONFIRMED", "REJECTED", "CANCELLED"]),
    version=st.integers(-(2**63), 2**63 - 1),
)
def test_round_trip_property(
    reservation_id: str, flight: str, customer: str, seats: int, amount: float, state: str, version: int
) -> None:
    record = {"reservation_id": reservation_id, "flight_number": flight, "customer_id": customer,
              "seats": seats, "amount": amount, "state": state, "version": version}
    codec = SingleObjectCodec(CATALOG)
    assert codec.decode(codec.encode("reservation", record)).record == record


# --- evolution ----------------------------------------------------------------------------
def _v1_bytes() -> tuple[int, bytes]:
    raw = json.loads((SCHEMAS_DIR / "history" / "reservation.v1.avsc").read_text())
    v1 = parse_schema(raw, named_schemas={})
    body = io.BytesIO()
    record = {k: v for k, v in RESERVATION.items() if k != "customer_id"}
    schemaless_writer(body, v1, record)
    fp = next(fp for fp, w in CATALOG.writers.items() if w.where.endswith("reservation.v1.avsc"))
    return fp, body.getvalue()


def test_history_record_read_with_current_schema() -> None:
    fp, body = _v1_bytes()
    decoded = SingleObjectCodec(CATALOG).decode(b"\xc3\x01" + fingerprint_bytes(fp) + body)
    assert decoded.type is CATALOG.entity("reservation")
    assert decoded.record == {**RESERVATION, "customer_id": ""}  # the new field's default


def test_history_record_read_through_registry() -> None:
    registry = FakeSchemaRegistry()
    _, body = _v1_bytes()
    v1_text = (SCHEMAS_DIR / "history" / "reservation.v1.avsc").read_text()
    status, answer = registry.handle("POST", "/subjects/fifolane.flights.Reservation/versions",
                                     json.dumps({"schema": v1_text}).encode())
    assert status == 200
    data = b"\x00" + int(answer["id"]).to_bytes(4, "big") + body
    assert _confluent(registry).decode(data).record == {**RESERVATION, "customer_id": ""}


# --- decoding errors ----------------------------------------------------------------------
def test_single_object_errors() -> None:
    codec = SingleObjectCodec(CATALOG)
    good = codec.encode("reservation", RESERVATION)
    with pytest.raises(SerializationError, match=r"not Avro single-object encoding: starts with 0001, expected c301"):
        codec.decode(b"\x00\x01garbage")
    with pytest.raises(SerializationError, match=r"truncated single-object header: 5 bytes, need 10"):
        codec.decode(good[:5])
    with pytest.raises(UnknownSchemaError, match=r"unknown writer schema fingerprint 0x0102030405060708"):
        codec.decode(b"\xc3\x01" + (0x0102030405060708).to_bytes(8, "little") + good[10:])
    with pytest.raises(SerializationError, match=r"undecodable reservation value") as info:
        codec.decode(good[:-3])
    assert info.value.__cause__ is not None  # chained from fastavro's error
    for cut in range(1, 28):  # a value cut anywhere: a message that says so, no object address
        with pytest.raises(SerializationError) as info:
            codec.decode(good[:-cut])
        assert str(info.value).startswith(f"undecodable reservation value ({len(good) - cut} bytes): the value "
                                          "ends before the record does (truncated?)"), str(info.value)
        assert " object at 0x" not in str(info.value)
    with pytest.raises(SerializationError, match=r"2 trailing bytes after the record"):
        codec.decode(good + b"\x00\x00")
    with pytest.raises(SerializationError, match=r"no value \(null / tombstone\)"):
        codec.decode(None)  # type: ignore[arg-type]


def test_garbage_body_is_a_serialization_error_not_unknown_schema() -> None:
    codec = SingleObjectCodec(CATALOG)
    header = codec.encode("reservation", RESERVATION)[:10]
    with pytest.raises(SerializationError) as info:
        codec.decode(header + b"\xff" * 40)
    assert not isinstance(info.value, UnknownSchemaError)


def test_confluent_errors() -> None:
    registry = FakeSchemaRegistry()
    codec = _confluent(registry)
    with pytest.raises(SerializationError, match=r"not Confluent wire format: first byte c3, expected 00"):
        codec.decode(b"\xc3\x01abc")
    with pytest.raises(SerializationError, match=r"truncated Confluent header: 3 bytes, need 5"):
        codec.decode(b"\x00\x00\x00")
    with pytest.raises(UnknownSchemaError, match=r"has no schema with id 99"):
        codec.decode(b"\x00\x00\x00\x00\x63" + b"\x02")


def test_confluent_schema_of_foreign_record_is_unknown() -> None:
    registry = FakeSchemaRegistry()
    foreign = {"type": "record", "name": "Other", "namespace": "x", "fields": [{"name": "a", "type": "int"}]}
    _, answer = registry.handle("POST", "/subjects/x.Other/versions",
                                json.dumps({"schema": json.dumps(foreign)}).encode())
    with pytest.raises(UnknownSchemaError, match=r"record x.Other is not a known entity type"):
        _confluent(registry).decode(b"\x00" + int(answer["id"]).to_bytes(4, "big") + b"\x02")


def test_registry_unreachable_is_a_registry_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    codec = ConfluentCodec(CATALOG, RegistryClient("http://registry.invalid", transport=httpx.MockTransport(refuse)))
    with pytest.raises(SchemaRegistryError, match=r"schema registry http://registry.invalid: POST .*connection refused"):
        codec.encode("reservation", RESERVATION)


def test_delete_naming_unknown_type_is_unknown_schema() -> None:
    codec = SingleObjectCodec(CATALOG)
    body = io.BytesIO()
    schemaless_writer(body, CATALOG.delete.schema, {"entity_type": "ghost", "key": "k", "group": "g", "version": 1})
    data = b"\xc3\x01" + fingerprint_bytes(CATALOG.delete.fingerprint) + body.getvalue()
    with pytest.raises(UnknownSchemaError, match=r"delete of unknown entity type 'ghost'"):
        codec.decode(data)


# --- encoding errors ----------------------------------------------------------------------
def test_encode_errors(codec: Codec) -> None:
    with pytest.raises(SerializationError, match=r"cannot encode reservation: .*seats"):
        codec.encode("reservation", {**RESERVATION, "seats": "two"})
    with pytest.raises(UnknownSchemaError, match=r"unknown entity type 'booking'"):
        codec.encode("booking", RESERVATION)


# --- JSON validation ----------------------------------------------------------------------
def _json_reservation(**changes: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {**RESERVATION, **changes}
    return {k: v for k, v in obj.items() if v is not ...}


@pytest.mark.parametrize(("obj", "message"), [
    (_json_reservation(seats="two"), "field 'seats': expected int, got 'two'"),
    (_json_reservation(seats=True), "field 'seats': expected int, got True"),
    (_json_reservation(seats=2**31), "field 'seats': 2147483648 is out of range for int"),
    (_json_reservation(amount="1.5"), "field 'amount': expected double, got '1.5'"),
    (_json_reservation(state="PENDING"),
     "field 'state': expected one of NEW, CONFIRMED, REJECTED, CANCELLED, TICKETED, got 'PENDING'"),
    (_json_reservation(version=1.5), "field 'version': expected long, got 1.5"),
    (_json_reservation(flight_number=...), "field 'flight_number': missing (required)"),
    (_json_reservation(color="red"), "field 'color': unknown field (fields of Reservation: reservation_id, "
                                     "flight_number, customer_id, seats, amount, state, version)"),
])
def test_validation_reasons(obj: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        CATALOG.validate("reservation", obj)
    assert str(info.value) == message


def test_validation_fills_defaults_and_converts() -> None:
    record = CATALOG.validate("reservation", _json_reservation(customer_id=..., amount=300))
    assert record["customer_id"] == ""
    assert record["amount"] == 300.0 and isinstance(record["amount"], float)


@pytest.mark.parametrize(("departure", "expected"), [
    ("2025-06-01", dt.date(2025, 6, 1)),
    (20240, dt.date(2025, 6, 1)),
])
def test_validation_of_dates(departure: Any, expected: dt.date) -> None:
    obj = {**FLIGHT, "departure": departure}
    assert CATALOG.validate("flight", obj)["departure"] == expected


@pytest.mark.parametrize("departure", ["2025-13-01", "01.06.2025", "20250601", 1.5])
def test_validation_of_bad_dates(departure: Any) -> None:
    with pytest.raises(ValidationError, match=r"field 'departure': (invalid date|expected date)"):
        CATALOG.validate("flight", {**FLIGHT, "departure": departure})


def test_validation_of_non_object() -> None:
    with pytest.raises(ValidationError, match=r"expected a JSON object for type 'flight', got list"):
        CATALOG.validate("flight", [1])


def test_delete_record_needs_key_group_version_only() -> None:
    reservation = CATALOG.entity("reservation")
    obj = {"reservation_id": "R-1", "flight_number": "LX1", "version": 4}
    assert reservation.delete_record(obj) == {"entity_type": "reservation", "key": "R-1", "group": "LX1", "version": 4}
    with pytest.raises(ValidationError, match=r"field 'version': missing \(a delete needs the version\)"):
        reservation.delete_record({"reservation_id": "R-1", "flight_number": "LX1"})
    with pytest.raises(ValidationError, match=r"field 'version': expected long, got '4'"):
        reservation.delete_record({**obj, "version": "4"})
