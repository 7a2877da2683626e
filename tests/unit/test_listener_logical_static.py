"""The registration checker's types for Avro logical types match what workers hand CEL
(listeners.celvalues): date, time and uuid are strings, timestamps timestamps, decimals doubles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fifolane.errors import ExpressionError
from fifolane.serde.catalog import SchemaCatalog
from listeners.model import ListenerSpec
from listeners.validate import check_registration

BUNDLED = SchemaCatalog.load()

EVENT = {
    "type": "record", "name": "Event", "namespace": "t", "fifolane.type": "event",
    "fields": [
        {"name": "id", "type": "string", "fifolane.key": True},
        {"name": "grp", "type": "string", "fifolane.group": True},
        {"name": "version", "type": "long"},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "uid", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "odd", "type": {"type": "string", "logicalType": "date"}},
    ],
}  # fmt: skip


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> SchemaCatalog:
    d: Path = tmp_path_factory.mktemp("schemas")
    (d / "event.avsc").write_text(json.dumps(EVENT))
    return SchemaCatalog.load(d)


@pytest.mark.parametrize(
    "filter_",
    [
        'value.day >= "2026-01-01"',
        'timestamp(value.day + "T00:00:00Z") > timestamp("2026-01-01T00:00:00Z")',
        'value.at < "12:00:00" && value.uid.startsWith("1234")',
        "value.price > 1.5",
        'value.ts > timestamp("2026-01-01T00:00:00Z") && value.local < value.ts',
        "value.odd > 1",  # not a logical type fastavro knows there: dyn
        "value.day != null",
    ],
)
def test_valid_logical_type_filters_are_accepted(catalog: SchemaCatalog, filter_: str) -> None:
    check_registration(ListenerSpec(name="l", filter=filter_, type="event"), catalog)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"filter": 'value.day > timestamp("2026-01-01T00:00:00Z")'}, "'>' cannot compare value.day (a string) and timestamp("),
        ({"filter": "value.day > 3"}, "'>' cannot compare value.day (a string) and 3 (an int)"),
        ({"filter": 'value.price > "1.5"'}, "'>' cannot compare value.price (a double) and \"1.5\" (a string)"),
        ({"filter": 'value.ts > "2026-01-01"'}, "'>' cannot compare value.ts (a timestamp) and \"2026-01-01\" (a string)"),
        ({"filter": "value.uid + 1 == 2"}, "string"),
    ],
)
def test_clear_mismatches_are_refused(catalog: SchemaCatalog, spec: dict[str, Any], needle: str) -> None:
    with pytest.raises(ExpressionError) as info:
        check_registration(ListenerSpec(name="l", type="event", **spec), catalog)
    assert needle in str(info.value)


def test_the_bundled_flight_departure() -> None:
    ok = ListenerSpec(name="f", filter='value.departure >= "2026-12-01"', convert='{"dep": value.departure}',
                      type="flight")  # fmt: skip
    check_registration(ok, BUNDLED)
    with pytest.raises(ExpressionError, match=r"cannot compare value\.departure \(a string\) and timestamp"):
        check_registration(ListenerSpec(name="f", filter='value.departure > timestamp("2026-01-01T00:00:00Z")',
                                        type="flight"), BUNDLED)  # fmt: skip
