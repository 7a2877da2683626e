"""Each ``build_*`` on small in-memory tables, with exact expected rows."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from spark.views import (
    build_current_reservations,
    build_reservations_per_state,
    build_revenue_per_route,
    build_seats_per_flight,
)

pytestmark = pytest.mark.spark

RESERVATION_DDL = (
    "reservation_id string, flight_number string, customer_id string, seats int, amount double, "
    "state string, version long"
)
FLIGHT_DDL = (
    "flight_number string, origin string, destination string, departure date, capacity int, version long"
)


@pytest.fixture(scope="module")
def reservations(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [
            ("R1", "FL1", "C1", 2, 200.0, "CONFIRMED", 3),
            ("R2", "FL1", "C2", 1, 120.0, "CONFIRMED", 4),
            ("R3", "FL1", "C3", 4, 400.0, "NEW", 1),
            ("R4", "FL2", "C1", 3, 330.0, "CONFIRMED", 2),
            ("R5", "FL2", "C4", 1, 90.0, "CANCELLED", 5),
            ("R6", "FL3", "C5", 2, 150.0, "CONFIRMED", 1),  # same route and day as FL1
            ("R7", "FL9", "C6", 5, 500.0, "CONFIRMED", 1),  # flight not in the flight table
        ],
        RESERVATION_DDL,
    )


@pytest.fixture(scope="module")
def flights(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [
            ("FL1", "AMS", "LIS", date(2026, 12, 1), 10, 1),
            ("FL2", "LIS", "AMS", date(2026, 12, 2), 5, 1),
            ("FL3", "AMS", "LIS", date(2026, 12, 1), 8, 2),
            ("FL4", "AMS", "OPO", date(2026, 12, 3), 6, 1),  # nothing sold
        ],
        FLIGHT_DDL,
    )


def rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def test_current_reservations_is_the_table(reservations: DataFrame) -> None:
    out = build_current_reservations(reservations)
    assert out.columns == [
        "reservation_id", "flight_number", "customer_id", "seats", "amount", "state", "version",
    ]
    assert rows(out) == rows(reservations)


def test_seats_per_flight(reservations: DataFrame, flights: DataFrame) -> None:
    out = build_seats_per_flight(reservations, flights)
    assert out.columns == [
        "flight_number", "origin", "destination", "departure", "capacity",
        "confirmed_reservations", "seats_sold", "seats_remaining",
    ]
    assert rows(out) == rows(out.sparkSession.createDataFrame([
        ("FL1", "AMS", "LIS", date(2026, 12, 1), 10, 2, 3, 7),
        ("FL2", "LIS", "AMS", date(2026, 12, 2), 5, 1, 3, 2),
        ("FL3", "AMS", "LIS", date(2026, 12, 1), 8, 1, 2, 6),
        ("FL4", "AMS", "OPO", date(2026, 12, 3), 6, 0, 0, 6),
        ("FL9", None, None, None, None, 1, 5, None),
    ], out.schema))


def test_revenue_per_route(reservations: DataFrame, flights: DataFrame) -> None:
    out = build_revenue_per_route(reservations, flights)
    assert out.columns == [
        "origin", "destination", "departure", "flights", "confirmed_reservations", "seats", "revenue",
    ]
    assert rows(out) == [
        ("AMS", "LIS", date(2026, 12, 1), 2, 3, 5, 470.0),
        ("LIS", "AMS", date(2026, 12, 2), 1, 1, 3, 330.0),
    ]


def test_reservations_per_state_lists_every_state_in_enum_order(reservations: DataFrame) -> None:
    out = build_reservations_per_state(reservations)
    assert out.columns == ["state", "reservations", "seats", "amount"]
    assert [tuple(r) for r in out.collect()] == [
        ("NEW", 1, 4, 400.0),
        ("CONFIRMED", 5, 13, 1300.0),
        ("REJECTED", 0, 0, 0.0),
        ("CANCELLED", 1, 1, 90.0),
    ]


def test_views_of_empty_tables(spark: SparkSession) -> None:
    empty_r = spark.createDataFrame([], RESERVATION_DDL)
    empty_f = spark.createDataFrame([], FLIGHT_DDL)
    assert build_seats_per_flight(empty_r, empty_f).count() == 0
    assert build_revenue_per_route(empty_r, empty_f).count() == 0
    assert [r["reservations"] for r in build_reservations_per_state(empty_r).collect()] == [0, 0, 0, 0]
