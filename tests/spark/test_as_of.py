"""``--as-of``: views as they were at a time (offsets by timestamp), within the history window."""

from __future__ import annotations

import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kafka_fixtures import wait_until
from pyspark.sql import SparkSession
from state_writer import StateWriter, flight, reservation

from fifolane.cli.views import views
from fifolane.config import Settings
from fifolane.serde import SchemaCatalog
from spark.history import HistoryWindowError, history_window
from spark.job import build_views
from spark.output import read_view

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def test_as_of_sees_the_earlier_state_and_refuses_outside_the_window(
    spark: SparkSession, settings: Settings, topics: dict[str, Any], catalog: SchemaCatalog,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Real timestamps: a transaction's commit marker carries the commit time, so back-dated
    # records would not order against the markers the way a worker's records do.
    w = StateWriter(settings, catalog)
    with w.transaction():
        w.upsert("flight", flight("F1", "AMS", "LIS", date(2026, 12, 1), 10, 1))
        w.upsert("reservation", reservation("R1", "F1", 2, 200.0, "CONFIRMED", 1))
        w.upsert("reservation", reservation("R2", "F1", 3, 300.0, "NEW", 1))
    between = datetime.fromtimestamp(time.time(), tz=UTC)
    wait_until(lambda: time.time() > between.timestamp() + 0.005, message="the clock to move on")
    with w.transaction():
        w.delete("reservation", "R1", "F1", 2)
        w.upsert("reservation", reservation("R2", "F1", 3, 300.0, "CONFIRMED", 2))
        w.upsert("reservation", reservation("R3", "F1", 1, 100.0, "CONFIRMED", 1))
    w.close()
    now = datetime.fromtimestamp(time.time(), tz=UTC)

    def state_at(as_of: datetime | None, out: Path) -> set[tuple[str, str]]:
        build_views(spark, settings, catalog, out, as_of=as_of)
        return {(r["reservation_id"], r["state"]) for r in read_view(spark, "reservations", out).collect()}

    assert history_window(settings, settings.state_topic).lag_ms == 3_600_000  # the topic default
    assert state_at(between, tmp_path / "then") == {("R1", "CONFIRMED"), ("R2", "NEW")}
    sold_then = read_view(spark, "seats_per_flight", tmp_path / "then").collect()
    assert [(r["flight_number"], r["seats_sold"], r["seats_remaining"]) for r in sold_then] == [("F1", 2, 8)]
    assert state_at(now, tmp_path / "at-now") == {("R2", "CONFIRMED"), ("R3", "CONFIRMED")}

    too_old = now - timedelta(hours=2)
    with pytest.raises(HistoryWindowError, match="outside the history window .* min.compaction.lag.ms=3600000"):
        build_views(spark, settings, catalog, tmp_path / "old", as_of=too_old)
    # The CLI refuses before starting any Spark work, with the same clear message.
    monkeypatch.setenv("FIFOLANE_BOOTSTRAP_SERVERS", settings.resolved_bootstrap())
    monkeypatch.setenv("FIFOLANE_STATE_TOPIC", settings.state_topic)
    result = CliRunner().invoke(views, ["build", "--as-of", too_old.isoformat(), "--out", str(tmp_path / "cli")])
    assert isinstance(result.exception, HistoryWindowError)
    assert "pass --allow-compacted" in str(result.exception)
    assert not (tmp_path / "cli").exists()

    # With --allow-compacted it builds anyway (progress, a warning and the printed summary).
    result = CliRunner().invoke(views, ["build", "--as-of", str(_ms(too_old)), "--allow-compacted",
                                        "--out", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    assert "may be incomplete" in result.output
    assert "reservations per state" in result.output and "views written to" in result.output
    assert read_view(spark, "reservations", tmp_path / "cli").count() == 0  # nothing was written yet
    result = CliRunner().invoke(views, ["show", "reservations", "--out", str(tmp_path / "then")])
    assert result.exit_code == 0, result.output
    assert "R1" in result.output and "R3" not in result.output
