"""The partitions a worker owns, and how each becomes ready: restore, then process.

A newly assigned partition is paused at once and its store restored on a thread
(:class:`services.worker.restore.Restore`); the worker's other partitions keep flowing. Once
restored (and once the change sink says the listener registry is read far enough), the
partition is sought to its committed offset and resumed: only then are its records taken.
A partition whose restore fails is restored again after a pause; one revoked while it
restores has its restore cancelled.

Two topics are consumed: the input topic (its partitions get a
:class:`services.worker.table.TableApplier`) and the entity directory (its partitions get a
:class:`services.worker.directory.DirectoryApplier`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from fifolane.errors import KafkaClientError
from services.worker.checkpoint import Checkpoint
from services.worker.directory import DirectoryApplier
from services.worker.kafka import WorkerConsumer
from services.worker.metrics import Stats
from services.worker.restore import Restore
from services.worker.sink import ChangeSink
from services.worker.state import StoreManager
from services.worker.table import TableApplier

__all__ = ["Assignment", "Topics"]

log = logging.getLogger(__name__)

_RETRY_S = 2.0  # pause before restoring a partition again after a failed restore
#: How long a restored partition stays paused while its seek to the committed offset fails
#: (librdkafka: _STATE while the partition's fetch state settles); then it resumes anyway.
_SEEK_AGAIN_S = 10.0


@dataclass(frozen=True)
class Topics:
    """The consumed topics: the input, and the entity directory (None: not used)."""

    input: str
    directory: str | None


class Assignment:
    """Owned partitions by state: restoring, restored (waiting for the sink), active."""

    def __init__(self, topics: Topics, consumer: WorkerConsumer, ckpt: Checkpoint, *,
                 stores: StoreManager, directory_stores: StoreManager | None,
                 restore: Callable[[str, int], Restore],
                 make_table: Callable[[int], TableApplier],
                 make_directory: Callable[[int], DirectoryApplier],
                 sink: ChangeSink | None, stats: Stats,
                 on_release: Callable[[str, list[int]], None] | None = None) -> None:
        self.topics = topics
        self._consumer = consumer
        self._ckpt = ckpt
        self._stores = stores
        self._dir_stores = directory_stores
        self._restore = restore
        self._make_table = make_table
        self._make_directory = make_directory
        self._sink = sink
        self._stats = stats
        self._on_release = on_release
        #: active input partitions -> their table (the fast path reads this dict)
        self.tables: dict[int, TableApplier] = {}
        #: active directory partitions
        self.directories: dict[int, DirectoryApplier] = {}
        self.restoring: dict[tuple[str, int], Restore] = {}
        self._retry: dict[tuple[str, int], float] = {}
        self._restored: list[tuple[str, int]] = []
        self._seek_failing: dict[tuple[str, int], float] = {}  # first failed seek before resuming
        self._announced: set[int] = set()

    def send_state(self) -> None:
        """Send the state records the tables' writes hold back (TableApplier.send_unsent):
        after each consumed batch and handler results, and before every commit
        (services.worker.runtime: ``take``, ``poll_once``, ``checkpoint``)."""
        for table in self.tables.values():
            table.send_unsent()

    def resize(self, room: int) -> None:
        """The state topic's limit was read again (services.worker.limits, Limits.refresh):
        every table measures its state records against ``room`` from now on."""
        for table in self.tables.values():
            table.room = room

    # -- rebalance -----------------------------------------------------------------------------
    def assign(self, topic: str, partitions: list[int]) -> None:
        """New partitions (inside the rebalance callback): pause them, restore their stores."""
        tps = [TopicPartition(topic, p) for p in partitions]
        self._consumer.assign_more(tps)
        self._consumer.pause(tps)
        self._ckpt.assign(topic, partitions)
        for p in partitions:
            self._start(topic, p)
        log.info("assigned %s partitions %s: restoring", topic, partitions)

    def revoke(self, topic: str, partitions: list[int]) -> None:
        """Partitions gone (after their last commit, or lost)."""
        for p in partitions:
            task = self.restoring.pop((topic, p), None)
            if task is not None:
                task.cancel()
            self._retry.pop((topic, p), None)
            self._seek_failing.pop((topic, p), None)
            if (topic, p) in self._restored:
                self._restored.remove((topic, p))
            if topic == self.topics.input:
                self.tables.pop(p, None)
                self._stores.close(p)
            elif self._dir_stores is not None:
                self.directories.pop(p, None)
                self._dir_stores.close(p)
        self._ckpt.release(topic, partitions)
        if self._on_release is not None:
            self._on_release(topic, partitions)
        if topic == self.topics.input:
            gone = [p for p in partitions if p in self._announced]
            self._announced.difference_update(partitions)
            if self._sink is not None and gone:
                self._sink.on_release(gone)
        self._stats.assigned, self._stats.assigned_directory = sorted(self.tables), sorted(self.directories)

    def restore_again(self, topic: str, partition: int) -> None:
        """A partition whose local state fell behind (another worker processed it meanwhile)."""
        tp = TopicPartition(topic, partition)
        self._consumer.pause([tp])
        if topic == self.topics.input:
            self.tables.pop(partition, None)
        else:
            self.directories.pop(partition, None)
        self._start(topic, partition)

    def _start(self, topic: str, p: int) -> None:
        self.restoring[(topic, p)] = self._restore(topic, p)

    # -- every turn of the poll loop -----------------------------------------------------------
    def advance(self) -> None:
        """Move finished restores on; activate restored partitions once the sink is ready."""
        now = time.monotonic()
        for key, task in list(self.restoring.items()):
            if not task.finished:
                continue
            del self.restoring[key]
            if task.error is not None:
                self._retry[key] = now + _RETRY_S
            else:
                self._restored.append(key)
        for key, when in list(self._retry.items()):
            if now >= when:
                del self._retry[key]
                self._start(*key)
        if not self._restored:
            return
        if self._sink is not None:
            new = [p for t, p in self._restored if t == self.topics.input and p not in self._announced]
            if new:
                self._announced.update(new)
                self._sink.on_assign(new)
            if not self._sink.ready():
                return
        restored, self._restored = self._restored, []
        for topic, p in restored:
            if not self._activate(topic, p):
                self._restored.append((topic, p))  # its seek failed: again at the next turn
        self._stats.assigned, self._stats.assigned_directory = sorted(self.tables), sorted(self.directories)

    def _activate(self, topic: str, p: int) -> bool:
        """Seek to the committed offset, resume, take it on; False: the seek failed, the
        partition stays paused (a partition resumed without it stalled a worker in CI)."""
        base = self._ckpt.base_of(topic, p)
        tp = TopicPartition(topic, p, OFFSET_BEGINNING if base is None else base)
        try:
            self._consumer.seek(tp)
        except KafkaClientError as exc:
            now = time.monotonic()
            if (topic, p) not in self._seek_failing:
                self._seek_failing[(topic, p)] = now
                log.info("seek %s[%d] before resuming: %s (again at the next turn)", topic, p, exc)
            if now - self._seek_failing[(topic, p)] < _SEEK_AGAIN_S:
                return False
            log.warning("seek %s[%d] before resuming failed for %.0f s: %s; resuming at the consumer's "
                        "position", topic, p, now - self._seek_failing[(topic, p)], exc)
        self._seek_failing.pop((topic, p), None)
        self._consumer.resume([TopicPartition(topic, p)])
        if topic == self.topics.input:
            self.tables[p] = self._make_table(p)
        else:
            self.directories[p] = self._make_directory(p)
        log.info("%s[%d] restored: processing from offset %s", topic, p, base)
        return True

    # -- reporting -----------------------------------------------------------------------------
    @property
    def owned(self) -> list[int]:
        """Input partitions owned in any state."""
        out = set(self.tables) | {p for t, p in self.restoring if t == self.topics.input}
        out |= {p for t, p in self._restored if t == self.topics.input}
        out |= {p for t, p in self._retry if t == self.topics.input}
        return sorted(out)

    def busy(self) -> bool:
        """Whether any partition is still on its way to being processed."""
        return bool(self.restoring or self._restored or self._retry)
