"""The small state-topic dataset of the end-to-end view tests, and the checks of its views.

It covers every decoding path: single-object records in the current schema and in the
history schema v1, Confluent-framed records (registry ids), new versions, a tombstone and a
re-creation, an aborted transaction, a reservation of an unknown flight.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from reference import per_state, revenue_per_route, seats_per_flight
from state_writer import StateWriter, flight, reservation

from fifolane.serde.codec import Codec
from schemas import SCHEMAS_DIR
from spark.job import VIEW_NAMES
from spark.output import read_view
from spark.views import RESERVATION_COLUMNS

__all__ = ["Table", "check_against_reference", "rows_of", "view_rows", "write_dataset"]

V1 = json.loads((SCHEMAS_DIR / "history" / "reservation.v1.avsc").read_text())
D1, D2, D3 = date(2026, 12, 1), date(2026, 12, 2), date(2026, 12, 3)
#: committed state: (type, key) -> record, as StateWriter.table
Table = dict[tuple[str, str], dict[str, Any]]


def _v1(record: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "customer_id"}


def write_dataset(w: StateWriter, confluent: Codec, after_first: Callable[[], object] = lambda: None) -> None:
    """Four transactions (one aborted); ``after_first`` runs after the first commit."""
    with w.transaction():
        w.upsert("flight", flight("F1", "AMS", "LIS", D1, 10, 1))
        w.upsert("flight", flight("F2", "LIS", "AMS", D2, 6, 1))
        w.upsert("flight", flight("F3", "AMS", "LIS", D1, 4, 1))
        w.upsert("flight", flight("F4", "AMS", "OPO", D3, 5, 1))
        w.upsert("reservation", reservation("R1", "F1", 2, 200.0, "NEW", 1))
        w.upsert("reservation", reservation("R2", "F1", 1, 110.5, "CONFIRMED", 1))
        w.upsert("reservation", reservation("R3", "F2", 3, 330.0, "NEW", 1))
        w.upsert("reservation", reservation("R4", "F2", 2, 210.0, "CONFIRMED", 1))
        w.upsert("reservation", reservation("R5", "F3", 1, 99.0, "CONFIRMED", 1))
        w.upsert("reservation", _v1(reservation("R6", "F1", 4, 380.0, "CONFIRMED", 1)), writer_schema=V1)
    after_first()
    with w.transaction():  # new versions, a tombstone, an unknown flight, another v1 record
        w.upsert("reservation", reservation("R1", "F1", 2, 200.0, "CONFIRMED", 2))
        w.upsert("reservation", reservation("R3", "F2", 3, 330.0, "REJECTED", 2))
        w.upsert("flight", flight("F1", "AMS", "LIS", D1, 12, 2))
        w.delete("reservation", "R4", "F2", 2)
        w.upsert("reservation", reservation("R7", "F9", 5, 500.0, "CONFIRMED", 1))
        w.upsert("reservation", _v1(reservation("R8", "F4", 1, 75.25, "NEW", 1)), writer_schema=V1)
    with w.transaction(abort=True):  # none of this may show
        w.upsert("reservation", reservation("R2", "F1", 1, 110.5, "CANCELLED", 3))
        w.upsert("reservation", reservation("R9", "F1", 3, 999.0, "CONFIRMED", 1))
        w.delete("reservation", "R5", "F3", 2)
        w.upsert("flight", flight("F2", "LIS", "AMS", D2, 100, 2))
    with w.transaction():  # re-created after its tombstone; Confluent-framed records too
        w.upsert("reservation", reservation("R4", "F2", 2, 210.0, "CANCELLED", 5))
        w.upsert("reservation", reservation("R5", "F3", 2, 198.0, "CONFIRMED", 2))
        w.upsert("reservation", reservation("R10", "F2", 2, 150.0, "CONFIRMED", 1), codec=confluent)
        w.upsert("flight", flight("F5", "OPO", "AMS", D3, 3, 1), codec=confluent)


def rows_of(table: Table, type_name: str) -> list[dict[str, Any]]:
    """The records of one type in a committed-state snapshot."""
    return [r for (t, _), r in table.items() if t == type_name]


def _rounded(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in rows]


def view_rows(spark: SparkSession, out: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every view of a build, as sorted rows (floats rounded): for comparing two builds."""
    return {name: sorted(_rounded([tuple(r) for r in read_view(spark, name, out).collect()]), key=repr)
            for name in VIEW_NAMES}


def check_against_reference(spark: SparkSession, out: Path, table: Table) -> None:
    """The views under ``out`` equal the plain-Python views of ``table``."""
    reservations, flights = rows_of(table, "reservation"), rows_of(table, "flight")
    view = {name: read_view(spark, name, out) for name in VIEW_NAMES}
    got_r = {tuple(r[c] for c in RESERVATION_COLUMNS) for r in view["reservations"].collect()}
    assert got_r == {tuple(r[c] for c in RESERVATION_COLUMNS) for r in reservations}
    assert {tuple(r) for r in view["seats_per_flight"].collect()} == seats_per_flight(reservations, flights)
    assert set(_rounded([tuple(r) for r in view["revenue_per_route"].collect()])) == revenue_per_route(
        reservations, flights
    )
    assert _rounded([tuple(r) for r in view["reservations_per_state"].collect()]) == per_state(reservations)
