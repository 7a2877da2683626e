"""Input partitions that no member of the consumer group owns, and the rejoin that hands them out.

Cooperative rebalancing moves a partition in two rounds. In the first, the leader takes it from
its owner and gives it to no one; the owner gives it up (``on_revoke``, after its last commit)
and joins again, and that second round gives it to its new owner. A static member
(``--worker-id``: ``group.instance.id``) killed between the two rounds never joins again as
the member that gave the partition up. Its next process joins with the same instance id while
the group is stable, and the coordinator hands it its last assignment back without a rebalance
("Static member which joins during Stable stage and doesn't affect the selected protocol will
not trigger a rebalance"). So do later restarts of the other members. The partition stays
without an owner until something else makes the group rebalance (a new member, or one that
stays away past its session time-out). The window is wide with slow handlers: the owner's
``on_revoke`` runs only when the poll loop takes records again, and then waits for every
handler call in flight.

:class:`OrphanWatch` asks the coordinator every ``interval`` seconds for the members and
their assignments (one DescribeGroups request, answered off the poll thread by a child process:
services.worker.group_admin). When the group
is stable and the same partitions have had no owner under the same assignment for ``grace``
seconds (much longer than a second round takes), the static member with the fewest input
partitions (ties: the lowest member id) leaves the group, and one more static member after each
further ``grace`` (members without the watch never act). A LeaveGroup makes the coordinator
rebalance, static member or not, and that round hands the partitions out. The member joins
again once it has left (its member id gone): a subscribe before that would cancel the leave.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from confluent_kafka import ConsumerGroupState, KafkaException, TopicCollection

if TYPE_CHECKING:
    from services.worker.clients import KafkaClients
    from services.worker.kafka import WorkerConsumer
    from services.worker.options import WorkerOptions

__all__ = ["GRACE_S", "INTERVAL_S", "LEAVE_S", "OrphanWatch", "Orphans", "orphan_watch"]

log = logging.getLogger(__name__)

INTERVAL_S = 10.0  # between two looks at the group
GRACE_S = 30.0  # partitions unowned under one assignment this long: rejoin
LEAVE_S = 60.0  # a leave not done by then (its revoke not run): join again anyway


class Orphans:
    """When to rejoin, from what the coordinator reports (no Kafka here)."""

    def __init__(self, grace: float = GRACE_S) -> None:
        self.grace = grace
        self._seen: tuple[Any, ...] | None = None
        self._since = 0.0

    def rejoin(self, me: str | None, stable: bool, partitions: int,
               members: Mapping[str, tuple[bool, frozenset[int]]], now: float) -> list[int]:
        """The partitions nobody owns if this member (``me``, a member id) should leave the
        group and join again now, else []. ``members``: member id -> (whether it is static,
        its input partitions)."""
        orphans = sorted(set(range(partitions)).difference(*(ps for _s, ps in members.values()))) if stable else []
        if not orphans or me not in members:
            self._seen = None
            return []
        seen = (tuple(orphans), tuple(sorted((m, tuple(sorted(ps))) for m, (_s, ps) in members.items())))
        if seen != self._seen:
            self._seen, self._since = seen, now
            return []
        turns = sorted((len(ps), m) for m, (static, ps) in members.items() if static)
        turn = next((i for i, (_n, m) in enumerate(turns) if m == me), len(turns))
        if now - self._since < (turn + 1) * self.grace:
            return []
        self._seen = None
        return orphans


class OrphanWatch:
    """Looks at the group now and then (:meth:`tick`, every turn of the poll loop) and makes
    ``consumer`` leave and join again when :class:`Orphans` says so."""

    def __init__(self, admin: Callable[[], Any], consumer: WorkerConsumer, group: str, topic: str, *,
                 interval: float = INTERVAL_S, grace: float = GRACE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._make_admin = admin
        self._admin: Any = None
        self._consumer = consumer
        self._group = group
        self._topic = topic
        self._interval = interval
        self._clock = clock
        self.orphans = Orphans(grace)
        self._asked: tuple[float, Future[Any], Future[Any]] | None = None
        self._next = clock() + interval
        self._left: float | None = None  # when this member left the group to join again
        self.rejoins = 0

    def tick(self) -> None:
        now = self._clock()
        if self._left is not None:
            self._join_again(now)
            return
        if self._asked is None:
            if now >= self._next:
                self._next = now + self._interval
                self._ask(now)
            return
        at, group, topic = self._asked
        if not (group.done() and topic.done()):
            if now - at > 3 * self._interval:
                self._asked = None  # no answer: ask again at the next look
            return
        self._asked = None
        try:
            desc, partitions = group.result(), len(topic.result().partitions)
        except KafkaException as exc:
            log.info("cannot describe consumer group %s: %s", self._group, exc)
            return
        members = {m.member_id: (m.group_instance_id is not None, frozenset(
            tp.partition for tp in m.assignment.topic_partitions if tp.topic == self._topic)) for m in desc.members}
        orphans = self.orphans.rejoin(self._consumer.member_id(), desc.state == ConsumerGroupState.STABLE,
                                      partitions, members, at)  # as it was when asked
        if not orphans:
            return
        log.warning("input partitions %s have had no owner in group %s for %.0f s or more (a static member "
                    "restarted between the two rounds of a cooperative rebalance): leaving the group "
                    "and joining again, so that it rebalances", orphans, self._group, self.orphans.grace)
        try:
            self._consumer.leave()  # the revoke runs in the next consume(), then the LeaveGroup
        except KafkaException as exc:  # a consumer failed for good: its error renews it (rebalance.py)
            log.warning("cannot leave group %s now: %s", self._group, exc)
            return
        self._left = now
        self.rejoins += 1

    def _join_again(self, now: float) -> None:
        if self._consumer.member_id() and now - (self._left or now) < LEAVE_S:
            return  # not left yet
        try:
            self._consumer.rejoin()
        except KafkaException as exc:
            log.warning("cannot join group %s again now: %s", self._group, exc)
            return
        self._left = None
        self._next = now + self._interval

    def close(self) -> None:
        """End the admin (its child process, services.worker.group_admin) now."""
        admin, self._asked, self._admin = self._admin, None, None
        if admin is not None and hasattr(admin, "close"):
            admin.close()

    def _ask(self, now: float) -> None:
        try:
            if self._admin is None:
                self._admin = self._make_admin()
            group = self._admin.describe_consumer_groups([self._group], request_timeout=self._interval)[self._group]
            topic = self._admin.describe_topics(TopicCollection([self._topic]),
                                                request_timeout=self._interval)[self._topic]
        except KafkaException as exc:
            log.info("cannot describe consumer group %s: %s", self._group, exc)
            return
        self._asked = (now, group, topic)


def orphan_watch(clients: KafkaClients, consumer: WorkerConsumer, group: str, topic: str,
                 opts: WorkerOptions) -> OrphanWatch | None:
    """The watch for a static member; a dynamic one needs none (a restart joins as a new
    member, and the group rebalances)."""
    return OrphanWatch(clients.admin, consumer, group, topic) if opts.static_membership else None
