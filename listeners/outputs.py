"""Which topics a listener may write its notifications to (docs/security.md, "Output topics").

Workers write notifications with their own rights, so an output topic chosen freely would let
whoever registers a listener write JSON into any topic a worker may write: into the input
topic (every notification would come back as an event), the state topic, the registry. So:

- :func:`role_topic_problem` (no I/O; at registration and again in every worker before it
  activates a listener): a role topic of the pipeline (input, state, registry, dead-letter,
  entity directory, parked) or one of Kafka's internal topics is refused.
- :func:`check_output_topic` (at registration): also a topic already used for something
  else: a compacted topic (a table or changelog; output topics are ``cleanup.policy=delete``)
  or one whose latest records are not notifications (no ``fifolane.listener`` header), and,
  on a cluster with an authorizer, a topic the registering principal may not write (or
  create, when it is missing).
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from fifolane.access import KafkaAccess
from fifolane.config import Settings
from fifolane.errors import ListenerError

__all__ = ["check_output_topic", "check_registry_access", "role_topic_problem"]

_HEADER = "fifolane.listener"
#: records looked at per partition (the newest ones) to tell a notification topic
_SAMPLE = 20


def role_topic_problem(settings: Settings, topic: str) -> str | None:
    """Why ``topic`` cannot be a listener output topic of this pipeline, or None."""
    roles = {
        "input": settings.input_topic, "state": settings.state_topic, "registry": settings.registry_topic,
        "dead-letter": settings.dlq_topic, "entity directory": settings.directory_topic,
        "parked": settings.parked_topic,
    }
    for role, name in roles.items():
        if topic == name:
            return (f"output topic {topic!r} is the pipeline's {role} topic: notifications may not "
                    f"be written into the pipeline's own topics; choose another output topic")
    if topic.startswith("__"):
        return f"output topic {topic!r} is one of Kafka's internal topics; choose another output topic"
    return None


def _who(access: KafkaAccess) -> str:
    return access.principal or "this client"


def check_registry_access(settings: Settings, access: KafkaAccess, *, write: bool = True) -> None:
    """ListenerError naming the missing permission if the principal may not read (and, with
    ``write``, write) the registry topic; a missing registry is left to its creation."""
    topic = settings.registry_topic
    found = access.topics([topic])[topic]
    if not found.exists:
        return
    lacking = [op for op in (("READ", "WRITE") if write else ("READ",)) if not found.allows(op)]
    if lacking:
        who = _who(access)
        what = "register or remove listeners" if write else "read listener registrations"
        raise ListenerError(
            f"{who} may not {what}: it lacks {' and '.join(lacking)} on the registry topic "
            f"{topic!r}; an administrator can grant it with `fifolane acls apply --role listener-admin "
            f"--principal {who}` (docs/security.md)"
        )


def check_output_topic(settings: Settings, access: KafkaAccess, topic: str,
                       listener_topics: Collection[str] = ()) -> bool:
    """Refuse ``topic`` as a new registration's output topic (ListenerError saying why);
    returns whether it exists. ``listener_topics``: output topics of registered listeners
    (known to hold notifications)."""
    problem = role_topic_problem(settings, topic)
    if problem is not None:
        raise ListenerError(problem)
    found = access.topics([topic])[topic]
    who = _who(access)
    needed = "WRITE" if found.exists else "CREATE"
    if not found.allows(needed):
        raise ListenerError(
            f"{who} may not name output topic {topic!r}: it lacks {needed} on topic {topic!r}; a "
            f"listener's output topic must be one its registering principal may write; an "
            f"administrator can grant it with `fifolane acls apply --role listener-admin --principal "
            f"{who} --output {topic}` (docs/security.md)"
        )
    if found.exists and topic != settings.listener_output_topic and topic not in listener_topics:
        _check_not_foreign(settings, topic, found.allows("DESCRIBE_CONFIGS"), found.allows("READ"))
    return found.exists


def _check_not_foreign(settings: Settings, topic: str, can_describe: bool, can_read: bool) -> None:
    """ListenerError if ``topic`` is used for something other than notifications (as far as
    the principal may see: configs need DESCRIBE_CONFIGS, records READ)."""
    if can_describe:
        admin = AdminClient(settings.kafka_config())
        resource = ConfigResource(ResourceType.TOPIC, topic)
        try:
            policy = admin.describe_configs([resource], request_timeout=15)[resource].result()
        except KafkaException:
            policy = {}
        entry = policy.get("cleanup.policy")
        if entry is not None and "compact" in str(entry.value):
            raise ListenerError(
                f"output topic {topic!r} is compacted (cleanup.policy={entry.value}): it holds a table or "
                f"changelog, not notifications; choose another output topic"
            )
    if can_read and _holds_other_records(settings, topic):
        raise ListenerError(
            f"output topic {topic!r} already holds records that are not listener notifications (no "
            f"{_HEADER} header): it is used for something else; choose another output topic"
        )


def _holds_other_records(settings: Settings, topic: str, timeout: float = 10.0) -> bool:
    """Do the newest records of ``topic`` (up to :data:`_SAMPLE` per partition) include one
    without the ``fifolane.listener`` header?"""
    consumer = Consumer(settings.kafka_config(**{
        # the registry group prefix: the one a listener admin may use (docs/security.md)
        "group.id": f"fifolane-registry-check-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True,
    }))  # fmt: skip
    try:
        md = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if md is None or md.error is not None:
            return False
        assign, pending = [], set()
        for p in md.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if high > low:
                assign.append(TopicPartition(topic, p, max(low, high - _SAMPLE)))
                pending.add(p)
        consumer.assign(assign)
        while pending:
            msg = consumer.poll(timeout)
            if msg is None:
                return False  # nothing more within the time-out: judged on what was seen
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    return False  # cannot tell (no READ, say): the ACLs decide
                pending.discard(msg.partition())
                continue
            if not any(h[0] == _HEADER for h in msg.headers() or []):
                return True
        return False
    except KafkaException:
        return False
    finally:
        consumer.close()
