"""Starting Spark: where its output goes, and the clear errors when it cannot start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import run_cli
from pyspark.sql import SparkSession

from fifolane.cluster.ports import free_port
from spark.session import SparkStartError, get_session, session_log

pytestmark = pytest.mark.spark


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    return {**env, "FIFOLANE_HOME": str(home)}


def test_the_session_logs_to_a_file_under_the_home(spark: SparkSession) -> None:
    log = session_log(spark)
    assert log is not None and log.parent.name == "logs" and log.parent.parent.name == "spark"
    text = log.read_text(errors="replace")
    # The JVM's own output: the ivy report of the pinned connectors, Spark's log lines.
    assert "org.apache.spark#spark-sql-kafka-0-10_2.13;4.1.1" in text
    assert "Using Spark's default log4j profile" in text


def test_a_second_session_on_another_master_is_refused(spark: SparkSession) -> None:
    assert get_session("local[*]") is spark  # local[2] and local[*]: the same running session
    with pytest.raises(SparkStartError, match=r"a Spark session on local\[2\] already runs in this process; "
                                              r"Spark allows one per process: stop it before starting one on "
                                              r"spark://127.0.0.1:7077"):
        get_session("spark://127.0.0.1:7077")


def test_an_unreachable_master_is_refused_before_spark_starts(tmp_path: Path) -> None:
    port = free_port()
    result = run_cli(["views", "build", "--master", f"spark://127.0.0.1:{port}", "--out", str(tmp_path / "v")],
                     {**_env(tmp_path / "home"), "FIFOLANE_BOOTSTRAP_SERVERS": "127.0.0.1:9"}, timeout=120)
    assert result.code == 2, result.output
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: cannot reach the Spark master spark://127.0.0.1:{port}: nothing answers there; start the "
        f"cluster, or pass another --master (FIFOLANE_SPARK_MASTER)"
    )
    assert not (tmp_path / "home" / "spark" / "logs").exists()  # no JVM was started


def test_a_failed_start_names_the_log_and_quotes_its_end(tmp_path: Path) -> None:
    # A connector that does not exist: spark-submit's ivy fails and the JVM exits. Its output
    # is in the log only, so the error must carry the reason.
    code = ("from pathlib import Path; from spark.session import get_session; "
            f"get_session(home=Path({str(tmp_path / 'home')!r}), "
            "conf={'spark.jars.packages': 'org.example.fifolane:no-such-artifact:1.0'})")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path / "home"), capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 1
    assert "spark.session.SparkStartError: Spark did not start on local[*]" in proc.stderr
    (log,) = (tmp_path / "home" / "spark" / "logs").glob("fifolane-views-*.log")
    reason = "unresolved dependency: org.example.fifolane#no-such-artifact;1.0: not found"
    assert reason in log.read_text()
    # The error quotes the log's end (the JVM itself printed nothing to our stdout/stderr).
    before, marker, quoted = proc.stderr.partition(f"the end of its log {log}:")
    assert marker and reason in quoted
    assert reason not in before and reason not in proc.stdout
