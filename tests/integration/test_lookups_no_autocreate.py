"""Looking up a topic does not create it, on a broker that creates topics on demand
(``auto.create.topics.enable=true``, as the local dev cluster and the test cluster have it).

A metadata request naming one topic, from a producer or an admin client (librdkafka's
``allow.auto.create.topics`` is true for them), makes such a broker create it with its own
defaults (1 partition, cleanup.policy=delete). Consumers default to false and do not.

"Not created" is asserted after a barrier: lookups that do create a sentinel topic (the old
way of asking), until it exists. The broker forwards its auto-creations to the controller,
which handles them in the order asked, so once the sentinel exists a creation asked by an
earlier lookup would exist too. The tests are skipped on a cluster that does not create
topics on demand (they would prove nothing there); test_the_barrier_sees_a_lookup_that_creates
shows the old lookup does create.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic
from kafka_fixtures import wait_until

from fifolane.config import Settings
from fifolane.errors import FifolaneError, ListenerError
from fifolane.readers import read_to_end
from listeners.client import ListenerClient
from listeners.model import ListenerSpec
from listeners.outputs import _holds_other_records
from listeners.registry import (
    _partitions_of,
    ensure_output_topic,
    ensure_registry_topic,
    read_registry,
)
from services.worker.kafka import TxnProducer, WorkerConsumer
from services.worker.parking import read_parked
from spark.history import offsets_as_of

pytestmark = pytest.mark.integration


def _topics(admin: AdminClient) -> set[str]:
    return set(admin.list_topics(timeout=10).topics)


def _config(admin: AdminClient, topic: str) -> dict[str, tuple[str, bool]]:
    """Topic config: name -> (value, set on the topic when it was created rather than a default)."""
    resource = ConfigResource("TOPIC", topic)
    entries = admin.describe_configs([resource])[resource].result(30)
    return {k: (e.value, e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value) for k, e in entries.items()}


def _barrier(settings: Settings, admin: AdminClient) -> None:
    """Ask the old way (an admin client's lookup naming a missing topic) until the broker has
    created that sentinel topic: every auto-creation asked before has happened by then."""
    sentinel = f"test.sentinel.{uuid.uuid4().hex[:10]}"
    asker = AdminClient(settings.kafka_config())  # an admin client: allow.auto.create.topics is true
    wait_until(lambda: asker.list_topics(sentinel, timeout=10).topics[sentinel].error is None, timeout=30,
               message=f"the sentinel {sentinel} auto-created by a lookup naming it")


@pytest.fixture
def auto_admin(settings: Settings) -> AdminClient:
    """An admin client; the test is skipped unless the brokers create topics on demand."""
    admin = AdminClient(settings.kafka_config())
    broker = ConfigResource("BROKER", str(min(admin.list_topics(timeout=10).brokers)))
    if admin.describe_configs([broker])[broker].result(30)["auto.create.topics.enable"].value != "true":
        pytest.skip("the test cluster does not create topics on demand: nothing to show")
    return admin


def test_ensure_output_topic_creates_a_missing_topic_with_the_input_partitions_and_configs(
        settings: Settings, auto_admin: AdminClient) -> None:
    auto_admin.create_topics([NewTopic(settings.input_topic, 5, 1)])[settings.input_topic].result(30)
    output = f"test.out.{uuid.uuid4().hex[:10]}"

    assert ensure_output_topic(settings, output) == 5

    md = auto_admin.list_topics(timeout=10).topics[output]
    assert md.error is None and sorted(md.partitions) == [0, 1, 2, 3, 4]  # not the broker's 1
    assert _config(auto_admin, output)["cleanup.policy"] == ("delete", True)  # set by fifolane
    assert ensure_output_topic(settings, output) == 5  # found now, left as it is


def test_ensure_registry_topic_creates_a_compacted_single_partition_topic(
        settings: Settings, auto_admin: AdminClient) -> None:
    ensure_registry_topic(settings)

    md = auto_admin.list_topics(timeout=10).topics[settings.registry_topic]
    assert md.error is None and sorted(md.partitions) == [0]
    assert _config(auto_admin, settings.registry_topic)["cleanup.policy"] == ("compact", True)


def _refresh(settings: Settings, topic: str) -> None:
    producer = TxnProducer(settings.kafka_config(), transactional=False)
    try:
        producer.refresh(topic)
    finally:
        producer.close()


def _partition_count(settings: Settings, topic: str) -> None:
    consumer = WorkerConsumer(settings.kafka_config(**{"group.id": f"test-{uuid.uuid4().hex[:8]}"}))
    try:
        assert consumer.partition_count(topic, timeout=10) is None
    finally:
        consumer.close()


def _read_to_end(settings: Settings, topic: str) -> None:
    with pytest.raises(FifolaneError, match="does not exist"):
        read_to_end(settings, topic, timeout=1)


def _listener_client(settings: Settings, topic: str) -> None:
    with pytest.raises(ListenerError, match="does not exist"):
        ListenerClient(settings, "ghost", spec=ListenerSpec(name="ghost", filter="true", output_topic=topic))


def _offsets_as_of(settings: Settings, topic: str) -> None:
    with pytest.raises(FifolaneError, match="does not exist"):
        offsets_as_of(settings, topic, datetime.now(tz=UTC))


LOOKUPS: dict[str, Callable[[Settings, str], None]] = {
    # an admin client and a producer: these created the topic before
    "registry-partitions-of": lambda s, t: None if _partitions_of(s, t) is None else pytest.fail("found"),
    "producer-refresh": _refresh,
    # consumers (allow.auto.create.topics false by default): kept as they were
    "worker-partition-count": _partition_count,
    "read-registry": lambda s, t: None if read_registry(s.with_overrides(registry_topic=t), timeout=10).listeners == {}
    else pytest.fail("registrations"),
    "read-parked": lambda s, t: None if read_parked(s.kafka_config(), t, timeout=10) == {} else pytest.fail("parked"),
    "read-to-end": _read_to_end,
    "listener-client": _listener_client,
    "output-sample": lambda s, t: None if _holds_other_records(s, t) is False else pytest.fail("records"),
    "offsets-as-of": _offsets_as_of,
}


@pytest.mark.parametrize("lookup", sorted(LOOKUPS))
def test_a_lookup_of_a_missing_topic_leaves_it_missing(
        settings: Settings, auto_admin: AdminClient, lookup: str) -> None:
    topic = f"test.missing.{lookup}.{uuid.uuid4().hex[:8]}"
    LOOKUPS[lookup](settings, topic)
    _barrier(settings, auto_admin)
    assert topic not in _topics(auto_admin)


def test_the_barrier_sees_a_lookup_that_creates(settings: Settings, auto_admin: AdminClient) -> None:
    """The check above can fail: a producer's lookup naming a missing topic (what fifolane
    asked before) creates it, with the broker's 1 partition."""
    named = f"test.named.{uuid.uuid4().hex[:10]}"
    producer = Producer(settings.kafka_config())
    producer.list_topics(named, timeout=10)
    _barrier(settings, auto_admin)
    md = auto_admin.list_topics(timeout=10).topics[named]
    assert sorted(md.partitions) == [0]
