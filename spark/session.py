"""The one SparkSession factory for fifolane's batch views.

Spark's Kafka source and Avro functions are not in pyspark's wheel: they are resolved from
Maven Central through ``spark.jars.packages`` (see :mod:`spark.packages`) into an ivy cache
under ``<settings.home>/spark/ivy`` (git-ignored), so they are downloaded once.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from spark.packages import connector_packages

__all__ = ["get_session", "ivy_dir", "spark_home"]

# Small-machine defaults (2 cores, a few GB): few shuffle partitions, no UI, UTC everywhere
# so Avro dates and Kafka timestamps read the same on every machine.
_DEFAULTS: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "2g",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    # Every Spark distribution ships its own Hadoop client: do not add a second copy.
    "spark.jars.excludes": (
        "org.apache.hadoop:hadoop-client-runtime,org.apache.hadoop:hadoop-client-api"
    ),
}


def spark_home(home: Path | None = None) -> Path:
    """``<settings.home>/spark``: ivy cache, package choice (never committed)."""
    if home is None:
        from fifolane.config import load_settings

        home = load_settings().home
    return Path(home) / "spark"


def ivy_dir(home: Path | None = None) -> Path:
    """The ivy cache used for connector jars: ``<settings.home>/spark/ivy``."""
    return spark_home(home) / "ivy"


def get_session(
    master: str = "local[*]",
    app_name: str = "fifolane-views",
    *,
    home: Path | None = None,
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """Get (or create) the SparkSession with the Kafka and Avro connectors on the classpath.

    ``master`` is any Spark master URL (``local[*]``, ``spark://host:7077``, ``yarn``...);
    ``conf`` overrides the small-machine defaults (including ``spark.jars.packages``).
    If the connectors cannot be resolved the Spark error propagates: callers and tests
    fail rather than skip. An already running session is returned as is (Spark allows
    one SparkContext per process).
    """
    ivy = ivy_dir(home)
    ivy.mkdir(parents=True, exist_ok=True)
    settings = {
        **_DEFAULTS,
        "spark.jars.ivy": str(ivy),
        **(conf or {}),
    }
    if "spark.jars.packages" not in settings:
        settings["spark.jars.packages"] = ",".join(connector_packages(ivy.parent.parent))
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
