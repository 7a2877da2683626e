"""The one Spark version fifolane runs, and the Maven artifacts of its connectors.

Spark's Kafka source (``spark-sql-kafka-0-10``) and Avro functions (``spark-avro``) are not
in pyspark's wheel: they come from Maven Central through ``spark.jars.packages``. Spark
supports a connector only at its own version, so fifolane pins one version for all three:
``SPARK_VERSION`` is the newest release for which pyspark (PyPI) and both connectors
(Maven Central, Scala 2.13) exist at the same number. On 2026-11-23 that is 4.1.1:
Central has ``spark-sql-kafka-0-10_2.13`` up to 4.2.0 but ``spark-avro_2.13`` only up to
4.1.1 (4.1.2, 4.1.3 and 4.2.0 are missing there), while PyPI has pyspark up to 4.3.0.

The pin is kept in three places that must agree (``tests/unit/test_spark_packages.py``
checks them): this module, the ``spark`` extra in ``pyproject.toml`` (``pyspark==``) and the
``apache/spark`` image tag in ``docker-compose.yml``. :func:`check_versions` refuses to
start Spark with another pyspark, or with connectors of another version, because the
mix fails later with class or method errors that name neither.
"""

from __future__ import annotations

import pyspark

from fifolane.errors import ConfigError

__all__ = [
    "CONNECTORS",
    "SCALA_VERSION",
    "SPARK_VERSION",
    "SparkVersionError",
    "check_versions",
    "connector_packages",
]

#: The Spark release of pyspark, the connectors and the docker-compose Spark image.
SPARK_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
#: artifact ids (group ``org.apache.spark``) of the connectors the views need
CONNECTORS: tuple[str, ...] = (f"spark-sql-kafka-0-10_{SCALA_VERSION}", f"spark-avro_{SCALA_VERSION}")
_SPARK_GROUP = "org.apache.spark"


class SparkVersionError(ConfigError):
    """The installed pyspark, or a requested connector, is not the pinned Spark version."""


def connector_packages() -> tuple[str, ...]:
    """Maven coordinates (``group:artifact:version``) for ``spark.jars.packages``."""
    return tuple(f"{_SPARK_GROUP}:{artifact}:{SPARK_VERSION}" for artifact in CONNECTORS)


def check_versions(packages: str | None = None, *, installed: str | None = None) -> None:
    """Refuse a Spark set that no Spark release supports, before any JVM starts.

    ``installed`` is the pyspark version (default: the imported one); ``packages`` the
    ``spark.jars.packages`` value about to be used: every ``org.apache.spark`` artifact in
    it must carry the installed pyspark's version.
    """
    installed = installed or pyspark.__version__
    if installed != SPARK_VERSION:
        raise SparkVersionError(
            f"pyspark {installed} is installed, but fifolane's Spark connectors "
            f"({', '.join(CONNECTORS)}) are pinned to Spark {SPARK_VERSION}, the newest release "
            f"that has both on Maven Central; a mixed set is not supported by any Spark "
            f"release. Install the pinned version: pip install 'pyspark=={SPARK_VERSION}' "
            f"(or pip install -e '.[spark]')"
        )
    for coordinate in filter(None, (p.strip() for p in (packages or "").split(","))):
        parts = coordinate.split(":")
        if len(parts) >= 3 and parts[0] == _SPARK_GROUP and parts[-1] != installed:
            raise SparkVersionError(
                f"spark.jars.packages asks for {coordinate}, but pyspark is {installed}: "
                f"Spark connectors only work with their own Spark version; "
                f"use {_SPARK_GROUP}:{parts[1]}:{installed}"
            )
