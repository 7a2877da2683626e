"""The worker's consumer of its two topics: the input, shared out by the consumer group, and
the entity directory, whose partitions follow the input's.

Subscribed together in one group, the two topics were balanced as one pool of partitions
(cooperative-sticky balances each member's count, not each topic's): a worker that joined
second got every directory partition and no input partition, and processed no event. Only
the input topic is subscribed now. Directory partition ``d`` belongs to the owner of input
partition ``d % N`` (N: the input's partition count when the worker first needs it) and is
assigned, with the input partition and after it, to a second consumer that never joins the
group. Its offsets are still committed under the group, in the worker's transaction, so the
group's generation fences a zombie for both topics.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import TopicPartition

from services.worker.assignment import Topics
from services.worker.clients import KafkaClients, consumer_config
from services.worker.kafka import Record, WorkerConsumer
from services.worker.options import WorkerOptions

__all__ = ["LinkedConsumer", "worker_consumer"]

log = logging.getLogger(__name__)


def worker_consumer(clients: KafkaClients, opts: WorkerOptions, group_id: str, topics: Topics) -> WorkerConsumer:
    """The worker's consumer: of the input topic in the group, and with the entity directory
    (if used) a :class:`LinkedConsumer` whose second consumer never joins the group."""
    main = clients.consumer(consumer_config(opts, group_id))
    if not topics.directory:
        return main
    side = consumer_config(opts, group_id)
    side.pop("group.instance.id", None)
    side["client.id"] = f"{opts.worker_id}-directory"
    linked = LinkedConsumer(main, clients.consumer(side), topics.input, topics.directory)
    linked.linked([])  # the partition counts, now (outside any callback)
    return linked


class LinkedConsumer(WorkerConsumer):
    """A :class:`services.worker.kafka.WorkerConsumer` to the worker; calls about a partition
    go to the consumer that has it (``main``: the group's, ``side``: the directory's)."""

    def __init__(self, main: WorkerConsumer, side: WorkerConsumer, input_topic: str,  # noqa: PLW0231
                 side_topic: str) -> None:
        self._main = main
        self._side = side
        self._input = input_topic
        self.side_topic = side_topic
        self._side_parts: set[int] = set()  # directory partitions assigned to ``side``
        self._counts: tuple[int, int] | None = None  # (input, directory) partition counts
        self._side_first = False  # which consumer fills a batch first (alternates: see consume)
        self._side_sought: set[int] | None = None  # directory partitions sought inside main.consume
        self._sought: set[tuple[str, int]] | None = None  # partitions sought inside poll_more()

    def linked(self, input_partitions: list[int]) -> list[int]:
        """The directory partitions that go with these input partitions."""
        while self._counts is None:  # without them the directory would go unowned: wait
            # Asked of the side consumer: this runs inside the main one's rebalance callback,
            # where a metadata call on the main handle clears its call state, and librdkafka's
            # next callback in that consume() aborted the process (confluent_kafka.c
            # CallState_get). ``worker_consumer`` asks once before subscribing anyway.
            n_in = self._side.partition_count(self._input, timeout=10)
            n_dir = self._side.partition_count(self.side_topic, timeout=10)
            if n_in is not None and n_dir is not None:
                self._counts = (n_in, n_dir)
            else:
                log.warning("partition counts of %s and %s not known yet: asking again", self._input,
                            self.side_topic)
                time.sleep(1.0)
        n_in, n_dir = self._counts
        if not n_in:
            return []
        owned = set(input_partitions)
        return [d for d in range(n_dir) if d % n_in in owned]

    def _of(self, topic: str) -> WorkerConsumer:
        return self._side if topic == self.side_topic else self._main

    # -- the poll loop -------------------------------------------------------------------------
    def consume(self, n: int, timeout: float = 0) -> list[Record]:
        """At most ``n`` records of both topics (a transaction's room while bisecting is
        counted in records: two full batches would never let it narrow, bisect.py). The two
        consumers take turns at filling the batch first, so neither topic starves the other."""
        if not self._side_parts:
            only: list[Record] = self._main.consume(n, timeout)
            return only
        self._side_first = not self._side_first
        if self._side_first:
            more: list[Record] = self._side.consume(n, 0)
            if len(more) >= n:
                return more
            # The main consumer's rebalance callbacks run in its consume(): an abort there
            # seeks the directory back, and what was fetched before it must not be taken.
            self._side_sought = set()
            try:
                msgs: list[Record] = self._main.consume(n - len(more), timeout)
            finally:
                sought, self._side_sought = self._side_sought, None
            if sought:
                more = [m for m in more if m.partition() not in sought]
            return msgs + more if msgs else more
        msgs = self._main.consume(n, timeout)
        if len(msgs) >= n:
            return msgs
        more = self._side.consume(n - len(msgs), 0)
        return msgs + more if more else msgs

    def poll(self, timeout: float) -> Record | None:
        msg: Record | None = self._main.poll(timeout)
        if msg is None and self._side_parts:
            more = self._side.consume(1, 0)
            return more[0] if more else None
        return msg

    # -- the group: the main consumer's ----------------------------------------------------------
    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self._main.subscribe([t for t in topics if t != self.side_topic], **callbacks)

    def renew(self) -> None:
        self._main.renew()  # the side consumer never joins the group: nothing fences it

    def leave(self) -> None:
        self._main.leave()

    def rejoin(self) -> None:
        self._main.rejoin()

    def member_id(self) -> str | None:
        return self._main.member_id()

    def group_metadata(self) -> Any:
        return self._main.group_metadata()

    def committed(self, partitions: list[TopicPartition],
                  timeout: float) -> dict[tuple[str, int], tuple[int | None, str | None]]:
        return self._main.committed(partitions, timeout)

    def commit(self, offsets: list[TopicPartition], wait: bool = True) -> None:
        self._main.commit(offsets, wait)  # the group takes offsets of partitions it did not assign

    def partition_count(self, topic: str, timeout: float) -> int | None:
        return self._main.partition_count(topic, timeout)

    # -- per partition ---------------------------------------------------------------------------
    def assign_more(self, partitions: list[TopicPartition]) -> None:
        for topic in {tp.topic for tp in partitions}:
            tps = [tp for tp in partitions if tp.topic == topic]
            self._of(topic).assign_more(tps)
            if topic == self.side_topic:
                self._side_parts.update(tp.partition for tp in tps)

    def release(self, partitions: list[int]) -> None:
        """Directory partitions given up (after the commit that covers them)."""
        gone = [p for p in partitions if p in self._side_parts]
        if gone:
            self._side.unassign_some([TopicPartition(self.side_topic, p) for p in gone])
            self._side_parts.difference_update(gone)

    def seek(self, tp: TopicPartition) -> None:
        if self._sought is not None:
            self._sought.add((tp.topic, tp.partition))
        self._of(tp.topic).seek(tp)
        if self._side_sought is not None and tp.topic == self.side_topic:
            self._side_sought.add(tp.partition)

    def pause(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._of(tp.topic).pause([tp])

    def resume(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self._of(tp.topic).resume([tp])

    def watermarks(self, tp: TopicPartition, timeout: float | None = None, cached: bool = False) -> tuple[int, int]:
        return self._of(tp.topic).watermarks(tp, timeout, cached)

    def position(self, tp: TopicPartition) -> int:
        return self._of(tp.topic).position(tp)

    def close(self) -> None:
        self._main.close()  # revokes: the worker commits, then releases the linked partitions
        self._side.close()
