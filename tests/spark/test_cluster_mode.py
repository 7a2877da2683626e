"""The views on a real Spark standalone cluster (a master and two workers, see standalone.py).

``fifolane views build --master spark://...`` runs as users run it: the CLI in its own
process, reading the state topic on the cluster's executors. Its views, latest and
``--as-of``, must equal the local-mode views and the plain-Python reference.
"""

from __future__ import annotations

import os
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cli_run import run_cli, run_cli_on_tty, strip_ansi
from dataset import Table, check_against_reference, view_rows, write_dataset
from kafka_fixtures import wait_until
from pyspark.sql import SparkSession
from standalone import StandaloneCluster
from state_writer import StateWriter

from fifolane.config import Settings, load_settings
from fifolane.serde import SchemaCatalog
from fifolane.serde.confluent import ConfluentCodec, RegistryClient
from fifolane.serde.fake_registry import FakeSchemaRegistry
from spark.job import build_views
from spark.packages import SPARK_VERSION

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.spark_cluster]

# What Spark's JVM prints on its own (ivy's resolution report, log4j lines): never in the
# CLI's output, always in the log file it names.
SPARK_NOISE = (":: resolving dependencies", "found org.apache.spark#", "Ivy Default Cache",
               ":: loading settings", " WARN ", " INFO ")


def _cli_env(settings: Settings, cluster: StandaloneCluster, conf_dir: Path) -> dict[str, str]:
    """The CLI's environment: this test's topics and registry, the project's ivy cache, and
    driver settings for a cluster on 127.0.0.1 in spark-defaults.conf (as a user would)."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(
        "spark.driver.host 127.0.0.1\n"
        "spark.driver.bindAddress 127.0.0.1\n"
        "spark.executor.memory 512m\n"
        "spark.executor.cores 1\n"
        "spark.cores.max 2\n"
        # Short jobs on a small shared machine: the quick JIT only, a small GC.
        "spark.driver.defaultJavaOptions -XX:TieredStopAtLevel=1 -XX:+UseSerialGC\n"
        "spark.executor.defaultJavaOptions -XX:TieredStopAtLevel=1 -XX:+UseSerialGC\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    env.update({
        "FIFOLANE_BOOTSTRAP_SERVERS": settings.resolved_bootstrap(),
        "FIFOLANE_STATE_TOPIC": settings.state_topic,
        "FIFOLANE_SCHEMA_REGISTRY_URL": str(settings.schema_registry_url),
        "FIFOLANE_HOME": str(load_settings().home),  # connectors downloaded once per machine
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    })
    return env


def _spark_log(output: str) -> Path:
    match = re.search(rf"Spark {re.escape(SPARK_VERSION)} on spark://\S+; Spark's log: (\S+\.log)", output)
    assert match, f"no Spark log line in:\n{output}"
    return Path(match.group(1))


def test_views_on_a_standalone_cluster_equal_local_mode_and_the_reference(
    spark: SparkSession, spark_cluster: StandaloneCluster, settings: Settings, topics: dict[str, Any],
    catalog: SchemaCatalog, tmp_path: Path,
) -> None:
    registry = FakeSchemaRegistry()
    with registry.serve() as url:
        settings = settings.with_overrides(schema_registry_url=url)
        w = StateWriter(settings, catalog)
        then: dict[str, Any] = {}

        def mark() -> None:
            # Real timestamps: the --as-of build must see exactly the first transaction.
            then["table"], now = dict(w.table), time.time()
            then["at"] = datetime.fromtimestamp(now, tz=UTC)
            wait_until(lambda: time.time() > now + 0.005, message="the clock to move on")

        write_dataset(w, ConfluentCodec(catalog, RegistryClient(url)), after_first=mark)
        w.close()
        table: Table = dict(w.table)
        as_of = then["at"].isoformat()

        # Local mode (the session's local[2]).
        build_views(spark, settings, catalog, tmp_path / "local-now")
        build_views(spark, settings, catalog, tmp_path / "local-then", as_of=then["at"])

        # The cluster: the real CLI, once with pipes and --master, once on a terminal with
        # FIFOLANE_SPARK_MASTER and --as-of.
        env = _cli_env(settings, spark_cluster, tmp_path / "spark-conf")
        plain = run_cli(["views", "build", "--master", spark_cluster.master_url,
                         "--out", str(tmp_path / "cluster-now")], env)
        assert plain.code == 0, plain.output
        tty = run_cli_on_tty(["views", "build", "--as-of", as_of, "--out", str(tmp_path / "cluster-then")],
                             {**env, "FIFOLANE_SPARK_MASTER": spark_cluster.master_url})
        screen = strip_ansi(tty.output)
        assert tty.code == 0, screen[-3000:]

    # Same views as local mode, and as the plain-Python reference.
    assert view_rows(spark, tmp_path / "cluster-now") == view_rows(spark, tmp_path / "local-now")
    assert view_rows(spark, tmp_path / "cluster-then") == view_rows(spark, tmp_path / "local-then")
    check_against_reference(spark, tmp_path / "cluster-now", table)
    check_against_reference(spark, tmp_path / "cluster-then", then["table"])
    assert view_rows(spark, tmp_path / "cluster-then") != view_rows(spark, tmp_path / "cluster-now")

    # Spark's own output went to the log file the CLI named, not to the CLI's output.
    for result in (plain.output, screen):
        log = _spark_log(result)
        logged = log.read_text(errors="replace")
        assert f"found org.apache.spark#spark-sql-kafka-0-10_2.13;{SPARK_VERSION}" in logged
        assert not [n for n in SPARK_NOISE if n in result], result
    assert "views written to" in plain.stdout and "reservations per state" in plain.stdout
    assert "stage" not in plain.output  # no progress drawn when not on a terminal

    # On a terminal: live stages with their tasks, then the totals of the whole build.
    assert re.search(r"stage \d+: \S+.*\d+/\d+ tasks, \d+ running", screen), screen[-3000:]
    totals = re.findall(r"spark: 2 executors · jobs (\d+)/(\d+) · (\d+) stages? · (\d+) tasks? done", screen)
    assert totals, screen[-3000:]
    jobs_done, jobs, stages, tasks = map(int, totals[-1])
    assert jobs_done == jobs > 0 and stages > 0 and tasks >= stages
    assert "views written to" in screen

    # Both applications ran on the cluster, with executors on both workers that fetched the
    # connector jars from the driver (the Kafka source runs on the executors).
    def finished() -> list[dict[str, Any]]:
        apps = [a for a in spark_cluster.state()["completedapps"] if a["name"] == "fifolane-views"]
        return apps if len(apps) >= 2 else []

    apps = wait_until(finished, timeout=60, message="both builds to finish on the master")
    assert all(a["state"] == "FINISHED" for a in apps), apps
    for app in apps:
        executor_dirs = [d for work in spark_cluster.work_dirs() for d in (work / app["id"]).glob("*")]
        assert {d.parents[2].name for d in executor_dirs} == {"worker-1", "worker-2"}, executor_dirs
        for d in executor_dirs:
            jars = {p.name for p in d.glob("*.jar")}
            assert f"org.apache.spark_spark-sql-kafka-0-10_2.13-{SPARK_VERSION}.jar" in jars, (d, jars)
            assert f"org.apache.spark_spark-avro_2.13-{SPARK_VERSION}.jar" in jars, (d, jars)
            assert any(j.startswith("org.apache.kafka_kafka-clients-") for j in jars), (d, jars)
