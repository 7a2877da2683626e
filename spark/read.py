"""Read a compacted topic in batch with Spark's Kafka source and keep the latest record per key.

Committed data only (``kafka.isolation.level=read_committed``): the state topic is written
transactionally, so it has offset gaps (control records) and aborted data that must stay
invisible. Compaction is lazy, so several versions of a key and tombstones are visible:
the highest offset per key wins, then tombstones are dropped.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from fifolane.config import Settings
from spark.wire import body_column, writer_column

__all__ = [
    "RAW_COLUMNS",
    "STATE_COLUMNS",
    "header",
    "kafka_options",
    "latest_per_key",
    "read_state",
    "read_topic",
]

log = logging.getLogger(__name__)

#: Columns of :func:`read_topic`.
RAW_COLUMNS = ("topic", "partition", "offset", "timestamp", "key", "value", "headers")
#: Columns of :func:`read_state`: one row per live entity.
STATE_COLUMNS = (
    "type", "entity_key", "key", "partition", "offset", "timestamp", "writer", "body",
)

# librdkafka keys that mean the same thing to the Java client Spark uses.
_SAME_IN_JAVA = ("bootstrap.servers", "security.protocol", "sasl.mechanism")
_JAAS_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def _jaas_quote(value: Any) -> str:
    """A JAAS option value in double quotes (backslash and quote escaped)."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def kafka_options(settings: Settings) -> dict[str, str]:
    """Spark Kafka source options (``kafka.*``) from the settings' librdkafka config.

    Security flows through: ``security.protocol`` and ``sasl.mechanism`` as they are, the SASL
    user and password as a JAAS login (PLAIN or SCRAM), and ``ssl.ca.location`` (a PEM file)
    as a PEM truststore, so Spark reads over TLS and SASL with the same settings as the
    other clients (docs/security.md). Consumer groups start with ``fifolane-views`` (what the
    spark role's ACLs allow). Other librdkafka-only keys have no Java equivalent: they are
    left out with a log line; pass Java client options through Spark conf if needed.
    """
    conf: dict[str, Any] = settings.kafka_config()
    options = {f"kafka.{k}": str(conf[k]) for k in _SAME_IN_JAVA if k in conf}
    options["groupIdPrefix"] = "fifolane-views"
    username, password = conf.get("sasl.username"), conf.get("sasl.password")
    if username is not None and password is not None:
        module = _JAAS_MODULES.get(str(conf.get("sasl.mechanism", "PLAIN")).upper(), _JAAS_MODULES["PLAIN"])
        options["kafka.sasl.jaas.config"] = (
            f"{module} required username={_jaas_quote(username)} password={_jaas_quote(password)};"
        )
    if conf.get("ssl.ca.location"):
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = str(conf["ssl.ca.location"])
    ignored = sorted(set(conf) - set(_SAME_IN_JAVA) - {"sasl.username", "sasl.password", "ssl.ca.location"})
    if ignored:
        log.info("not passed to Spark's Kafka source (librdkafka-only): %s", ", ".join(ignored))
    return options


def read_topic(
    spark: SparkSession, settings: Settings, topic: str, *, ending_offsets: str = "latest"
) -> DataFrame:
    """All committed records of ``topic`` from the earliest offset to ``ending_offsets``.

    ``ending_offsets`` is ``latest`` or Spark's JSON form ``{"topic": {"0": 42, ...}}``
    (exclusive end offsets, ``-1`` = latest), as computed by :mod:`spark.history`.
    """
    df = (
        spark.read.format("kafka")
        .options(**kafka_options(settings))
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", ending_offsets)
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
        # Bigger fetches than the Java client's 1 MB per partition: this is a bulk scan.
        .option("kafka.max.partition.fetch.bytes", str(8 * 1024 * 1024))
        .option("kafka.fetch.max.bytes", str(64 * 1024 * 1024))
        .load()
    )
    return df.select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        F.col("key").cast("string").alias("key"),
        "value",
        "headers",
    )


def header(headers: Column, name: str) -> Column:
    """The first header called ``name`` as a string (null when absent)."""
    found = F.filter(headers, lambda h: h["key"] == F.lit(name))
    return F.get(found, 0)["value"].cast("string")


def latest_per_key(raw: DataFrame, *, keep: tuple[str, ...] = ("timestamp", "value", "headers")) -> DataFrame:
    """The highest-offset record per (topic, partition, key), tombstones dropped.

    A key lives in one partition, so this is "latest per key". The tombstone must take
    part in the max (it deletes every earlier version) and only then be dropped. ``keep`` are
    the columns carried through the shuffle besides ``offset`` and ``value`` (fewer = faster).
    """
    carried = ["offset", "value", *[c for c in keep if c not in ("offset", "value")]]
    latest = (
        raw.groupBy("topic", "partition", "key")
        .agg(F.max_by(F.struct(*carried), "offset").alias("r"))
        .where(F.col("r.value").isNotNull())
    )
    return latest.select("topic", "partition", "key", *[F.col(f"r.{c}").alias(c) for c in carried])


def read_state(
    spark: SparkSession, settings: Settings, *, ending_offsets: str = "latest"
) -> DataFrame:
    """The live entities of the state topic: one row per key, header split from the body.

    ``type`` and ``entity_key`` come from the record key ``<type>/<entity key>``; ``writer``
    identifies the writer schema (:mod:`spark.wire`); ``body`` is the Avro binary body.
    """
    raw = read_topic(spark, settings, settings.state_topic, ending_offsets=ending_offsets)
    # Headers are not needed (an entity's group is a field of its value): not carried
    # through the shuffle.
    raw = raw.select(*RAW_COLUMNS[:-1])
    latest = latest_per_key(raw, keep=("timestamp", "value"))
    type_ = F.substring_index("key", "/", 1)
    return latest.select(
        type_.alias("type"),
        F.expr("substring(key, length(substring_index(key, '/', 1)) + 2)").alias("entity_key"),
        "key",
        "partition",
        "offset",
        "timestamp",
        writer_column(F.col("value")).alias("writer"),
        body_column(F.col("value")).alias("body"),
    )
