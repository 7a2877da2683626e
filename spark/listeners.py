"""A listener's output topic as a table: the latest projection per key.

Notifications (docs/formats.md) are JSON objects with ``listener``, ``registration``,
``kind`` (``created``/``modified``/``removed``), ``key``, ``type``, ``value`` (the
projection), ``partition`` (source partition), ``seq`` (per listener registration and source
partition), ``version``, ``ts`` and, for an entity that moved to another group, ``moved_to``.
Delivery is at-least-once: a notification may be repeated after a failover with the same
(partition, seq); duplicates are dropped. Only the latest registration of a listener counts
(a new registration is a new stream). Then, per (listener, type, key), the notification with
the highest version wins (an entity that changed group is removed in its old partition with
the version that moved it, and created in the new one with the same version: the live one
wins that tie; within a partition, the higher seq), and a ``removed`` key is absent.
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
    StructField("registration", StringType()),
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
    """The latest projection per (listener, type, key), duplicates dropped, removed keys
    absent (see the module docstring for which notification is the latest).

    ``notifications`` has a string (or binary) column ``value`` holding the JSON, as read
    from Kafka; ``listener`` keeps one listener when the topic is shared.
    """
    parsed = notifications.select(
        F.from_json(F.col("value").cast("string"), NOTIFICATION_SCHEMA).alias("n")
    ).select("n.*")
    if listener is not None:
        parsed = parsed.where(F.col("listener") == F.lit(listener))
    unique = parsed.dropDuplicates(["listener", "partition", "seq"])
    # Only the latest registration of each listener (older ones are other streams).
    current = unique.groupBy("listener").agg(F.max("registration").alias("current"))
    unique = unique.join(current, on="listener", how="inner").where(
        F.col("registration").eqNullSafe(F.col("current")))
    carried = [c for c in PROJECTION_COLUMNS if c not in ("listener", "key", "type")]
    order = F.struct(F.col("version"), (F.col("kind") != F.lit("removed")).alias("live"), F.col("seq"))
    latest = (
        unique.groupBy("listener", "type", "key")
        .agg(F.max_by(F.struct(*carried, "kind"), order).alias("n"))
        .where(F.col("n.kind") != F.lit("removed"))
    )
    return latest.select("listener", "key", "type", *[F.col(f"n.{c}").alias(c) for c in carried])


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
