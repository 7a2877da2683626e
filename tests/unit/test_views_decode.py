"""Writer-schema resolution for the Spark decode (no JVM: only the catalog is involved)."""

from __future__ import annotations

import pytest

from fifolane.errors import SerializationError, UnknownSchemaError
from fifolane.serde import SchemaCatalog
from spark.decode import resolve_writers, schema_json
from spark.wire import BAD_HEADER, soe_writer


@pytest.fixture(scope="module")
def catalog() -> SchemaCatalog:
    return SchemaCatalog.load()


def test_current_and_history_fingerprints_resolve(catalog: SchemaCatalog) -> None:
    entity = catalog.entity("reservation")
    old = next(fp for fp, w in catalog.writers.items() if w.entity is entity and w.reader is not None)
    found = resolve_writers(catalog, "reservation", [soe_writer(entity.fingerprint), soe_writer(old)])
    assert found[soe_writer(entity.fingerprint)].reader is None  # current: no resolution
    assert found[soe_writer(old)].reader is not None  # v1: resolved into the current schema


def test_unknown_fingerprint_and_other_types_are_refused(catalog: SchemaCatalog) -> None:
    with pytest.raises(UnknownSchemaError, match="no reservation writer schema for soe:0000000000000001"):
        resolve_writers(catalog, "reservation", ["soe:0000000000000001"])
    flight = catalog.entity("flight")
    with pytest.raises(UnknownSchemaError, match="no reservation writer schema"):
        resolve_writers(catalog, "reservation", [soe_writer(flight.fingerprint)])


def test_bad_header_and_missing_registry_are_explained(catalog: SchemaCatalog) -> None:
    with pytest.raises(SerializationError, match="neither C3 01"):
        resolve_writers(catalog, "reservation", [BAD_HEADER])
    with pytest.raises(UnknownSchemaError, match="FIFOLANE_SCHEMA_REGISTRY_URL is not set"):
        resolve_writers(catalog, "reservation", ["cf:3"])


def test_schema_json_drops_fastavro_internals(catalog: SchemaCatalog) -> None:
    text = schema_json(catalog.entity("flight").schema)
    assert "__fastavro" not in text and "__named_schemas" not in text and '"logicalType": "date"' in text
