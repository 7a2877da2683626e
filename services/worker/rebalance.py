"""Consumer-group rebalances: restore before processing, commit before giving partitions up.

The callbacks run on the poll thread, inside ``consume()``, and see only the input partitions
that move (cooperative-sticky assignment); the entity directory's partitions move with them
(services/worker/linked.py).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from fifolane.errors import WorkerError
from services.worker.assignment import Assignment
from services.worker.kafka import Record, WorkerConsumer, consumer_error
from services.worker.linked import LinkedConsumer
from services.worker.metrics import Stats
from services.worker.orphans import OrphanWatch

__all__ = ["ConsumerFailures", "Rebalance", "fatal_error"]

log = logging.getLogger(__name__)


class Rebalance:
    """``commit``: finish and commit in-flight work (a checkpoint); ``abort``: give up the
    open transaction (its partitions are lost: someone else owns them already). A
    :class:`LinkedConsumer` takes the entity directory's partitions along with the input's
    (services.worker.linked). ``orphans``: a static member's watch for input partitions that
    nobody owns (services.worker.orphans), looked at in :meth:`tick`."""

    def __init__(self, assignment: Assignment, consumer: WorkerConsumer, commit: Callable[[], None],
                 abort: Callable[[], None], stats: Stats, orphans: OrphanWatch | None = None) -> None:
        self._assignment = assignment
        self._stats = stats
        self._consumer = consumer
        self._commit = commit
        self._abort = abort
        self._linked = consumer if isinstance(consumer, LinkedConsumer) else None
        self._topics = {assignment.topics.input}
        self._failures = ConsumerFailures()
        self.orphans = orphans

    def tick(self) -> None:
        """Every turn of the poll loop."""
        if self.orphans is not None:
            self.orphans.tick()

    def close(self) -> None:
        if self.orphans is not None:
            self.orphans.close()

    def _by_topic(self, partitions: list[TopicPartition]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        stale = []
        for tp in partitions:
            if tp.topic in self._topics:
                out.setdefault(tp.topic, []).append(tp.partition)
            else:
                stale.append(f"{tp.topic}[{tp.partition}]")
        if stale:
            # A static member can be handed the assignment of an earlier incarnation that
            # subscribed to other topics; none of that is ours to process.
            log.warning("ignoring assigned partitions of other topics: %s (another topic set in this consumer "
                        "group, or an older worker: give each topic set its own --group-id)", stale)
        return out

    def renew(self, err: KafkaError) -> None:
        """The consumer failed for good (``err``, fatal): its partitions are lost (another
        member may hold them now), and a new consumer joins the group in its place. Raises
        :class:`WorkerError` when that keeps happening (:class:`ConsumerFailures`)."""
        self._failures.note(err)
        owned = self._assignment.owned
        log.warning("the consumer failed for good (%s): partitions %s lost, joining the group again with "
                    "a new consumer", err.str(), owned)
        self.on_lost(None, [TopicPartition(self._assignment.topics.input, p) for p in owned])
        self._consumer.renew()
        self._stats.consumer_renewals += 1

    def on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        for topic, ps in self._by_topic(partitions).items():
            self._assignment.assign(topic, ps)
            if self._linked is not None:
                linked = self._linked.linked(ps)
                if linked:
                    self._assignment.assign(self._linked.side_topic, linked)

    def on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        moved = self._by_topic(partitions)
        if moved:
            self._commit()  # finish and commit in-flight work before giving it up
        self._give_up(moved)

    def on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        moved = self._by_topic(partitions)
        log.warning("partitions lost: %s", moved)
        if moved:
            self._abort()
        self._give_up(moved)

    def _give_up(self, moved: dict[str, list[int]]) -> None:
        for topic, ps in moved.items():
            self._assignment.revoke(topic, ps)
            if self._linked is not None:
                linked = self._linked.linked(ps)
                if linked:
                    self._assignment.revoke(self._linked.side_topic, linked)
                    self._linked.release(linked)


def fatal_error(records: list[Record]) -> KafkaError | None:
    """The fatal consumer error among ``records``, a batch an abort dropped unread: librdkafka
    delivers it once, and a worker that missed it would poll a dead consumer for good."""
    for msg in records:
        err = msg.error()
        if err is not None and consumer_error(err) is not None:
            return err
    return None


class ConsumerFailures:
    """Fatal consumer errors, to tell a mishap from a worker that cannot go on.

    A static member's consumer is fenced for good now and then with no one else to blame:
    after a broker failover, the coordinator may keep a member id whose join response was
    lost. A new consumer then takes the partitions back. When another live worker runs with
    the same ``--worker-id``, the two fence each other again and again, and neither gets far:
    after ``limit`` failures within ``window_s``, :meth:`note` stops this worker with a
    :class:`WorkerError` that says what to fix.

    Which of the two stops: the newcomer. A worker fenced ``young_limit`` times within
    ``young_s`` of its start (a copy-pasted command line started next to a running worker)
    stops, while a worker that has run longer needs ``limit`` fencings: the running one
    keeps its partitions, and the mistake shows where it was made. (Two workers started
    together are both new: the first one fenced twice stops.) (Two workers with one id
    on one machine do not get this far: the second cannot claim the state directory,
    services.worker.storedirs.)
    """

    def __init__(self, limit: int = 5, window_s: float = 120.0, young_limit: int = 2,
                 young_s: float = 60.0) -> None:
        self.window_s = window_s
        self.young_limit, self.young_s = young_limit, young_s
        self._started = time.monotonic()
        self._young = 0  # fencings within young_s of the start
        self._times: deque[float] = deque(maxlen=limit)

    def note(self, err: KafkaError) -> None:
        now = time.monotonic()
        times = self._times
        times.append(now)
        text = err.str()
        fenced = "group.instance.id" in text
        self._young += fenced and now - self._started <= self.young_s
        if self._young >= self.young_limit:
            raise WorkerError(f"the Kafka consumer was fenced {self._young} times in the {now - self._started:.0f} s "
                              f"since this worker started ({text}): another worker runs with the same --worker-id "
                              "in this consumer group, and it was there first: this one stops. Give each worker "
                              "its own --worker-id (or leave it out: host and pid)")
        if len(times) < (times.maxlen or 0) or now - times[0] > self.window_s:
            return
        if fenced:
            raise WorkerError(f"the Kafka consumer was fenced {len(times)} times in {now - times[0]:.0f} s "
                              f"({text}): another worker runs with the same --worker-id in this consumer "
                              "group. Give each worker its own --worker-id (or leave it out: host and pid)")
        raise WorkerError(f"the Kafka consumer failed for good {len(times)} times in {now - times[0]:.0f} s: {text}")
