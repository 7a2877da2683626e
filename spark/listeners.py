"""A listener's output topic as a table: the latest projection per key.

Notifications (docs/formats.md) are JSON objects with ``listener``, ``kind``
(``created``/``modified``/``removed``), ``key``, ``type``, ``value`` (the projection),
``partition`` (source partition), ``seq`` (per listener and source partition), ``version``
and ``ts``. Delivery is at-least-once: a notification may be repeated after a failover with
the same (partition, seq); duplicates are dropped, then the highest seq per key wins and a
``removed`` key is absent.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from fifolane.config import Settings
from spark.read import read_topic

__all__ = ["NOTIFICATION_SCHEMA", "PROJECTION_COLUMNS", "latest_projections", "read_listener_topic"]

#: The notification fields used here; ``value`` stays JSON text (its shape is the listener's).
NOTIFICATION_SCHEMA = StructType([
    StructField("listener", StringType()),
    StructField("kind", StringType()),
    StructField("key", StringType()),
    StructField("type", StringType()),
    StructField("value", StringType()),
    StructField("partition", LongType()),
    StructField("offset", LongType()),
    StructField("version", LongType()),
    StructField("seq", LongType()),
    StructField("ts", StringType()),
])
#: Columns of :func:`latest_projections`.
PROJECTION_COLUMNS = ("listener", "key", "type", "value", "version", "partition", "seq", "ts")


def latest_projections(notifications: DataFrame, listener: str | None = None) -> DataFrame:
    """The latest projection per (listener, key), duplicates dropped, removed keys absent.

    ``notifications`` has a string (or binary) column ``value`` holding the JSON, as read
    from Kafka; ``listener`` keeps one listener when the topic is shared.
    """
    parsed = notifications.select(
        F.from_json(F.col("value").cast("string"), NOTIFICATION_SCHEMA).alias("n")
    ).select("n.*")
    if listener is not None:
        parsed = parsed.where(F.col("listener") == F.lit(listener))
    unique = parsed.dropDuplicates(["listener", "partition", "seq"])
    latest = (
        unique.groupBy("listener", "key")
        .agg(F.max_by(F.struct(*[c for c in PROJECTION_COLUMNS if c not in ("listener", "key")], "kind"), "seq").alias("n"))
        .where(F.col("n.kind") != F.lit("removed"))
    )
    return latest.select("listener", "key", *[F.col(f"n.{c}").alias(c) for c in PROJECTION_COLUMNS[2:]])


def read_listener_topic(
    spark: SparkSession,
    settings: Settings,
    topic: str | None = None,
    *,
    listener: str | None = None,
) -> DataFrame:
    """Read a listener output topic (default: the settings' one) into :func:`latest_projections`."""
    raw = read_topic(spark, settings, topic or settings.listener_output_topic)
    return latest_projections(raw.select("value"), listener)
