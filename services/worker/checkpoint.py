"""The worker's transaction: what it produced, the input offsets it covers, commit and rewind.

A :class:`Checkpoint` owns the producer and the open transaction. The worker's poll loop
asks it to :meth:`~Checkpoint.open` one before taking records, produces through it, tells it
which input offsets it consumed, and asks it to :meth:`~Checkpoint.commit` once every
consumed event is processed, superseded or dead-lettered. A commit:

1. sends the input offsets with the transaction (exactly-once), for *every* assigned
   partition, so a worker that lost its partitions (a zombie) is fenced by the group even in
   a transaction that consumed nothing (listener snapshots, housekeeping);
2. builds the RocksDB batches of the staged writes while the commit is on the wire;
3. commits (exactly-once), or flushes and then commits the offsets (at-least-once);
4. writes the batches to RocksDB, so local state is never ahead of the changelog.

Anything that fails aborts and rewinds (:meth:`~Checkpoint.abort`): staged writes are
dropped and *every* assigned partition is sought back to its committed offset, also those
whose records were consumed but not yet taken when the failure hit. A producer that became
unusable (fatal error, a call hung past the watchdog) is replaced. When the failure leaves it
open whether the transaction committed (the commit timed out on the client), the committed
offsets decide: the broker's word, not the client's.

A transaction that fails because Kafka refuses one of its records (too large, invalid for
its topic) would fail again on every replay: unless the topics' limits read again explain it,
the checkpoint bisects its transactions (:mod:`services.worker.bisect`) to find the input record,
with no backoff between these aborts (each one gets nearer to it; the commit learns of a refused
record quickly: :func:`services.worker.txn.commit_producer`). After such an abort the producer is
replaced: librdkafka may drop the records queued behind the refused one without bumping the
producer epoch, and the next transaction to write that partition failed on the sequence gap
(OUT_OF_ORDER_SEQUENCE_NUMBER). docs/architecture.md follows one event through these steps.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, Protocol

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from fifolane.errors import (
    KafkaClientError,
    ProducerFatalError,
    TransactionAbortedError,
)
from services.worker.bisect import Bisection
from services.worker.kafka import SEND_FAILED, TxnProducer, WorkerConsumer
from services.worker.metrics import Stats
from services.worker.txn import Background, commit_producer
from services.worker.window import Source

__all__ = ["Checkpoint", "Outcome", "Source", "Staged"]

log = logging.getLogger(__name__)

#: seconds a transactional call may take (resumed while retriable) before the checkpoint
#: gives up on it and aborts
CALL_TIMEOUT = 30.0
#: errors of a transaction whose offsets the consumer group refused: we missed a rebalance
_GROUP_FENCING = frozenset({"ILLEGAL_GENERATION", "UNKNOWN_MEMBER_ID", "FENCED_INSTANCE_ID", "REBALANCE_IN_PROGRESS"})


class Staged(Protocol):
    """Local state written only after its transaction commits (the RocksDB stores)."""

    def prepare(self) -> object: ...
    def apply(self, prepared: object) -> None: ...
    def rollback(self) -> None: ...


class Outcome(NamedTuple):
    """How a commit ended. ``stale``: partitions whose committed offset moved past ours
    without us (another owner processed them): their local state must be restored again."""

    committed: bool
    stale: tuple[tuple[str, int], ...] = ()


_DONE = Outcome(True)


class Checkpoint:
    """The open transaction of a worker (see the module docstring)."""

    def __init__(self, producer: TxnProducer, consumer: WorkerConsumer, staged: Iterable[Staged], *,
                 eos: bool, stats: Stats, stop: threading.Event | None = None, reread_limits: Callable[[], object] | None = None) -> None:
        self.producer = producer
        self.consumer = consumer
        self.eos = eos
        self.stats = stats
        self._staged = list(staged)
        self._stop = stop or threading.Event()
        self.sources: dict[str, Source] = {}
        self.is_open = False
        self.bisection = Bisection(producer, reread_limits)  # reread_limits: see bisect.py
        self.taken = 0  # input records taken into the open transaction
        #: per (topic, partition) of the commit under way: (offset committed, position)
        self._points: dict[tuple[str, int], tuple[int, int]] = {}
        self._last: tuple[str, int, int] | None = None
        self._failures = 0  # consecutive failed checkpoints (backoff)

    # -- assignment ----------------------------------------------------------------------------
    def add_source(self, topic: str) -> Source:
        return self.sources.setdefault(topic, Source(topic))

    def assign(self, topic: str, partitions: list[int]) -> None:
        """Partitions now ours: their committed offsets are where a rewind goes back to."""
        src = self.add_source(topic)
        try:
            got = self.consumer.committed([TopicPartition(topic, p) for p in partitions], 10.0)
        except KafkaClientError as exc:  # looked up again at the next rewind
            log.info("committed offsets of %s %s not known yet: %s", topic, partitions, exc)
            return
        for p in partitions:
            src.known(p, got.get((topic, p), (None, None)))

    def base_of(self, topic: str, partition: int) -> int | None:
        """The committed offset of an assigned partition (None: nothing committed yet),
        asked of the group coordinator if not known (waits while it cannot answer)."""
        src = self.add_source(topic)
        if partition not in src.base:
            got = self._committed_offsets([TopicPartition(topic, partition)])
            src.known(partition, got.get((topic, partition), (None, None)))
        return src.base[partition]

    def release(self, topic: str, partitions: Iterable[int]) -> None:
        src = self.sources.get(topic)
        if src is not None:
            for p in partitions:
                src.base.pop(p, None)
                src.next.pop(p, None)
                src.windows.pop(p, None)

    # -- the open transaction ------------------------------------------------------------------
    def open(self) -> None:
        """Begin a transaction unless one is open."""
        if not self.is_open:
            if self.eos:
                self.producer.begin()
            self.is_open = True
            self.taken = 0
            self._last = None

    def produce(self, topic: str, value: bytes | str | None, key: bytes | str | None,
                partition: int = -1, headers: Any = None) -> None:
        """Send a record in the open transaction (opened if needed)."""
        if not self.is_open:
            self.open()
        try:  # the client's own produce (the per-notification path); if it cannot, the one
            if headers is None:  # that waits, maps errors. Even headers=None costs 0.4 us (of 0.9).
                self.producer.send(topic, value, key, partition)
            else:
                self.producer.send(topic, value, key, partition, headers=headers)
        except SEND_FAILED as exc:
            self.producer.produce(topic, value, key, partition, headers, full=type(exc) is BufferError)

    def consumed(self, topic: str, partition: int, offset: int) -> None:
        """An input record was taken into the open transaction."""
        self.sources[topic].next[partition] = offset + 1
        self.taken += 1
        self._last = (topic, partition, offset)

    def consumed_batch(self, topic: str, nexts: dict[int, int], count: int,
                       last: tuple[str, int, int] | None) -> None:
        """Many input records were taken (``nexts``: partition -> offset after the last)."""
        mine = self.sources[topic].next
        for p, n in nexts.items():
            if n > mine.get(p, -1):
                mine[p] = n
        self.taken += count
        if last is not None:
            self._last = last

    def room(self) -> int | None:
        """How many more input records this transaction may take (None: no limit)."""
        return self.bisection.room(self.taken)

    def poison_of(self, topic: str, partition: int, offset: int) -> str | None:
        """Why Kafka refused this input record's output, if it did (dead-lettered: :meth:`poison_settled`)."""
        return self.bisection.poison_of((topic, partition, offset))

    def poison_settled(self, topic: str, partition: int, offset: int) -> None:
        """A poisoned record was dead-lettered in the open transaction."""
        self.bisection.dead_lettered((topic, partition, offset))

    @property
    def bisecting(self) -> bool:
        return self.bisection.active

    # -- commit --------------------------------------------------------------------------------
    def commit(self, group_metadata: Callable[[], Any] | None = None, wait: bool = True) -> Outcome:
        """Commit the open transaction with its input offsets (module docstring, steps 1-4);
        on failure abort and rewind. Call with nothing in flight. ``wait=False``: at-least-once
        offsets are sent, not waited for (benchmarks/README.md, "Offsets not waited for")."""
        if not self.is_open:
            return _DONE
        offsets = self._offsets()
        prepared: list[object] | None = None
        try:
            gm = (group_metadata or self.consumer.group_metadata)() if self.eos and offsets else None
            call = Background(commit_producer, self.producer, self.eos, offsets, gm, CALL_TIMEOUT)
            prepared = [s.prepare() for s in self._staged]  # while the commit waits without the GIL
            call.wait()
        except KafkaClientError as exc:
            return self._recover(exc, during_commit=True, prepared=prepared)
        if not self.eos and offsets:
            try:
                self.consumer.commit(offsets, wait)
            except KafkaClientError as exc:  # the events may be seen again
                log.warning("offset commit failed (events may be redelivered): %s", exc)
        self._committed(prepared)
        return _DONE

    def _offsets(self) -> list[TopicPartition]:
        """What to commit per partition: its completed prefix (services.worker.window), with
        the offsets finished after it in the metadata. Remembered as the commit's points."""
        self._points = {}
        out = []
        for src in self.sources.values():
            for p, (off, nxt, meta) in src.commit_points().items():
                self._points[(src.topic, p)] = (off, nxt)
                out.append(TopicPartition(src.topic, p, off, metadata=meta) if meta
                           else TopicPartition(src.topic, p, off))
        return out

    # -- the window of unfinished events -------------------------------------------------------
    def track(self, topic: str, partition: int, offset: int) -> None:
        """An event of this input record is queued: unfinished until :meth:`untrack`."""
        self.sources[topic].window(partition).track(offset)

    def untrack(self, topic: str, partition: int, offset: int) -> None:
        win = self.sources[topic].windows.get(partition)
        if win is not None and offset in win.unfinished:
            win.untrack(offset)

    def replayed(self, topic: str, partition: int, offset: int) -> int:
        """1: a replayed record's effects are committed; 2: it was counted as consumed; 0: neither."""
        win = self.sources[topic].windows.get(partition)
        return 0 if win is None else win.replayed(offset)

    def skipping(self, topic: str) -> set[int]:
        """Partitions with replayed records to skip (the fast path leaves them to the general path)."""
        src = self.sources.get(topic)
        return {p for p, w in src.windows.items() if w.skip or w.counted} if src is not None else set()

    def needs_drain(self) -> bool:
        """Whether unfinished events span more than a commit's metadata can describe."""
        return any(w.wide(src.next.get(p, 0)) for src in self.sources.values() for p, w in src.windows.items())

    def _committed(self, prepared: list[object] | None) -> None:
        if prepared is None:
            prepared = [s.prepare() for s in self._staged]
        for s, batch in zip(self._staged, prepared, strict=True):
            s.apply(batch)
        for (topic, p), (off, nxt) in self._points.items():
            src = self.sources[topic]
            if p in src.base or p in src.next:
                src.base[p] = off
                win = src.windows.get(p)
                if win is not None:
                    win.committed(off, nxt)
        self._points = {}
        self.is_open = False
        self._failures = 0
        self.taken = 0
        self.bisection.committed(lambda topic, p: self.sources[topic].base.get(p) if topic in self.sources else None)
        self.stats.committed()

    # -- failure -------------------------------------------------------------------------------
    def abort(self, exc: KafkaClientError) -> Outcome:
        """Give up the open transaction after ``exc`` and rewind (see :meth:`_recover`)."""
        return self._recover(exc, during_commit=False)

    def _recover(self, exc: KafkaClientError, *, during_commit: bool,
                 prepared: list[object] | None = None) -> Outcome:
        """Abort, replacing the producer if it is unusable, then rewind every partition to
        its committed offset. ``during_commit``: the failure hit the commit itself, so the
        transaction may have committed on the broker after all: the committed offsets tell."""
        self.stats.aborts += 1
        log.warning("%s, replaying the input since the last checkpoint: %s",
                    "aborting the transaction" if self.eos else "records not delivered", exc)
        if self.eos and self.is_open:  # (partitions lost after a commit: nothing is open)
            exc = self._cause(exc)
        if not exc.refused or not self.taken:  # refused: no backoff, unless no input is to blame (bisect.py)
            self._backoff()
        # A commit refused as a whole did not commit; a time-out or a fatal error during the
        # commit leaves it open. Group fencing (a rebalance we missed) means our partitions
        # may have moved on without us: look at the committed offsets then too.
        in_doubt = during_commit and self.eos and (
            not isinstance(exc, TransactionAbortedError) or exc.code in _GROUP_FENCING)
        if self.eos and self.is_open:
            if isinstance(exc, ProducerFatalError):
                self._renew(exc)
            else:
                try:
                    self.producer.abort(CALL_TIMEOUT)
                except KafkaClientError as abort_exc:
                    self._renew(abort_exc)
                else:
                    if exc.refused:  # its sequence numbers (see the module docstring)
                        self._renew(exc)
        outcome = self._resolve(in_doubt)
        self.is_open = False
        count, self.taken = self.taken, 0
        if outcome.committed:
            self._committed(prepared if prepared is not None else [s.prepare() for s in self._staged])
            return outcome
        for s in self._staged:
            s.rollback()
        self.stats.rolled_back()
        ends = {(s.topic, p): n for s in self.sources.values() for p, n in s.next.items()}  # before the rewind
        self._rewind()
        self.bisection.failed(exc, count, self._last, ends)
        return outcome

    def _cause(self, exc: KafkaClientError) -> KafkaClientError:
        """Why the open transaction failed. librdkafka refuses every record of a failed
        transaction with _STATE; its commit returns the error that failed it (a record Kafka
        refused, say) before it does anything else. Asked only then: a produce refused with
        _STATE means the transaction is not open for records (so not for a commit either)."""
        if exc.code != "_STATE" or exc.abortable or exc.fatal:
            return exc
        try:
            self.producer.commit(0.0)
        except KafkaClientError as cause:
            return cause if cause.abortable or cause.fatal else exc
        return exc

    def _renew(self, exc: KafkaClientError) -> None:
        """A new producer with our transactional id (fences the old one and settles its
        transaction); waits, with backoff, until the coordinator answers."""
        log.warning("starting a new producer (%s)", exc)
        self.producer.renew()
        while not self._stop.is_set():
            try:
                self.producer.init()
                return
            except ProducerFatalError as init_exc:
                log.warning("new producer failed (%s): trying another", init_exc)
                self.producer.renew()
            except KafkaClientError as init_exc:
                log.warning("init_transactions: %s; waiting", init_exc)
            self._backoff()

    def _resolve(self, in_doubt: bool) -> Outcome:
        """Whether the failed transaction committed after all; refreshes the committed
        offsets (rewind targets) that are unknown, or all of them when in doubt."""
        todo = [TopicPartition(src.topic, p) for src in self.sources.values()
                for p in set(src.base) | set(src.next) if in_doubt or p not in src.base]
        if not todo:
            return Outcome(False)
        try:  # raises only when stopping (the consumer closed as a rebalance failed the commit):
            committed = self._committed_offsets(todo)  # not committed then, safely (state waits)
        except KafkaClientError as exc:
            log.info("stopping: the failed transaction's offsets are not read (%s)", exc)
            return Outcome(False)
        took = [(t, p, off) for (t, p), (off, _nxt) in self._points.items()
                if off != self.sources[t].base.get(p, -1)]
        if in_doubt and took and all(committed.get((t, p), (None, None))[0] == off for t, p, off in took):
            log.warning("the transaction committed after all (its commit timed out here): kept")
            return Outcome(True)
        stale = []
        for (t, p), found in committed.items():
            src = self.sources[t]
            if p in src.base and src.base[p] is not None and found[0] != src.base[p]:
                stale.append((t, p))  # someone else committed past our base
            src.known(p, found)
        if stale:
            log.warning("partitions %s were processed by another worker meanwhile", stale)
        return Outcome(False, tuple(stale))

    def _committed_offsets(self, tps: list[TopicPartition]) -> dict[tuple[str, int], tuple[int | None, str | None]]:
        while True:
            try:
                return self.consumer.committed(tps, CALL_TIMEOUT)
            except KafkaClientError as exc:
                if self._stop.is_set():
                    raise
                log.warning("committed offsets not readable now (%s): waiting", exc)
                self._backoff()

    def _rewind(self) -> None:
        """Seek every assigned partition back to its committed offset."""
        for src in self.sources.values():
            for p in set(src.base) | set(src.next):
                base = src.base.get(p)
                tp = TopicPartition(src.topic, p, OFFSET_BEGINNING if base is None else base)
                try:
                    self.consumer.seek(tp)
                except KafkaClientError as exc:  # not assigned any more: nothing to replay
                    log.info("rewind of %s[%d]: %s", src.topic, p, exc)
            src.next.clear()
            for win in src.windows.values():
                win.rewound()  # the calls in flight were forgotten: replayed

    def _backoff(self) -> None:
        """Wait longer after each consecutive failure, at most 5 s (no hot loop of aborts)."""
        if self._failures:
            self._stop.wait(min(5.0, 0.1 * 2 ** min(self._failures, 6)))
        self._failures += 1
