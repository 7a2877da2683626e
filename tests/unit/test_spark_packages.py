"""One Spark version everywhere: pyspark, the connectors, the compose image; a mix is refused.

No JVM is started here: the check runs before Spark does.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pyspark
import pytest
import yaml
from click.testing import CliRunner

from fifolane.cli.views import views
from fifolane.config import PROJECT_ROOT
from spark.packages import (
    CONNECTORS,
    SPARK_VERSION,
    SparkVersionError,
    check_versions,
    connector_packages,
)


def test_connectors_are_pinned_to_the_spark_version() -> None:
    assert SPARK_VERSION == "4.1.1"
    assert connector_packages() == (
        "org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1",
        "org.apache.spark:spark-avro_2.13:4.1.1",
    )
    assert CONNECTORS == ("spark-sql-kafka-0-10_2.13", "spark-avro_2.13")


def test_the_pin_is_the_same_in_pyproject_compose_and_the_installed_pyspark() -> None:
    extras = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["spark"] == [f"pyspark=={SPARK_VERSION}"]
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    spark_images = {s["image"] for s in compose["services"].values()
                    if str(s.get("image", "")).startswith("apache/spark:")}
    assert spark_images == {f"apache/spark:{SPARK_VERSION}"}
    assert pyspark.__version__ == SPARK_VERSION  # what .venv has: ./dev installs the extra


def test_another_pyspark_is_refused_with_the_fix() -> None:
    check_versions(",".join(connector_packages()), installed="4.1.1")  # the pinned set passes
    with pytest.raises(SparkVersionError) as info:
        check_versions(installed="4.3.0")
    message = str(info.value)
    assert message.startswith("pyspark 4.3.0 is installed, but fifolane's Spark connectors")
    assert "pinned to Spark 4.1.1" in message
    assert "pip install 'pyspark==4.1.1'" in message


def test_connectors_of_another_version_are_refused() -> None:
    mixed = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0,org.apache.spark:spark-avro_2.13:4.1.1"
    with pytest.raises(SparkVersionError, match=re.escape(
        "spark.jars.packages asks for org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0, but pyspark "
        "is 4.1.1: Spark connectors only work with their own Spark version; "
        "use org.apache.spark:spark-sql-kafka-0-10_2.13:4.1.1"
    )):
        check_versions(mixed, installed="4.1.1")
    # Other groups' artifacts (say a JDBC driver) have their own versions.
    check_versions("org.postgresql:postgresql:42.7.4", installed="4.1.1")


def test_views_build_refuses_a_mismatched_pyspark_before_spark_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(pyspark, "__version__", "4.3.0")
    monkeypatch.setenv("FIFOLANE_BOOTSTRAP_SERVERS", "127.0.0.1:9")  # never reached
    monkeypatch.setenv("FIFOLANE_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(views, ["build", "--out", str(tmp_path / "views")])
    assert isinstance(result.exception, SparkVersionError)
    assert "pyspark 4.3.0 is installed" in str(result.exception)
    # Refused before anything ran: no ivy cache, no Spark log, no output.
    assert not (tmp_path / "home").exists() and not (tmp_path / "views").exists()
