"""Rich tables of built views: the printed summary of ``fifolane views build`` and ``show``."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from rich.table import Table

from spark.job import BuildReport
from spark.output import read_view

__all__ = ["build_summary", "report_table", "view_table"]


def view_table(df: DataFrame, title: str, limit: int = 20) -> Table:
    """The first ``limit`` rows of ``df`` as a rich table (numbers right-aligned)."""
    table = Table(title=title, title_justify="left")
    numeric = {f.name for f in df.schema.fields if f.dataType.typeName() in
               ("integer", "long", "double", "float", "decimal", "short")}
    for name in df.columns:
        table.add_column(name, justify="right" if name in numeric else "left")
    for row in df.limit(limit).collect():
        table.add_row(*[
            "" if v is None else f"{v:,.2f}" if isinstance(v, float) else str(v) for v in row
        ])
    return table


def report_table(report: BuildReport) -> Table:
    """What was read: live entities per type and writer schema, and step timings."""
    table = Table(title=f"state topic {report.topic} (as of {report.as_of or 'now'})", title_justify="left")
    table.add_column("type")
    table.add_column("writer schema")
    table.add_column("live entities", justify="right")
    for type_name, writers in sorted(report.entities.items()):
        for writer, count in sorted(writers.items()):
            table.add_row(type_name, writer, f"{count:,}")
    table.caption = "seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report.seconds.items())
    return table


def build_summary(spark: SparkSession, out: Path, report: BuildReport, limit: int = 10) -> list[Table]:
    """The summary printed after a build, read back from the written Parquet."""
    per_state = read_view(spark, "reservations_per_state", out)
    seats = read_view(spark, "seats_per_flight", out).orderBy(F.desc("seats_sold"), "flight_number")
    revenue = read_view(spark, "revenue_per_route", out).orderBy(F.desc("revenue"))
    return [
        report_table(report),
        view_table(per_state, "reservations per state", limit),
        view_table(seats, f"seats per flight (top {limit} by seats sold)", limit),
        view_table(revenue, f"revenue per route and day (top {limit})", limit),
    ]
