"""Consumer-group rebalances: restore before processing, commit before giving partitions up.

The callbacks run on the poll thread, inside ``consume()``, and see only the input partitions
that move (cooperative-sticky assignment); the entity directory's partitions move with them
(services/worker/linked.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition

from services.worker.assignment import Assignment
from services.worker.linked import LinkedConsumer

__all__ = ["Rebalance"]

log = logging.getLogger(__name__)


class Rebalance:
    """``commit``: finish and commit in-flight work (a checkpoint); ``abort``: give up the
    open transaction (its partitions are lost: someone else owns them already). ``linked``:
    the consumer that takes the entity directory's partitions along with the input's
    (services.worker.linked); None: the directory is not used."""

    def __init__(self, assignment: Assignment, commit: Callable[[], None], abort: Callable[[], None],
                 linked: LinkedConsumer | None = None) -> None:
        self._assignment = assignment
        self._commit = commit
        self._abort = abort
        self._linked = linked
        self._topics = {assignment.topics.input}

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
