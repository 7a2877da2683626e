"""The views job: state topic -> decoded tables -> views -> Parquet, one call.

Used by ``fifolane views build`` and the benchmark; runs the same on ``local[*]`` and on a
cluster (the session decides). Steps are reported through ``step`` (a context-manager
factory, e.g. a rich status) so the caller shows progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from fifolane.config import Settings
from fifolane.serde.catalog import SchemaCatalog
from spark.decode import decode_entities, resolve_writers
from spark.history import ending_offsets_json, history_window, offsets_as_of
from spark.output import write_manifest, write_view
from spark.read import read_state
from spark.views import (
    build_current_reservations,
    build_reservations_per_state,
    build_revenue_per_route,
    build_seats_per_flight,
)
from spark.wire import BAD_HEADER

__all__ = ["VIEW_NAMES", "BuildReport", "build_views", "compute_views"]

#: The views a build writes, by name (``fifolane views show NAME``).
VIEW_NAMES = ("reservations", "seats_per_flight", "revenue_per_route", "reservations_per_state")
_TYPES = ("reservation", "flight")

Step = Callable[[str], AbstractContextManager[object]]


@contextmanager
def _quiet(_: str) -> Iterator[None]:
    yield


@dataclass
class BuildReport:
    """What a build read and wrote."""

    out: str
    topic: str
    built_at: str
    as_of: str | None
    ending_offsets: str
    #: live entities per type and writer id (``soe:<fingerprint>`` / ``cf:<id>``)
    entities: dict[str, dict[str, int]] = field(default_factory=dict)
    warning: str | None = None
    #: schema (JSON) of every written view, by name
    schemas: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def compute_views(reservations: DataFrame, flights: DataFrame) -> dict[str, DataFrame]:
    """Every view from the two decoded tables (no Kafka involved)."""
    return {
        "reservations": build_current_reservations(reservations),
        "seats_per_flight": build_seats_per_flight(reservations, flights),
        "revenue_per_route": build_revenue_per_route(reservations, flights),
        "reservations_per_state": build_reservations_per_state(reservations),
    }


def build_views(
    spark: SparkSession,
    settings: Settings,
    catalog: SchemaCatalog,
    out: Path,
    *,
    as_of: datetime | None = None,
    allow_compacted: bool = False,
    step: Step = _quiet,
) -> BuildReport:
    """Read the state topic (as of ``as_of`` if given), build every view, write it to ``out``.

    Raises :class:`spark.history.HistoryWindowError` when ``as_of`` is older than the
    topic's history window, unless ``allow_compacted`` (the report then carries a warning).
    """
    topic = settings.state_topic
    report = BuildReport(str(out), topic, datetime.now(tz=UTC).isoformat(),
                         as_of.isoformat() if as_of else None, "latest")
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        report.seconds[name] = round(now - clock, 3)
        clock = now

    if as_of is not None:
        with step(f"checking the history window of {topic}"):
            report.warning = history_window(settings, topic).check(as_of, allow_compacted=allow_compacted)
            report.ending_offsets = ending_offsets_json(topic, offsets_as_of(settings, topic, as_of))
        lap("offsets")

    with step(f"reading {topic} (committed, latest per key)"):
        state = read_state(spark, settings, ending_offsets=report.ending_offsets)
        state = state.persist(StorageLevel.MEMORY_AND_DISK)
        for row in state.groupBy("type", "writer").agg(F.count(F.lit(1)).alias("n")).collect():
            report.entities.setdefault(row["type"], {})[row["writer"] or BAD_HEADER] = row["n"]
    lap("read")

    cached: list[DataFrame] = [state]
    try:
        with step("decoding Avro (per writer schema)"):
            tables: dict[str, DataFrame] = {}
            for type_name in _TYPES:
                writers = resolve_writers(catalog, type_name, report.entities.get(type_name, {}),
                                          registry_url=settings.schema_registry_url)
                tables[type_name] = decode_entities(state, catalog, type_name, writers).persist(
                    StorageLevel.MEMORY_AND_DISK
                )
                cached.append(tables[type_name])
        views = compute_views(tables["reservation"], tables["flight"])
        for name in VIEW_NAMES:
            with step(f"writing view {name}"):
                report.schemas[name] = write_view(name, views[name], out)
            lap(name)
    finally:
        for df in cached:
            df.unpersist()
    write_manifest(out, asdict(report))
    return report
