"""State-topic records: version and group from tombstone headers or from upsert values."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest

from fifolane.config import Settings
from fifolane.errors import SchemaRegistryError
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.serde.state_records import StateRecord, StateRecordReader, state_headers

CATALOG = SchemaCatalog.load()
CODEC = make_codec(Settings(), CATALOG)


def _reservation(version: int, flight: str = "F7") -> bytes:
    return CODEC.encode("reservation", {
        "reservation_id": "R1", "flight_number": flight, "customer_id": "c", "seats": 2,
        "amount": 5.0, "state": "NEW", "version": version})


def test_upserts_without_headers_are_read_from_their_value() -> None:
    read = StateRecordReader(CODEC).read
    assert read(_reservation(41), None) == StateRecord(41, "F7", False)  # flat: field scanner
    flight = CODEC.encode("flight", {"flight_number": "F3", "origin": "FRA", "destination": "JFK",
                                     "departure": date(2026, 1, 1), "capacity": 3, "version": 9})
    assert read(flight, []) == StateRecord(9, "F3", False)  # a date field: full decode
    load = CODEC.encode("flight_load", {"flight_number": "F3", "seats_sold": 4, "version": 2})
    assert read(load, None) == StateRecord(2, "F3", False)  # key and group are one field


def test_headers_win_and_tombstones_need_them() -> None:
    read = StateRecordReader(CODEC).read
    headers: Any = state_headers(b"reservation", b"F7", 50)
    assert read(None, headers) == StateRecord(50, "F7", True)
    assert read(_reservation(41), headers) == StateRecord(50, "F7", False)  # written with headers
    assert read(None, None) is None  # a bare tombstone: not written by a worker
    assert read(None, [("fifolane.type", b"reservation")]) is None


def test_values_that_are_not_entities_are_not_rows() -> None:
    read = StateRecordReader(CODEC).read
    assert read(b"not avro", None) is None
    assert read(_reservation(41)[:-1], None) is None  # truncated: scanner and decoder refuse
    assert read(CODEC.encode_delete("reservation", "R1", "F7", 3), None) is None


def test_a_registry_failure_is_not_mistaken_for_a_foreign_record() -> None:
    class Unreachable:
        catalog = CATALOG

        def scanner(self, types: Any) -> Any:
            return lambda value: None

        def decode(self, value: bytes) -> Any:
            raise SchemaRegistryError("schema registry http://registry.invalid: connection refused")

    with pytest.raises(SchemaRegistryError):
        StateRecordReader(Unreachable()).read(b"\x00\x00\x00\x00\x01\x02", None)
