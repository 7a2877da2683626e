"""One SparkSession for the whole Spark suite (JVM start and connector resolution are slow).

The session is never skipped: if Spark or the connector download fails, every test using
it errors (CI must not pass without running them).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from standalone import StandaloneCluster, start_standalone

from fifolane.config import load_settings
from fifolane.serde.catalog import SchemaCatalog
from spark.session import get_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """``local[2]`` with the Kafka and Avro connectors; the ivy cache of the project home
    (not the per-test home) so connectors download once per machine."""
    session = get_session("local[2]", "fifolane-tests", home=load_settings().home)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def catalog() -> SchemaCatalog:
    """The bundled schemas (current and history)."""
    return SchemaCatalog.load()


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """A Spark standalone cluster on 127.0.0.1: a master and two workers (1 core, 1 GiB
    each), started once per session from pyspark's own launcher and stopped at the end."""
    cluster = start_standalone(tmp_path_factory.mktemp("spark-cluster"), workers=2)
    try:
        yield cluster
    finally:
        cluster.stop()
