"""Which listeners to suspend when Kafka will not take what a worker produced to an output topic.

A listener's output topic can disappear under a running worker (deleted by an operator), or
the worker can lose the right to write it. Its notifications then fail for good, and replaying
the transaction would fail the same way for ever. So the worker asks the listeners before it
looks for an input record to blame (services.worker.bisect, ``Bisection.answer``), and
:class:`OutputRefusals` says which listeners to suspend:

- a record refused because its topic is gone or not writable (:data:`TOPIC_GONE`): the
  listeners writing to that topic. Within the transaction that suspended them, later reports
  of their notifications are theirs too; after it, a refusal there is a handler's emit (its
  input record is to blame), since no listener here writes there any more;
- records that timed out (:data:`TIMED_OUT`): librdkafka retries a record to a topic deleted
  after the producer learnt of it until the record times out, then fails the transaction
  with a time-out, not a refusal (and exactly-once has no per-record reports to say where).
  So the listeners' topics are looked up: those writing to a topic that is gone.
- anything else (a record too large or invalid: not the topic's fault): nobody here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from fifolane.config import Settings
from fifolane.errors import KafkaClientError
from listeners.notifier import Active

__all__ = ["TIMED_OUT", "TOPIC_GONE", "OutputRefusals", "existing_topics"]

log = logging.getLogger(__name__)

#: Kafka's refusals that mean the output topic is gone or not writable (not the record's fault)
TOPIC_GONE = frozenset({"UNKNOWN_TOPIC_OR_PART", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION", "TOPIC_AUTHORIZATION_FAILED"})
#: A transaction or a record that timed out: maybe its topic is gone (looked up)
TIMED_OUT = frozenset({"_TIMED_OUT", "_MSG_TIMED_OUT"})


def existing_topics(settings: Settings, topics: Collection[str], timeout: float = 3.0) -> set[str] | None:
    """Which of ``topics`` exist and are visible to us; None if the cluster does not say now."""
    try:
        md = AdminClient({**settings.kafka_config(), "allow.auto.create.topics": False}).list_topics(timeout=timeout)
    except KafkaException as exc:
        log.info("listener output topics not looked up: %s", exc)
        return None
    return {t for t in topics if t in md.topics and md.topics[t].error is None}


class OutputRefusals:
    """The listeners to suspend for a refusal (see the module docstring). ``exists``: which of
    the given topics exist (None: unknown; by default :func:`existing_topics`)."""

    def __init__(self, exists: Callable[[Collection[str]], set[str] | None]) -> None:
        self._exists = exists
        self._topics: set[str] = set()  # topics whose listeners this transaction suspended

    def names(self, topic: str | None, error: KafkaClientError, active: Mapping[str, Active]) -> list[str] | None:
        """The listeners to suspend for ``error`` about ``topic`` (None: unknown, the error is
        a time-out); None if the listeners are not the ones to answer for it."""
        if topic is None:
            if error.code not in TIMED_OUT:
                return None
            topics = {a.topic for a in active.values()}
            found = self._exists(topics) if topics else None
            gone = topics - found if found is not None else set()
            if not gone:
                return None
            log.warning("listener output topics %s are gone (records timed out)", sorted(gone))
            self._topics |= gone
            return [n for n, a in active.items() if a.topic in gone]
        names = [n for n, a in active.items() if a.topic == topic]
        if error.code not in TOPIC_GONE or not (names or topic in self._topics):
            return None
        self._topics.add(topic)
        return names

    def settled(self) -> None:
        """The transaction ended (committed or aborted)."""
        self._topics.clear()
