"""The bundled schemas and the catalog's checks of fifolane declarations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form

from fifolane.errors import SchemaError, UnknownSchemaError
from fifolane.serde import DELETE_SCHEMA_NAME, SchemaCatalog
from schemas import SCHEMAS_DIR


def _write(directory: Path, name: str, schema: dict[str, Any]) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(schema))
    return path


def _record(name: str, fields: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "namespace": "t", "fields": fields, **extra}


def _good_fields() -> list[dict[str, Any]]:
    return [
        {"name": "id", "type": "string", "fifolane.key": True},
        {"name": "account", "type": "string", "fifolane.group": True},
        {"name": "version", "type": "long"},
    ]


def _load_one(tmp_path: Path, schema: dict[str, Any], name: str = "x.avsc") -> SchemaCatalog:
    directory = tmp_path / "schemas"
    _write(directory, name, schema)
    return SchemaCatalog.load(directory)


# --- the bundled schemas -----------------------------------------------------------------
def test_bundled_catalog_types_and_roles() -> None:
    catalog = SchemaCatalog.load(SCHEMAS_DIR)
    # flight_load: the seat counts kept by the flights example (examples/flights.py)
    assert sorted(catalog.types) == ["flight", "flight_load", "reservation", "ticket"]
    load = catalog.entity("flight_load")
    assert load.key_path == load.group_path == "flight_number"
    reservation = catalog.entity("reservation")
    assert reservation.full_name == "fifolane.flights.Reservation"
    assert (reservation.key_path, reservation.group_path, reservation.version_field) == (
        "reservation_id", "flight_number", "version"
    )
    assert reservation.group_index_path == "state"
    flight = catalog.entity("flight")
    assert flight.key_path == flight.group_path == "flight_number"
    assert flight.group_index_path is None
    assert catalog.delete.schema["name"] == DELETE_SCHEMA_NAME


def test_bundled_field_names_are_the_user_contract() -> None:
    catalog = SchemaCatalog.load()
    names = [f["name"] for f in catalog.entity("reservation").raw_schema["fields"]]
    assert names == ["reservation_id", "flight_number", "customer_id", "seats", "amount", "state", "version"]
    state = catalog.entity("reservation").raw_schema["fields"][5]["type"]
    assert state["symbols"] == ["NEW", "CONFIRMED", "REJECTED", "CANCELLED", "TICKETED"]
    flight = catalog.entity("flight").raw_schema["fields"]
    assert [f["name"] for f in flight] == ["flight_number", "origin", "destination", "departure", "capacity", "version"]
    assert flight[3]["type"] == {"type": "int", "logicalType": "date"}


def test_history_schema_is_indexed_by_fingerprint() -> None:
    catalog = SchemaCatalog.load()
    current = catalog.entity("reservation")
    history = [w for w in catalog.writers.values() if w.entity is current and w.reader is not None]
    assert sorted(w.where for w in history) == ["schemas/history/reservation.v1.avsc",
                                                 "schemas/history/reservation.v2.avsc"]
    assert all(w.reader is current.schema for w in history)


def test_fingerprints_match_fastavro_crc64() -> None:
    catalog = SchemaCatalog.load()
    for fp, writer in catalog.writers.items():
        expected = fingerprint(to_parsing_canonical_form(writer.schema), "CRC-64-AVRO")
        assert fp.to_bytes(8, "little").hex() == expected


def test_unknown_type_lists_the_known_ones() -> None:
    with pytest.raises(UnknownSchemaError, match=r"unknown entity type 'booking'; known types: flight, flight_load, reservation"):
        SchemaCatalog.load().entity("booking")


# --- declarations refused, each with its message ---------------------------------------
def test_no_group_property(tmp_path: Path) -> None:
    fields = _good_fields()
    del fields[1]["fifolane.group"]
    with pytest.raises(SchemaError) as info:
        _load_one(tmp_path, _record("X", fields))
    assert str(info.value) == (
        "schemas/x.avsc: type 'x' declares no FIFO-group property; "
        "mark exactly one field with \"fifolane.group\": true"
    )


def test_two_group_properties(tmp_path: Path) -> None:
    fields = _good_fields()
    fields[0]["fifolane.group"] = True
    with pytest.raises(SchemaError, match=r"schemas/x.avsc: type 'x' declares 2 FIFO-group properties "
                                          r"\('id', 'account'\); keep \"fifolane.group\": true on exactly one"):
        _load_one(tmp_path, _record("X", fields))


def test_group_index_without_group(tmp_path: Path) -> None:
    fields = _good_fields()
    del fields[1]["fifolane.group"]
    fields.append({"name": "state", "type": "string", "fifolane.group_index": True})
    with pytest.raises(SchemaError, match=r"declares a FIFO-group index \('state'\) without a FIFO-group property"):
        _load_one(tmp_path, _record("X", fields))


def test_two_group_indexes(tmp_path: Path) -> None:
    fields = _good_fields()
    fields.append({"name": "a", "type": "string", "fifolane.group_index": True})
    fields.append({"name": "b", "type": "string", "fifolane.group_index": True})
    with pytest.raises(SchemaError, match=r"declares 2 FIFO-group indexes \('a', 'b'\)"):
        _load_one(tmp_path, _record("X", fields))


def test_no_key(tmp_path: Path) -> None:
    fields = _good_fields()
    del fields[0]["fifolane.key"]
    with pytest.raises(SchemaError, match=r"schemas/x.avsc: type 'x' declares no entity key; "
                                          r"mark exactly one field with \"fifolane.key\": true"):
        _load_one(tmp_path, _record("X", fields))


def test_two_keys(tmp_path: Path) -> None:
    fields = _good_fields()
    fields[1]["fifolane.key"] = True
    with pytest.raises(SchemaError, match=r"declares 2 entity keys \('id', 'account'\)"):
        _load_one(tmp_path, _record("X", fields))


def test_version_must_be_long(tmp_path: Path) -> None:
    fields = _good_fields()
    fields[2]["type"] = "int"
    with pytest.raises(SchemaError, match=r"version field 'version' has type int; it must be a long"):
        _load_one(tmp_path, _record("X", fields))


def test_missing_version_field(tmp_path: Path) -> None:
    fields = _good_fields()[:2]
    with pytest.raises(SchemaError, match=r"type 'x' has no version field; add a long field named 'version'"):
        _load_one(tmp_path, _record("X", fields))


def test_group_on_a_non_scalar(tmp_path: Path) -> None:
    fields = _good_fields()
    fields[1]["type"] = {"type": "array", "items": "string"}
    with pytest.raises(SchemaError, match=r"FIFO-group property 'account' has type array"):
        _load_one(tmp_path, _record("X", fields))


def test_invalid_avro_is_a_schema_error(tmp_path: Path) -> None:
    fields = _good_fields()
    fields[2]["type"] = "lung"
    with pytest.raises(SchemaError, match=r"schemas/x.avsc: invalid Avro schema"):
        _load_one(tmp_path, _record("X", fields))


def test_invalid_json(tmp_path: Path) -> None:
    directory = tmp_path / "schemas"
    directory.mkdir()
    (directory / "x.avsc").write_text("{not json")
    with pytest.raises(SchemaError, match=r"schemas/x.avsc: cannot read schema"):
        SchemaCatalog.load(directory)


# --- declarations accepted --------------------------------------------------------------
def test_nested_group_path_and_explicit_version(tmp_path: Path) -> None:
    schema = _record("Payment", [
        {"name": "id", "type": "string", "fifolane.key": True},
        {"name": "account", "type": {"type": "record", "name": "Account", "fields": [
            {"name": "number", "type": "string", "fifolane.group": True},
        ]}},
        {"name": "seq", "type": "long", "fifolane.version": True},
    ], **{"fifolane.type": "payment"})
    catalog = _load_one(tmp_path, schema, "payment.avsc")
    payment = catalog.entity("payment")
    assert payment.group_path == "account.number"
    assert payment.version_field == "seq"
    record = {"id": "p1", "account": {"number": "A-7"}, "seq": 3}
    assert (payment.group_of(record), payment.key_of(record), payment.version_of(record)) == ("A-7", "p1", 3)
    assert payment.group_of({"id": "p1"}) is None
    assert payment.group_of({"account": None}) is None
    assert payment.version_of({}) is None


def test_type_name_defaults_to_lower_record_name(tmp_path: Path) -> None:
    catalog = _load_one(tmp_path, _record("Account", _good_fields()))
    assert list(catalog.types) == ["account"]


def test_directory_without_delete_gets_the_bundled_one(tmp_path: Path) -> None:
    catalog = _load_one(tmp_path, _record("X", _good_fields()))
    assert catalog.delete.fingerprint == SchemaCatalog.load().delete.fingerprint


def test_duplicate_type_refused(tmp_path: Path) -> None:
    directory = tmp_path / "schemas"
    _write(directory, "a.avsc", _record("X", _good_fields()))
    _write(directory, "b.avsc", _record("Y", _good_fields(), **{"fifolane.type": "x"}))
    with pytest.raises(SchemaError, match=r"schemas/b.avsc: type 'x' .* is also defined by .*a.avsc"):
        SchemaCatalog.load(directory)


def test_history_field_without_default_refused(tmp_path: Path) -> None:
    directory = tmp_path / "schemas"
    current = _good_fields() + [{"name": "note", "type": "string"}]
    _write(directory, "x.avsc", _record("X", current))
    _write(directory, "history/x.v1.avsc", _record("X", _good_fields()))
    with pytest.raises(SchemaError, match=r"schemas/history/x.v1.avsc: records written with this schema cannot "
                                          r"be read as 'x': current field\(s\) note missing here need a default"):
        SchemaCatalog.load(directory)


def test_history_of_unknown_record_refused(tmp_path: Path) -> None:
    directory = tmp_path / "schemas"
    _write(directory, "x.avsc", _record("X", _good_fields()))
    _write(directory, "history/y.avsc", _record("Y", _good_fields()))
    with pytest.raises(SchemaError, match=r"history schema t.Y matches no current schema"):
        SchemaCatalog.load(directory)


def test_empty_directory_refused(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=r"no entity schemas"):
        SchemaCatalog.load(tmp_path)


def test_missing_directory_refused(tmp_path: Path) -> None:
    with pytest.raises(SchemaError, match=r"does not exist; set FIFOLANE_SCHEMAS_DIR"):
        SchemaCatalog.load(tmp_path / "nope")
