"""Consumer-group rebalances: restore before processing, commit before giving partitions up."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaException, TopicPartition

from services.worker.restore import restore_partition

if TYPE_CHECKING:
    from services.worker.runtime import Worker

__all__ = ["Rebalance"]

log = logging.getLogger(__name__)


class Rebalance:
    """The worker's rebalance callbacks (cooperative-sticky: they see only the partitions
    that move). They run on the poll thread, inside ``consume()``."""

    def __init__(self, worker: Worker) -> None:
        self.w = worker

    def on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        w = self.w
        topic = w.settings.input_topic
        stale = [tp for tp in partitions if tp.topic != topic]
        if stale:
            # A static member can be handed the assignment of an earlier incarnation that
            # subscribed to another topic; none of that is ours to process.
            log.warning("ignoring assigned partitions of other topics: %s",
                        [f"{tp.topic}[{tp.partition}]" for tp in stale])
            partitions = [tp for tp in partitions if tp.topic == topic]
        conf = w.settings.kafka_config()
        for tp in partitions:
            # Before any event of the partition: its table must be the committed one.
            restore_partition(conf, w.settings.state_topic, tp.partition, w.stores, w.stats, w.codec,
                              wait_open_txn_s=w.opts.transaction_timeout_ms / 1000 * 2)
            w._assigned.add(tp.partition)
        w.stats.assigned = sorted(w._assigned)
        if w.listeners is not None:
            w.listeners.on_assign(w, [tp.partition for tp in partitions])
        log.info("assigned %s partitions %s", topic, [tp.partition for tp in partitions])

    def on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        if partitions:
            self.w.checkpoint()  # finish and commit in-flight work before giving it up
        self.w._release(partitions)

    def on_lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        w = self.w
        log.warning("partitions lost: %s", [tp.partition for tp in partitions])
        if w._txn_open and w.eos:
            assert w.producer is not None
            try:
                w.producer.abort_transaction(30)
            except KafkaException as exc:
                log.warning("abort after loss: %s", exc)
            w._txn_open = False
            w._rewind()
        w._release(partitions)
