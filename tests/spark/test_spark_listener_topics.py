"""The listener-topic helper: latest projection per key, duplicates dropped, removed absent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from fifolane.config import Settings
from spark.listeners import PROJECTION_COLUMNS, latest_projections, read_listener_topic

pytestmark = pytest.mark.spark


def note(listener: str, kind: str, key: str, seq: int, value: dict[str, Any] | None,
         partition: int = 0, version: int = 1, type_: str = "reservation") -> str:
    return json.dumps({
        "listener": listener, "kind": kind, "key": key, "type": type_, "value": value,
        "table_change": {}, "partition": partition, "offset": seq, "version": version, "seq": seq,
        "ts": "2026-11-22T10:00:00Z",
    })


NOTES = [
    note("big", "created", "reservation/R1", 1, {"seats": 2}),
    note("big", "modified", "reservation/R1", 2, {"seats": 4}, version=2),
    note("big", "modified", "reservation/R1", 2, {"seats": 4}, version=2),  # duplicate after failover
    note("big", "created", "reservation/R2", 3, {"seats": 1}),
    note("big", "removed", "reservation/R2", 4, None, version=2),
    note("big", "created", "reservation/R3", 1_000_005, {"seats": 7}, partition=1),  # after a seq jump
    note("other", "created", "reservation/R1", 1, {"seats": 2}),
]


def test_latest_projections(spark: SparkSession) -> None:
    df = spark.createDataFrame([(n,) for n in NOTES], "value string")
    out = latest_projections(df, listener="big")
    assert tuple(out.columns) == PROJECTION_COLUMNS
    got = {(r["key"], json.loads(r["value"])["seats"], r["version"], r["seq"]) for r in out.collect()}
    assert got == {("reservation/R1", 4, 2, 2), ("reservation/R3", 7, 1, 1_000_005)}
    assert latest_projections(df).where("listener = 'other'").count() == 1


def test_latest_projections_keep_each_type_of_a_key(spark: SparkSession) -> None:
    """#12 item 9: an untyped listener over two types whose entities share a key value (the
    notification key carries no type) keeps the latest projection of each."""
    notes = [note("any", "created", "X1", 1, {"seats": 2}, version=3),
             note("any", "created", "X1", 1, {"capacity": 180}, partition=1, version=1, type_="flight"),
             note("any", "modified", "X1", 2, {"capacity": 200}, partition=1, version=2, type_="flight")]
    df = spark.createDataFrame([(n,) for n in notes], "value string")
    got = {(r["type"], r["key"], json.dumps(json.loads(r["value"])))
           for r in latest_projections(df, listener="any").collect()}
    assert got == {("reservation", "X1", '{"seats": 2}'), ("flight", "X1", '{"capacity": 200}')}


@pytest.mark.integration
def test_read_listener_topic(spark: SparkSession, settings: Settings, topics: dict[str, Any]) -> None:
    producer = Producer(settings.kafka_config())
    for i, n in enumerate(NOTES):
        key = json.loads(n)["key"]
        producer.produce(settings.listener_output_topic, key=key.encode(), value=n.encode(), partition=i % 3)
    producer.flush(30)
    out = read_listener_topic(spark, settings, listener="big")
    assert sorted(r["key"] for r in out.collect()) == ["reservation/R1", "reservation/R3"]
