"""The live progress of a build: running stages with their tasks, totals; quiet off a terminal."""

from __future__ import annotations

import io
import re

import pytest
from cli_run import strip_ansi
from pyspark.sql import SparkSession
from rich.console import Console

from spark.progress import SparkProgress

pytestmark = pytest.mark.spark


def _slow_job(spark: SparkSession) -> None:
    # Four tasks that each sleep 0.4 s in the JVM (no Python worker): one stage that is
    # surely still running when the progress thread polls.
    rows = spark.range(0, 4, 1, 4).selectExpr("reflect('java.lang.Thread', 'sleep', 400L) AS r").collect()
    assert len(rows) == 4


def test_progress_draws_running_stages_and_the_totals(spark: SparkSession) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=140)
    with SparkProgress(spark.sparkContext, console, interval=0.05) as progress, progress.step("sleeping"):
        _slow_job(spark)
    screen = strip_ansi(buffer.getvalue())
    assert re.search(r"stage \d+: collect +━+ *\d/4 tasks, \d running", screen), screen
    assert "sleeping" in screen
    # The last frame: the step is done, the totals of exactly this one job.
    last_frame = screen.splitlines()[-2:]
    assert re.search(r"\bdone +━+ +\d:\d\d:\d\d$", last_frame[0]), last_frame
    assert "spark: local · jobs 1/1 · 1 stage · 4 tasks done" in last_frame[1], last_frame
    assert progress.last is not None
    assert (progress.last.jobs, progress.last.jobs_done, progress.last.stages_done,
            progress.last.tasks_done, progress.last.active) == (1, 1, 1, 4, [])


def test_progress_is_quiet_when_not_a_terminal(spark: SparkSession) -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False)
    with SparkProgress(spark.sparkContext, console) as progress, progress.step("sleeping"):
        _slow_job(spark)
    assert buffer.getvalue() == ""
    assert progress.last is None  # nothing polled either
