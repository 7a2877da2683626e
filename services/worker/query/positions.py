"""The committed position of an owner's views: which state-topic offset a commit reached.

The worker produces state records without delivery reports (they would cost ~1.4 us a
record), so it does not know their offsets. It learns the position of a commit from the
state topic's last stable offset (LSO, ``read_committed``), asked off the poll thread:

- :class:`CommitTracker` is one of the checkpoint's staged parts (``prepare``/``apply``/
  ``rollback``, services/worker/checkpoint.py). After a commit has been written to
  RocksDB it takes a snapshot of every store that the commit wrote, and counts the
  entities the commit wrote there (at least that many records, plus the commit marker);
- :class:`Resolver` asks the LSO of those partitions. Right after our commit it is exactly
  our commit's end (we are the partition's only writer; the next transaction's records are
  not stable yet), so the view is published with it, unless

  * a commit *started* while the question was on the wire (the answer may count it), or
  * the LSO is below what the commit must have reached (previous position + records +
    marker): its markers are not written yet (a commit returns before they are), or an
    open transaction of another producer holds the LSO back.

  Then it asks again; meanwhile readers keep the previous view. A position is therefore
  never ahead of its snapshot nor behind it.

At-least-once workers have no transactions: the tracker asks the high watermark at once,
on the poll thread, when the commit's records are flushed and none of the next is sent yet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from services.worker.query.views import View, Views, view_of
from services.worker.state import StoreManager

__all__ = ["CommitTracker", "Resolver"]

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    view: View  # its position is not known yet
    records: int  # at least this many records written since the published position
    commits: int  # commits that wrote them (one marker each)


class Resolver:
    """Publishes owners' views once their position is known (see the module docstring)."""

    def __init__(self, kafka_conf: dict[str, Any], state_topic: str, views: Views, *,
                 transactional: bool) -> None:
        self._conf = kafka_conf
        self._admin: AdminClient | None = None  # made at start()
        self._topic = state_topic
        self._views = views
        self._eos = transactional
        self._lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        #: commits started so far (a question asked across a commit start is not trusted)
        self.started = 0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._admin = AdminClient({**self._conf, "client.id": "fifolane-query-positions"})
        self._thread = threading.Thread(target=self._run, name="query-positions", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._thread is None or not self._thread.is_alive():
            self._admin = None  # destroyed now, not at the interpreter's exit (fifolane.cli)

    def committing(self) -> None:
        """A commit is about to start (poll thread)."""
        self.started += 1

    def applied(self, partition: int, view: View, records: int) -> None:
        """A commit that wrote ``records`` entities to ``partition`` is in RocksDB (``view``,
        its position still unknown)."""
        with self._lock:
            old = self._pending.get(partition)
            self._pending[partition] = _Pending(
                view, records + (old.records if old else 0), 1 + (old.commits if old else 0))
        if self._eos:
            self._wake.set()

    def touched(self, partition: int, store: Any) -> None:
        """The store was written without entity rows (a checkpoint that wrote only meta keys,
        as StoreManager.apply once did with its restore marker): the view's snapshot is
        taken again at the same position, so a scan, which needs the store unchanged since
        its view's snapshot, finds it so."""
        seq = store.db.latest_sequence_number()
        with self._lock:
            pend = self._pending.get(partition)
            if pend is not None:
                if pend.view.seq != seq:
                    pend.view = view_of(store, -1)
                return
            view = self._views.get(partition)
            if view is not None and view.seq != seq:
                self._views.publish(partition, view_of(store, view.position))

    def drop(self, partition: int) -> None:
        with self._lock:
            self._pending.pop(partition, None)

    def resolve_now(self) -> None:
        """At-least-once: ask now (poll thread, nothing of the next commit produced yet)."""
        self._resolve(check_started=False)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            while not self._stop.is_set() and self._pending:
                if self._resolve(check_started=True):
                    break
                self._stop.wait(0.002)

    def _resolve(self, *, check_started: bool) -> bool:
        """One question for every pending partition; True when none is left pending."""
        with self._lock:
            todo = dict(self._pending)
        if not todo:
            return True
        started = self.started
        try:
            lso = self._stable_offsets(list(todo))
        except KafkaException as exc:
            log.info("state topic offsets not known now: %s", exc)
            return False
        if check_started and self.started != started:
            return False  # a commit started meanwhile: the answer may include it
        for p, pend in todo.items():
            base = self._views.position(p)
            got = lso.get(p)
            if base is None or got is None:
                continue
            need = base + pend.records + (pend.commits if self._eos else 0)
            if got < need:
                continue
            with self._lock:  # (touched() replaces a pending view's snapshot under this lock)
                if self._pending.get(p) is not pend:
                    continue  # a newer commit (or a revoke) replaced it
                del self._pending[p]
                self._views.publish(p, pend.view._replace(position=got))
        return not self._pending

    def _stable_offsets(self, partitions: list[int]) -> dict[int, int]:
        specs = {TopicPartition(self._topic, p): OffsetSpec.latest() for p in partitions}  # type: ignore[no-untyped-call]
        assert self._admin is not None
        futures = self._admin.list_offsets(specs, isolation_level=IsolationLevel.READ_COMMITTED,
                                           request_timeout=10)
        out: dict[int, int] = {}
        for tp, fut in futures.items():
            out[tp.partition] = int(fut.result().offset)
        return out


class CommitTracker:
    """The checkpoint's staged part that hands each commit's snapshots to the resolver
    (listed after the stores, so it runs once they are written)."""

    def __init__(self, stores: StoreManager, resolver: Resolver, active: Callable[[int], bool],
                 *, transactional: bool) -> None:
        self._stores = stores
        self._resolver = resolver
        self._active = active
        self._eos = transactional

    def prepare(self) -> object:
        """Entities written per partition by the commit under way (overlays are intact)."""
        return {p: len(s.overlay) for p, s in self._stores.stores.items() if s.overlay}

    def apply(self, prepared: object) -> None:
        assert isinstance(prepared, dict)
        for p, store in list(self._stores.stores.items()):
            if not self._active(p):
                continue
            if p in prepared:
                self._resolver.applied(p, view_of(store, -1), prepared[p])
            else:
                self._resolver.touched(p, store)
        if prepared and not self._eos:
            self._resolver.resolve_now()

    def rollback(self) -> None:
        """Nothing was written."""
