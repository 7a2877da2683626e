"""Unit tests of the views CLI and its Spark-free helpers (no Kafka, no JVM)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import click
import pytest
from click.testing import CliRunner

from fifolane.cli.views import parse_as_of, views
from spark.history import HistoryWindow, HistoryWindowError, ending_offsets_json
from spark.wire import confluent_writer, soe_writer


def test_parse_as_of_accepts_iso_and_epoch_millis() -> None:
    assert parse_as_of("2026-11-22T10:00:00") == datetime(2026, 11, 22, 10, tzinfo=UTC)
    assert parse_as_of("2026-11-22T11:00:00+01:00") == datetime(2026, 11, 22, 10, tzinfo=UTC)
    assert parse_as_of("1795341600000") == datetime(2026, 11, 22, 10, tzinfo=UTC)
    with pytest.raises(click.BadParameter, match="ISO-8601"):
        parse_as_of("yesterday")


def test_view_names_match_the_job() -> None:
    from fifolane.cli import views as cli_module
    from spark.job import VIEW_NAMES

    assert cli_module._VIEW_NAMES == VIEW_NAMES


def test_history_window_refuses_then_warns() -> None:
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)
    window = HistoryWindow("fifolane.state", 3_600_000, now)
    assert window.oldest == now - timedelta(hours=1)
    assert window.check(now - timedelta(minutes=59)) is None
    with pytest.raises(HistoryWindowError, match="outside the history window of topic fifolane.state"):
        window.check(now - timedelta(minutes=61))
    warning = window.check(now - timedelta(minutes=61), allow_compacted=True)
    assert warning is not None and "may be incomplete" in warning


def test_zero_lag_window_only_covers_now() -> None:
    now = datetime(2026, 11, 22, 12, tzinfo=UTC)
    assert not HistoryWindow("t", 0, now).contains(now - timedelta(seconds=1))


def test_ending_offsets_json() -> None:
    assert ending_offsets_json("s", {1: 5, 0: -1}) == '{"s": {"0": -1, "1": 5}}'


def test_writer_ids() -> None:
    assert soe_writer(0x2FD6744664746DEB) == "soe:EB6D74644674D62F"  # little-endian on the wire
    assert confluent_writer(258) == "cf:258"


def test_build_refuses_a_bad_as_of_before_anything_runs() -> None:
    result = CliRunner().invoke(views, ["build", "--as-of", "soon"])
    assert result.exit_code == 2 and "ISO-8601" in result.output
