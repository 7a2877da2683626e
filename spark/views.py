"""The views: plain functions from decoded tables to DataFrames (testable without Kafka).

Inputs are the current tables as decoded from the state topic (columns of the current
``reservation`` and ``flight`` schemas); each function states its output schema with a final
``select``. Only built-in functions: no Python UDFs.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

__all__ = [
    "FLIGHT_COLUMNS",
    "RESERVATION_COLUMNS",
    "RESERVATION_STATES",
    "build_current_reservations",
    "build_reservations_per_state",
    "build_revenue_per_route",
    "build_seats_per_flight",
]

RESERVATION_COLUMNS = (
    "reservation_id", "flight_number", "customer_id", "seats", "amount", "state", "version",
)
FLIGHT_COLUMNS = ("flight_number", "origin", "destination", "departure", "capacity", "version")
#: Symbols of the ``ReservationState`` enum, in declaration order.
RESERVATION_STATES = ("NEW", "CONFIRMED", "REJECTED", "CANCELLED", "TICKETED")
_CONFIRMED = "CONFIRMED"


def build_current_reservations(reservations: DataFrame) -> DataFrame:
    """The reservation table itself: one row per live reservation."""
    return reservations.select(*RESERVATION_COLUMNS)


def _confirmed(reservations: DataFrame) -> DataFrame:
    return reservations.select("flight_number", "seats", "amount", "state").where(
        F.col("state") == F.lit(_CONFIRMED)
    )


def build_seats_per_flight(reservations: DataFrame, flights: DataFrame) -> DataFrame:
    """Seats sold (sum of ``seats`` of CONFIRMED reservations) and remaining per flight.

    A full outer join: flights without sales show 0 sold; sales on a flight missing from the
    flight table still show (capacity and remaining null) rather than vanish.
    Columns: flight_number, origin, destination, departure, capacity, confirmed_reservations,
    seats_sold, seats_remaining.
    """
    sold = (
        _confirmed(reservations)
        .groupBy("flight_number")
        .agg(
            F.count(F.lit(1)).alias("confirmed_reservations"),
            F.sum("seats").cast("long").alias("seats_sold"),
        )
    )
    flights = flights.select("flight_number", "origin", "destination", "departure", "capacity")
    joined = flights.join(sold, on="flight_number", how="full")
    seats_sold = F.coalesce(F.col("seats_sold"), F.lit(0).cast("long"))
    return joined.select(
        "flight_number",
        "origin",
        "destination",
        "departure",
        "capacity",
        F.coalesce(F.col("confirmed_reservations"), F.lit(0).cast("long")).alias(
            "confirmed_reservations"
        ),
        seats_sold.alias("seats_sold"),
        (F.col("capacity").cast("long") - seats_sold).alias("seats_remaining"),
    )


def build_revenue_per_route(reservations: DataFrame, flights: DataFrame) -> DataFrame:
    """Revenue (sum of ``amount`` of CONFIRMED reservations) per route and departure day.

    An inner join: a reservation whose flight is unknown has no route.
    Columns: origin, destination, departure, flights, confirmed_reservations, seats, revenue.
    """
    flights = flights.select("flight_number", "origin", "destination", "departure")
    joined = _confirmed(reservations).join(flights, on="flight_number", how="inner")
    revenue = joined.groupBy("origin", "destination", "departure").agg(
        F.countDistinct("flight_number").alias("flights"),
        F.count(F.lit(1)).alias("confirmed_reservations"),
        F.sum("seats").cast("long").alias("seats"),
        F.sum("amount").alias("revenue"),
    )
    return revenue.select(
        "origin", "destination", "departure", "flights", "confirmed_reservations", "seats", "revenue"
    )


def build_reservations_per_state(
    reservations: DataFrame, states: Sequence[str] = RESERVATION_STATES
) -> DataFrame:
    """Reservations, seats and amount per processing state; every state listed, even at 0.

    Columns: state, reservations, seats, amount.
    """
    spark = reservations.sparkSession
    all_states = spark.createDataFrame([(s, i) for i, s in enumerate(states)], "state string, ord int")
    counts = reservations.groupBy("state").agg(
        F.count(F.lit(1)).alias("reservations"),
        F.sum("seats").cast("long").alias("seats"),
        F.sum("amount").alias("amount"),
    )
    # A state outside the enum (newer schema) still shows, after the known ones.
    joined = all_states.join(counts, on="state", how="full")
    return joined.orderBy(F.coalesce("ord", F.lit(len(states))), "state").select(
        "state",
        F.coalesce("reservations", F.lit(0).cast("long")).alias("reservations"),
        F.coalesce("seats", F.lit(0).cast("long")).alias("seats"),
        F.coalesce("amount", F.lit(0.0)).alias("amount"),
    )
