"""services.worker.group_admin against a real broker: the child process describes a live
consumer group and its input topic as AdminClient does, and a child that dies (SIGKILL here,
SIGABRT in librdkafka#4605) is replaced at the next question while the worker's side lives on."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, TopicCollection
from kafka_fixtures import wait_until

from fifolane.config import Settings
from services.worker.group_admin import GroupAdmin

pytestmark = pytest.mark.integration


def test_the_child_describes_a_live_group_and_is_replaced_when_it_dies(settings: Settings, topics: Any) -> None:
    group = f"fifolane-group-admin-{settings.input_topic}"
    consumer = Consumer(settings.kafka_config(**{"group.id": group, "client.id": "w7-consumer",
                                                 "group.instance.id": "w7",
                                                 "partition.assignment.strategy": "cooperative-sticky"}))
    consumer.subscribe([settings.input_topic])
    admin = GroupAdmin(settings.kafka_config())
    try:
        wait_until(lambda: (consumer.poll(0.2), len(consumer.assignment()) == settings.partitions)[1],
                   timeout=60, message="the consumer got no partitions")

        def stable() -> Any:
            desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(20)
            return desc if desc.state == ConsumerGroupState.STABLE else None

        desc = wait_until(stable, timeout=60, message="the group never became stable")
        (member,) = desc.members
        assert (member.client_id, member.group_instance_id) == ("w7-consumer", "w7")
        assert sorted(tp.partition for tp in member.assignment.topic_partitions
                      if tp.topic == settings.input_topic) == list(range(settings.partitions))
        topic = admin.describe_topics(TopicCollection([settings.input_topic]), request_timeout=10)
        assert len(topic[settings.input_topic].result(20).partitions) == settings.partitions

        proc = admin._proc
        assert proc is not None and admin.started == 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        wait_until(lambda: admin.died == [-signal.SIGKILL], timeout=10, message=lambda: f"died {admin.died}")
        again = admin.describe_consumer_groups([group], request_timeout=10)[group].result(20)
        assert again.state == ConsumerGroupState.STABLE and [m.client_id for m in again.members] == ["w7-consumer"]
        assert admin.started == 2
    finally:
        admin.close()
        consumer.close()

