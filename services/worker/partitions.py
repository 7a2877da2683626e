"""How an owned partition gets its parts: its restore, its table, its directory applier.

:class:`PartitionParts` is what :class:`services.worker.assignment.Assignment` calls when a
partition is assigned (restore: the state topic, then the partition's parked groups) and
when it is restored (a :class:`services.worker.table.TableApplier` for an input partition, a
:class:`services.worker.directory.DirectoryApplier` for a directory partition). It also
makes the directory claims of the tables and reads the changelog's end for the restore
markers (:meth:`services.worker.state.StoreManager.apply`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import TopicPartition

from fifolane.config import Settings
from fifolane.errors import KafkaClientError
from fifolane.serde.state_records import StateRecord
from services.worker.assignment import Topics
from services.worker.checkpoint import Checkpoint
from services.worker.clients import KafkaClients
from services.worker.directory import ClaimSender, DirectoryApplier, restored_row
from services.worker.kafka import Record, WorkerConsumer
from services.worker.limits import Limits
from services.worker.metrics import Stats
from services.worker.parking import Parked, Parking, load_parked
from services.worker.restore import Restore, restore_partition
from services.worker.sink import ChangeSink
from services.worker.state import PartitionStore, RestoredRow, StoreManager
from services.worker.table import TableApplier

__all__ = ["PartitionParts"]

log = logging.getLogger(__name__)


class PartitionParts:
    """Makes the parts of owned partitions (see the module docstring)."""

    def __init__(self, *, settings: Settings, topics: Topics, clients: KafkaClients,
                 consumer: WorkerConsumer, ckpt: Checkpoint, stores: StoreManager,
                 directory_stores: StoreManager | None, stats: Stats, limits: Limits,
                 sink: ChangeSink | None, parking: Parking | None,
                 read_state: Callable[[bytes | None, Any], StateRecord | None],
                 wait_open_txn_s: float, tombstone_retention_ms: int | None) -> None:
        self._settings = settings
        self._topics = topics
        self._clients = clients
        self._consumer = consumer
        self._ckpt = ckpt
        self._stores = stores
        self._dir_stores = directory_stores
        self._stats = stats
        self._limits = limits
        self._sink = sink
        self._parking = parking
        self._read_state = read_state
        self._wait = wait_open_txn_s
        self._retention = tombstone_retention_ms
        self._parked: dict[int, dict[str, Parked]] = {}  # read by a restore, not loaded yet
        #: tell the entity directory where an entity lives (in the open transaction)
        self.claim = ClaimSender(topics.directory, ckpt.produce, stats) if topics.directory else None
        self._input_partitions: int | None = None  # known count (topics only grow): input_has

    def restore(self, topic: str, p: int) -> Restore:
        make = self._clients.restore_consumer
        if topic == self._topics.input:
            def run(**kw: Any) -> PartitionStore:
                store = restore_partition({}, self._settings.state_topic, p, self._stores, self._stats,
                                          self._state_row, make_consumer=make, wait_open_txn_s=self._wait,
                                          tombstone_retention_ms=self._retention,
                                          topic_id=self._clients.topic_id, **kw)
                if self._parking is not None:  # before any event of the partition, like its table
                    self._parked[p] = load_parked(
                        make({"group.id": f"fifolane-parked-{p}", "enable.auto.commit": False,
                              "isolation.level": "read_committed"}), self._settings.parked_topic, p)
                return store
            return Restore(run, topic, p)
        stores = self._dir_stores
        assert stores is not None
        until = self._ckpt.base_of(topic, p) or 0  # the directory is its own changelog

        def run_directory(**kw: Any) -> PartitionStore:
            return restore_partition({}, topic, p, stores, self._stats, restored_row, make_consumer=make,
                                     wait_open_txn_s=self._wait, until=until,
                                     topic_id=self._clients.topic_id, **kw)
        return Restore(run_directory, topic, p)

    def make_table(self, p: int) -> TableApplier:
        if self._parking is not None:
            self._parking.load(p, self._parked.pop(p, {}))
        state = self._settings.state_topic
        return TableApplier(self._stores.stores[p], self._ckpt.producer, state_topic=state,
                            room=self._limits.room(state), stats=self._stats, sink=self._sink,
                            claim=self.claim, state_headers=self._settings.state_headers,
                            hold=self._ckpt.eos)

    def make_directory(self, p: int) -> DirectoryApplier:
        assert self._dir_stores is not None and self._topics.directory
        return DirectoryApplier(self._dir_stores.stores[p], self._topics.directory, self._topics.input,
                                self._ckpt.produce, self._stats, input_has=self.input_has)

    def input_has(self, partition: int) -> bool:
        """Whether the input topic has ``partition`` (a move-out's target: a claim naming
        another is forged). Asked of the cluster when the count known does not cover it."""
        if partition < 0:
            return False
        if self._input_partitions is None or partition >= self._input_partitions:
            count = self._consumer.partition_count(self._topics.input, timeout=10)
            if count is None:
                return True  # not known now: sent, and dead-lettered if Kafka refuses it
            self._input_partitions = count
        return partition < self._input_partitions

    def released(self, topic: str, partitions: list[int]) -> None:
        if topic == self._topics.input and self._parking is not None:
            self._parking.drop(set(partitions))
            for p in partitions:
                self._parked.pop(p, None)

    def changelog_end(self, p: int) -> int | None:
        """The state topic's end in partition ``p`` now (None if it cannot be asked now)."""
        try:
            return self._consumer.watermarks(TopicPartition(self._settings.state_topic, p), timeout=10)[1]
        except KafkaClientError as exc:
            log.info("state topic end of partition %d not known now: %s", p, exc)
            return None

    def _state_row(self, msg: Record, raw: bool) -> RestoredRow | None:
        value, key = msg.value(), msg.key()
        if key is None:
            return None
        if raw and value is not None:
            return (key, None, False, "", value)  # read on first use
        state = self._read_state(value, msg.headers())
        if state is None:
            return None  # not written by a fifolane worker: nothing to keep
        return (key, state.version, state.deleted, state.group, None if state.deleted else value)
