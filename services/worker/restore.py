"""Restore a partition's RocksDB from its compacted changelog, in the background.

A partition assigned to the worker is paused until its store is restored; the worker's other
partitions keep flowing meanwhile (no long transaction, no stalled poll loop). :class:`Restore`
runs :func:`restore_partition` on a thread and reports its progress.

Which changelog records a restore replays:

- from the offset stored with the local state (0 for a new store), to the committed end
  of the changelog, or to ``until`` (the directory, whose changelog is also its input);
- a store is wiped and rebuilt from the start when it was built from another changelog (its
  ``m:source``, the topic's name and Kafka's topic id, names another: the topic was deleted
  and created again, renamed with ``FIFOLANE_STATE_TOPIC``, or the cluster was replaced, as
  ``fifolane kafka up --fresh`` does), when its offset lies beyond the changelog's end (the
  same, for a store written before ``m:source`` existed) or before its start (data deleted
  by retention), or when tombstones written since the store was last
  consistent with the changelog could have been compacted away: a tombstone is kept
  ``delete.retention.ms`` after the cleaner first sees it, so a store last written longer
  ago than half that (``tombstone_retention_ms``) may miss a delete made by another owner
  meanwhile and would resurrect the entity;
- only committed records (``read_committed``), so no half-written transaction reaches the
  table.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from services.worker.kafka import Record, map_error
from services.worker.metrics import Stats
from services.worker.state import PartitionStore, RestoredRow, StoreManager

__all__ = ["Restore", "RowReader", "foreign", "mark_source", "outdated", "restore_partition", "source_of"]

log = logging.getLogger(__name__)

#: A changelog record as a row for :meth:`PartitionStore.restore_batch`, or None to skip it.
RowReader = Callable[[Record, bool], "RestoredRow | None"]


@dataclass
class Progress:
    """How far a restore is: records replayed of those to replay."""

    done: int = 0
    total: int = 0


#: The store's meta key naming the changelog it was built from (``source_of``).
_META_SOURCE = b"m:source"


def source_of(topic: str, topic_id: str | None) -> bytes | None:
    """What a store built from ``topic`` records as its source (None: the id is not known:
    not recorded, not compared). Kafka gives a topic deleted and created again a new id."""
    return None if not topic_id else f"{topic}\x00{topic_id}".encode()


def mark_source(store: PartitionStore, source: bytes | None) -> None:
    """Record the changelog ``store`` is consistent with (after :func:`outdated` said so)."""
    if source is not None and store.db.get(_META_SOURCE) != source:
        store.db.put(_META_SOURCE, source)


def _named(source: bytes) -> str:
    topic, _, topic_id = source.decode(errors="replace").partition("\x00")
    return f"topic {topic!r} (id {topic_id})"


def foreign(store: PartitionStore, high: int | None, source: bytes | None) -> str | None:
    """Why the local state of a store belongs to another changelog than the one that ends
    at ``high`` with ``source`` (:func:`source_of`); None: as far as can be told, it does not."""
    kept = store.db.get(_META_SOURCE)
    if source is not None and kept is not None and kept != source:
        return (f"local state was built from {_named(kept)}, not from this changelog, {_named(source)}: "
                "the topic was deleted and created again, or the cluster was replaced")
    if high is not None and store.changelog_offset > high:
        return (f"local state is ahead of the changelog's end (offset {store.changelog_offset}, the end "
                f"{high}): the topic was deleted and created again, or the cluster was replaced")
    return None


def outdated(store: PartitionStore, low: int, tombstone_retention_ms: int | None, *,
             high: int | None = None, source: bytes | None = None) -> str | None:
    """Why the local state of a store cannot be brought up to its changelog by replaying
    from its own offset (None: it can), given the changelog's start ``low``, its end
    ``high`` and its ``source`` (:func:`foreign`); see the module docstring. The standbys
    (services/worker/query/standby.py) follow the same rule."""
    why = foreign(store, high, source)
    if why is not None:
        return why
    if store.changelog_offset < low:
        return "local state predates the changelog start"
    written = store.written_at_ms
    if (tombstone_retention_ms is not None and not store.is_empty()
            and (written is None or time.time() * 1000 - written > tombstone_retention_ms / 2)):
        return (f"local state is older than half the tombstone retention ({tombstone_retention_ms} ms): "
                "deletes made since may be compacted away")
    return None


def restore_partition(kafka_conf: dict[str, Any], topic: str, partition: int, stores: StoreManager,
                      stats: Stats, read: RowReader, *, batch: int = 5_000,
                      wait_open_txn_s: float = 30.0, until: int | None = None,
                      tombstone_retention_ms: int | None = None,
                      progress: Progress | None = None,
                      cancelled: Callable[[], bool] = lambda: False,
                      make_consumer: Callable[[dict[str, Any]], Any] = Consumer,
                      topic_id: Callable[[str], str | None] | None = None) -> PartitionStore:
    """Bring the local store of ``partition`` up to its changelog (see the module docstring).

    ``read(msg, raw)``: the row a changelog record gives (``raw``: the store keeps values
    unread, see :class:`PartitionStore`). ``topic_id(topic)``: Kafka's id of the topic
    (None: not known now), to tell a store built from an earlier topic of the same name.
    """
    progress = progress or Progress()
    store = stores.open(partition)
    conf = {
        **kafka_conf,
        "group.id": f"fifolane-restore-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        # Partitions restore at the same time, a consumer each: what one fetches and queues
        # ahead is kept small (librdkafka's defaults, 64 MB of queue and 16 MB fetches per
        # consumer, made six restores of 1,000,000 entities peak at 587 MB RSS; with these
        # and 5,000-record batches, 398 MB at the same speed: benchmarks/results/restore.json).
        "fetch.max.bytes": 4 << 20,
        "max.partition.fetch.bytes": 4 << 20,
        "queued.max.messages.kbytes": 8 << 10,
        # At the end of a transactional changelog (its last offsets are commit markers, never
        # delivered) the end-of-partition event comes with an empty fetch: do not let the
        # broker hold that one for the default 500 ms.
        "fetch.wait.max.ms": 20,
    }
    consumer = make_consumer(conf)
    try:
        tp = TopicPartition(topic, partition)
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=30)
        except KafkaException as exc:
            raise map_error(exc, f"restore of {topic}[{partition}]") from exc
        source = source_of(topic, topic_id(topic)) if topic_id is not None else None
        why = foreign(store, high, source)  # a mistake somewhere: warned
        level = logging.WARNING if why is not None else logging.INFO
        why = why or outdated(store, low, tombstone_retention_ms)
        if until is not None:
            high = min(high, until)
        start = store.changelog_offset
        if why is not None:
            log.log(level, "%s[%d]: %s, rebuilding", topic, partition, why)
            store = stores.wipe(partition)
            start = low
        mark_source(store, source)
        if start >= high:
            return store
        todo = high - start
        progress.total = todo
        stats.restoring += 1
        stats.restore_total += todo
        try:
            _replay(consumer, store, topic, partition, start, high, low, read, batch,
                    wait_open_txn_s, progress, stats, cancelled)
        finally:
            stats.restoring -= 1
        return store
    finally:
        consumer.close()


def _replay(consumer: Consumer, store: PartitionStore, topic: str, partition: int, start: int,
            high: int, low: int, read: RowReader, batch: int, wait_open_txn_s: float,
            progress: Progress, stats: Stats, cancelled: Callable[[], bool]) -> None:
    t0 = last_log = time.monotonic()
    done = 0
    tp = TopicPartition(topic, partition)
    consumer.assign([TopicPartition(topic, partition, start)])
    next_offset = start
    fresh = start == low and store.is_empty()
    # Without a group index the group of an upsert is not needed now: keep values raw.
    raw = not store.group_index and store.read_value is not None
    # ``high`` counts records of transactions still open (say, of a worker that was
    # killed): keep reading until the position passes it, so a transaction that the
    # coordinator still commits is not missed. Bounded by the transaction timeout.
    deadline = time.monotonic() + wait_open_txn_s
    at_end = False
    while not at_end:
        if cancelled():
            raise _Cancelled
        rows: list[RestoredRow] = []
        append = rows.append
        # consume() returns when it has that many records or at the timeout: do not ask for
        # more than are left (a transactional changelog has fewer, since commit markers take
        # offsets too; then the timeout ends the last batch).
        msgs: list[Any] = consumer.consume(max(1, min(batch, high - next_offset)), timeout=0.1)
        eof = False
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof = True
                    continue
                raise map_error(err, f"restore of {topic}[{partition}]")
            offset = msg.offset()
            if offset is None or offset >= high:
                at_end = True
                break
            next_offset = offset + 1
            row = read(msg, raw)
            if row is not None:  # else not written by a fifolane worker: nothing to keep
                append(row)
        if next_offset >= high:
            at_end = True  # the last record is in: no need to wait for the end-of-partition event
        elif eof or len(msgs) < batch:
            pos = consumer.position([tp])[0].offset
            if pos >= 0:
                next_offset = max(next_offset, min(pos, high))
            at_end = next_offset >= high or time.monotonic() > deadline
        if rows or at_end:
            store.restore_batch(rows, next_offset, fresh=fresh)
            done += len(rows)
            stats.restored_records += len(rows)
        progress.done = next_offset - start
        now = time.monotonic()
        if now - last_log > 2:
            log.info("restoring %s[%d]: %d/%d records", topic, partition, next_offset - start, high - start)
            last_log = now
    log.info("restored %s[%d]: %d records in %.2fs", topic, partition, done, time.monotonic() - t0)


class _Cancelled(Exception):
    """The partition was revoked while it restored."""


class Restore:
    """One partition's restore on a thread: poll :attr:`finished`, then :meth:`result`."""

    def __init__(self, run: Callable[..., PartitionStore], topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.progress = Progress()
        self.error: BaseException | None = None
        self._cancel = threading.Event()
        self._done = threading.Event()
        self._run = run
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._main, name=f"restore-{topic}-{partition}", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        try:
            self._run(progress=self.progress, cancelled=self._cancel.is_set)
        except _Cancelled:
            pass
        except BaseException as exc:  # reported by result(); the worker retries
            self.error = exc
            log.warning("restore of %s[%d] failed: %s", self.topic, self.partition, exc)
        finally:
            self._done.set()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def cancel(self) -> None:
        """Stop (the partition was revoked) and wait for the thread."""
        self._cancel.set()
        self._done.wait(60)
