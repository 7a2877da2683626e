"""The local Apache Kafka and the topic roles, against a real broker."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from kafka_fixtures import SHARED_LIBS, consume_all, wait_until

from fifolane.cluster import LocalCluster
from fifolane.config import Settings
from fifolane.errors import ClusterError, TopicConfigError
from fifolane.topics import create_topic, describe_topics, ensure_topics

pytestmark = pytest.mark.integration


def test_produce_and_consume_through_the_broker(
    settings: Settings,
    producer_factory: Callable[..., Producer],
    consumer_factory: Callable[..., Consumer],
) -> None:
    create_topic(settings, settings.input_topic, 3)
    producer = producer_factory()
    for i in range(10):
        producer.produce(settings.input_topic, key=f"g{i % 3}", value=f"v{i}")
    assert producer.flush(10) == 0

    records = consume_all(settings, settings.input_topic)
    assert sorted(m.value() or b"" for m in records) == sorted(f"v{i}".encode() for i in range(10))
    # one group = one partition: the per-group order is the produce order
    by_group: dict[Any, list[Any]] = {}
    for m in sorted(records, key=lambda m: (m.partition(), m.offset())):
        by_group.setdefault(m.key(), []).append(m.value())
    assert by_group[b"g0"] == [b"v0", b"v3", b"v6", b"v9"]

    consumer = consumer_factory()
    consumer.subscribe([settings.input_topic])
    seen: list[Any] = []

    def got_all() -> bool:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            seen.append(msg.value())
        return len(seen) == 10

    wait_until(got_all, timeout=30, message=lambda: f"group consumer saw {len(seen)}/10")


def test_transactions_are_read_committed(settings: Settings, producer_factory: Callable[..., Producer]) -> None:
    create_topic(settings, settings.state_topic, 1, {"cleanup.policy": "compact"})
    producer = producer_factory(transactional_id=f"t-{uuid.uuid4().hex}")
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(settings.state_topic, key="k", value="aborted")
    assert producer.flush(10) == 0  # on the broker before the abort, not purged client-side
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(settings.state_topic, key="k", value="committed")
    producer.commit_transaction(30)
    assert [m.value() for m in consume_all(settings, settings.state_topic)] == [b"committed"]
    assert len(consume_all(settings, settings.state_topic, isolation="read_uncommitted")) == 2


def test_topics_create_is_idempotent(settings: Settings) -> None:
    first = ensure_topics(settings, partitions=4)
    assert set(first) == {"input", "state", "registry", "dlq", "listener_output", "directory", "parked", "members"}
    assert all(t.created for t in first.values())
    assert first["input"].partitions == first["state"].partitions == first["listener_output"].partitions == 4
    assert first["registry"].partitions == 1

    second = ensure_topics(settings)  # adopts the existing input's partition count
    assert not any(t.created for t in second.values())
    assert second["state"].partitions == 4
    assert second["state"].config["cleanup.policy"] == "compact"
    assert second["state"].config["delete.retention.ms"] == str(7 * 24 * 3600 * 1000)
    assert second["registry"].config["cleanup.policy"] == "compact"

    described = describe_topics(settings)
    assert described["state"] is not None and described["state"].name == settings.state_topic


def test_replication_minus_one_uses_the_broker_default(settings: Settings, kafka_bootstrap: str) -> None:
    states = ensure_topics(settings, replication_factor=-1)
    brokers = len(AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10).brokers)
    expected = 3 if brokers >= 3 else 1  # LocalCluster's default.replication.factor
    assert {s.replication_factor for s in states.values()} == {expected}


def test_history_window_sets_min_compaction_lag(settings: Settings) -> None:
    states = ensure_topics(settings, history_window_ms=60_000)
    assert describe_topics(settings)["state"] is not None
    assert states["state"].config["min.compaction.lag.ms"] == "60000"


def test_non_compacted_state_topic_is_refused(settings: Settings) -> None:
    create_topic(settings, settings.state_topic, 3, {"cleanup.policy": "delete"})
    with pytest.raises(TopicConfigError) as info:
        ensure_topics(settings, partitions=3)
    text = str(info.value)
    assert settings.state_topic in text and "cleanup.policy" in text
    assert "'delete'" in text and "'compact'" in text and "fix:" in text
    # nothing was created before refusing
    assert describe_topics(settings)["input"] is None


def test_wrong_partition_counts_are_refused(settings: Settings) -> None:
    create_topic(settings, settings.input_topic, 2)
    create_topic(settings, settings.state_topic, 3, {"cleanup.policy": "compact"})
    create_topic(settings, settings.registry_topic, 2, {"cleanup.policy": "compact"})
    with pytest.raises(TopicConfigError) as info:
        ensure_topics(settings)
    text = str(info.value)
    assert f"{settings.state_topic!r} (state): partitions is 3, expected 2" in text
    assert f"{settings.registry_topic!r} (registry): partitions is 2, expected 1" in text

    with pytest.raises(TopicConfigError, match="partitions is 2, expected 5"):
        ensure_topics(settings, partitions=5)


@pytest.mark.integration
def test_three_brokers_replicate_and_survive_a_leader_kill(kafka_cluster3: Any, settings3: Settings) -> None:
    cluster = kafka_cluster3
    admin = AdminClient(settings3.kafka_config())
    assert len(admin.describe_cluster().result(30).nodes) == 3
    states = ensure_topics(settings3, partitions=2)
    assert states["state"].replication_factor == 3
    assert describe_topics(settings3)["state"].config["min.insync.replicas"] == "2"  # type: ignore[union-attr]

    topic = settings3.input_topic
    leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    producer = Producer(settings3.kafka_config(acks="all", **{"enable.idempotence": True}))
    producer.produce(topic, key="a", value="before", partition=0)
    assert producer.flush(30) == 0

    cluster.kill_broker(leader)

    def new_leader() -> bool:
        part = admin.list_topics(topic, timeout=5).topics[topic].partitions[0]
        return part.leader not in (leader, -1)

    wait_until(new_leader, timeout=30, message="a new leader for partition 0")
    producer.produce(topic, key="a", value="during", partition=0)
    assert producer.flush(30) == 0  # 2 of 3 replicas in sync: min ISR 2 still accepts writes

    cluster.start_broker(leader)

    def back_in_isr() -> bool:
        part = admin.list_topics(topic, timeout=5).topics[topic].partitions[0]
        return leader in part.isrs

    wait_until(back_in_isr, timeout=60, message=f"broker {leader} back in the ISR")
    assert [m.value() for m in consume_all(settings3, topic)] == [b"before", b"during"]


def test_a_node_that_cannot_start_is_a_cluster_error_with_its_log(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, libs=SHARED_LIBS, heap_mb=1)  # the JVM refuses a 1 MB heap
    with pytest.raises(ClusterError) as info:
        cluster.up(timeout=60)
    text = str(info.value)
    assert "exited with code" in text and str(tmp_path) in text
    assert "heap" in text.lower()  # the log's last lines are part of the message
    assert not cluster.state_file.exists()  # nothing left that `down` would have to stop
    assert cluster.down() == []
