"""Standby replicas: warm copies of partitions this worker does not own.

With ``--standby-replicas N`` every partition has up to N standbys, on the workers chosen by
:func:`services.worker.query.members.standby_placement` from the group's membership (each
worker computes the same placement). A standby follows the partition's state topic
(``read_committed``, assign mode: no consumer group) into a store in the worker's own state
directory, at the path the owner's store would have, written exactly as a restore writes
it: rows plus the changelog position and the freshness marker in one batch
(:meth:`services.worker.state.PartitionStore.restore_batch`). So when the partition is
assigned to this worker its restore starts at the standby's position and replays only the
tail; the marker is refreshed while the standby is caught up, so the restore does not take
the copy for an old one and wipe it. A store found there from earlier (this worker owned or
followed the partition before) is first judged by the restore's rule
(:func:`services.worker.restore.outdated`) and rebuilt if it could miss deletes.

Hand-over: :meth:`Standbys.release` runs on the poll thread when the partition is assigned,
before its restore starts: it waits for the batch being applied, withdraws the stale view,
closes the store (RocksDB allows one open instance) and stops following it.

A standby also serves opt-in stale reads (``?stale=true``) with its lag: the records
committed on the state topic that it has not applied yet.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from fifolane.serde.state_records import StateRecord
from services.worker.query.members import Routing
from services.worker.query.views import Views, view_of
from services.worker.restore import mark_source, outdated, source_of
from services.worker.state import PartitionStore, RestoredRow, StoreManager

__all__ = ["Standbys"]

log = logging.getLogger(__name__)

#: records applied per batch (bounds how long a hand-over waits for the batch in flight)
_BATCH = 2_000
#: seconds between freshness-marker refreshes of a caught-up standby
_REFRESH_S = 30.0

ReadState = Callable[[bytes | None, Any], "StateRecord | None"]


class Standbys:
    """The standby stores of one worker and the thread that follows them."""

    def __init__(self, kafka_conf: dict[str, Any], *, worker_id: str, state_topic: str,
                 state_dir: Path, store_name: str, group_index: bool,
                 read_value: Callable[[bytes], tuple[int, str] | None] | None,
                 read_state: ReadState, views: Views,
                 tombstone_retention_ms: Callable[[], int | None] = lambda: None,
                 topic_id: Callable[[str], str | None] = lambda topic: None) -> None:
        self._conf = kafka_conf
        self._topic_id = topic_id  # Kafka's id of the state topic (restore.foreign)
        #: the state topic's delete.retention.ms (known once the worker has connected)
        self._retention = tombstone_retention_ms
        self._me = worker_id
        self._topic = state_topic
        self._stores = StoreManager(state_dir, store_name, cache_mb=16, write_buffer_mb=16,
                                    group_index=group_index, read_value=read_value)
        self._read_state = read_state
        self.views = views
        self._lock = threading.Lock()  # held while a batch is applied, and by release()
        self._owned: set[int] = set()  # partitions this worker owns (never a standby here)
        self._want: set[int] = set()
        self._following: dict[int, int] = {}  # partition -> next offset
        self._refreshed: dict[int, float] = {}
        self._assigned: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        #: records applied by standbys (tests and metrics)
        self.applied = 0

    # -- placement (roster thread) ---------------------------------------------------------------
    def place(self, routing: Routing) -> None:
        """Follow the partitions the placement gives this worker (and it does not own)."""
        want = {p for p in routing.owners if self._me in routing.standbys(p)}
        with self._lock:
            self._want = want - self._owned

    # -- ownership (poll thread) ----------------------------------------------------------------
    def release(self, partition: int) -> None:
        """The partition is now ours: stop following it and close its store before the
        owner's restore opens it."""
        with self._lock:
            self._owned.add(partition)
            self._want.discard(partition)
            self._close(partition)

    def released(self, partitions: list[int]) -> None:
        """Partitions no longer ours (they may become standbys here at the next placement)."""
        with self._lock:
            self._owned.difference_update(partitions)

    def _close(self, partition: int) -> None:
        self.views.withdraw(partition)
        self._following.pop(partition, None)
        self._refreshed.pop(partition, None)
        self._stores.close(partition)

    # -- the follower thread ----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="standbys", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(15)
        with self._lock:
            for p in list(self._following):
                self._close(p)
        self._stores.close_all()

    def following(self) -> list[int]:
        with self._lock:
            return sorted(self._following)

    def _run(self) -> None:
        self._consumer = Consumer({
            **self._conf, "group.id": f"fifolane-standby-{uuid.uuid4().hex[:8]}",
            "client.id": f"{self._me}-standby", "enable.auto.commit": False,
            "isolation.level": "read_committed", "auto.offset.reset": "earliest",
            "enable.partition.eof": True, "fetch.wait.max.ms": 50,
        })
        try:
            while not self._stop.is_set():
                try:
                    self._sync_assignment()
                    self._step()
                except Exception as exc:  # noqa: BLE001 - a standby must not take the worker down
                    log.warning("standby follower: %s", exc)
                    self._stop.wait(1.0)
        finally:
            self._consumer.close()

    def _sync_assignment(self) -> None:
        """Open stores for new standbys, drop the ones given up; (re)assign the consumer."""
        assert self._consumer is not None
        with self._lock:
            new = self._want - set(self._following)
        bounds = self._bounds(new)  # before the lock: the poll thread's release() waits for it
        source = source_of(self._topic, self._topic_id(self._topic)) if bounds else None
        with self._lock:
            for p in list(self._following):
                if p not in self._want:
                    self._close(p)
            for p in self._want - set(self._following):
                if p not in bounds:
                    continue  # its changelog's start and end are not known yet: next turn
                try:
                    store = self._stores.open(p)
                    # A store kept from earlier (this worker owned the partition, or followed it)
                    # is rebuilt by the rule of an owner's restore: deletes it missed may be
                    # compacted away, and a standby's refreshed marker would hide its age.
                    low, high = bounds[p]
                    why = outdated(store, low, self._retention(), high=high, source=source)
                    if why is not None:
                        log.info("standby of partition %d: %s, rebuilding", p, why)
                        store = self._stores.wipe(p)
                    mark_source(store, source)
                except Exception as exc:  # noqa: BLE001 - the owner may still hold it: next turn
                    log.info("standby of partition %d not opened yet: %s", p, exc)
                    continue
                self._following[p] = store.changelog_offset
                self._publish(p, store, store.changelog_offset, lag=-1)
            following = dict(self._following)
        if set(following) != self._assigned:
            self._consumer.assign([TopicPartition(self._topic, p, off) for p, off in following.items()])
            self._assigned = set(following)
            if following:
                log.info("standby of %s partitions %s", self._topic, sorted(following))

    def _bounds(self, partitions: set[int]) -> dict[int, tuple[int, int]]:
        """The state topic's first and end offsets in each partition (those it could ask now)."""
        assert self._consumer is not None
        out = {}
        for p in partitions:
            try:
                out[p] = self._consumer.get_watermark_offsets(TopicPartition(self._topic, p), timeout=10)
            except KafkaException as exc:
                log.info("standby of partition %d: changelog bounds not known now: %s", p, exc)
        return out

    def _step(self) -> None:
        assert self._consumer is not None
        if not self._assigned:
            self._stop.wait(0.2)
            return
        msgs = self._consumer.consume(_BATCH, timeout=0.2)
        rows: dict[int, list[RestoredRow]] = {}
        ends: dict[int, int] = {}
        eof: set[int] = set()
        for msg in msgs:
            err = msg.error()
            p = int(msg.partition() or 0)
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof.add(p)
                    continue
                log.info("standby fetch: %s", err)
                continue
            ends[p] = int(msg.offset() or 0) + 1
            row = self._row(msg)
            if row is not None:
                rows.setdefault(p, []).append(row)
        now = time.monotonic()
        with self._lock:
            for p in set(ends) | eof:
                if p not in self._following:
                    continue  # released meanwhile
                store = self._stores.stores.get(p)
                if store is None:
                    continue
                pos = self._position(p, ends.get(p, self._following[p]))
                batch = rows.get(p, [])
                if batch or pos != self._following[p] or now - self._refreshed.get(p, 0.0) > _REFRESH_S:
                    # At the end (caught up) the marker is refreshed even without records.
                    store.restore_batch(batch, pos)
                    self._refreshed[p] = now
                    self.applied += len(batch)
                self._following[p] = pos
                self._publish(p, store, pos, lag=self._lag(p, pos))

    def _position(self, p: int, after_last: int) -> int:
        """The consumer's position (past commit markers) if known, else after the last record."""
        assert self._consumer is not None
        pos = self._consumer.position([TopicPartition(self._topic, p)])[0].offset
        return max(after_last, pos) if pos >= 0 else after_last

    def _lag(self, p: int, pos: int) -> int:
        assert self._consumer is not None
        try:
            _low, high = self._consumer.get_watermark_offsets(TopicPartition(self._topic, p), cached=True)
        except Exception:  # noqa: BLE001 - not known yet
            return -1
        return max(0, high - pos) if high >= 0 else -1

    def _publish(self, p: int, store: PartitionStore, pos: int, lag: int) -> None:
        self.views.publish(p, view_of(store, pos, lag, standby=True))

    def _row(self, msg: Any) -> RestoredRow | None:
        key, value = msg.key(), msg.value()
        if key is None:
            return None
        state = self._read_state(value, msg.headers())
        if state is None:
            return None
        return (key, state.version, state.deleted, state.group, None if state.deleted else value)
