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

When the offsets cannot be asked (Kafka unreachable, or an admin client that lived through a
broker restart: librdkafka 2.16's keeps the partition's old leader epoch and is answered
FENCED_LEADER_EPOCH for good, ``test_query_outage``), the resolver backs off, makes a new
admin client, and once a commit has waited ``stale_after_s`` for its position it marks the
partition's view stale (:meth:`services.worker.query.views.Views.mark_stale`): reads then
answer ``unavailable`` rather than "not found" for what the store holds and the view does not.

At-least-once workers have no transactions: the tracker asks the high watermark at once,
on the poll thread, when the commit's records are flushed and none of the next is sent yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from services.worker.query.views import View, Views, view_of
from services.worker.state import StoreManager

__all__ = ["STALE_AFTER_S", "CommitTracker", "Resolver"]

log = logging.getLogger(__name__)

#: how long a commit's position may stay unknown before its partition's view is stale
STALE_AFTER_S = 5.0
#: failing questions: the pause after one (doubling up to the most), and how long they may
#: fail before the admin client is made anew
_BACKOFF_S = (0.05, 1.0)
_RENEW_AFTER_S = 2.0
#: errors after which the admin client's metadata is not trusted (made anew at once)
_STALE_METADATA = {KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH,
                   KafkaError.NOT_LEADER_FOR_PARTITION}


@dataclass
class _Pending:
    view: View  # its position is not known yet
    records: int  # at least this many records written since the published position
    commits: int  # commits that wrote them (one marker each)
    since: float  # when the first of them was applied (monotonic)


class Resolver:
    """Publishes owners' views once their position is known (see the module docstring)."""

    def __init__(self, kafka_conf: dict[str, Any], state_topic: str, views: Views, *,
                 transactional: bool, stale_after_s: float = STALE_AFTER_S) -> None:
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
        self.stale_after_s = stale_after_s
        self.renewals = 0  # admin clients made anew (their questions kept failing)
        self._failing_since: float | None = None  # when the questions started failing
        self._failures = 0
        self._last_error = ""
        self._logged = 0.0
        self._renewed = float("-inf")

    def _new_admin(self) -> AdminClient:
        return AdminClient({**self._conf, "client.id": "fifolane-query-positions"})

    def start(self) -> None:
        self._admin = self._new_admin()
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
                view, records + (old.records if old else 0), 1 + (old.commits if old else 0),
                old.since if old else time.monotonic())
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
                self.check_stale()
                self._stop.wait(self._pause())

    def _pause(self) -> float:
        """Before the next question: 2 ms while the answers come, backing off while they fail."""
        if not self._failures:
            return 0.002
        low, high = _BACKOFF_S
        return float(min(high, low * 2 ** min(self._failures - 1, 10)))

    def check_stale(self, now: float | None = None) -> None:
        """Mark the views of partitions whose oldest unresolved commit waited too long."""
        now = time.monotonic() if now is None else now
        with self._lock:
            late = [(p, now - pend.since) for p, pend in self._pending.items()
                    if now - pend.since >= self.stale_after_s]
        for p, waited in late:
            if self._views.stale(p) is None:
                what = (f"last {waited:.0f} s of commits is not known"
                        + (f" (state topic offsets: {self._last_error})" if self._last_error else ""))
                log.warning("partition %d: reads answer 'unavailable' until the position of the %s", p, what)
                self._views.mark_stale(p, "the position of its " + what)

    def _failed(self, exc: KafkaException) -> None:
        """A question failed: back off, and make the admin client anew when its metadata is
        suspect or it keeps failing (one that lived through a broker restart never recovers)."""
        now = time.monotonic()
        err = exc.args[0] if exc.args else None
        code = err.code() if isinstance(err, KafkaError) else None
        self._last_error = str(err.str() if isinstance(err, KafkaError) else exc)
        self._failures += 1
        if self._failing_since is None:
            self._failing_since = now
        if now - self._logged > 10.0:
            self._logged = now
            log.info("state topic offsets not known now (%d failed question(s)): %s", self._failures, self._last_error)
        if (code in _STALE_METADATA and now - self._renewed >= 1.0) or now - self._failing_since >= _RENEW_AFTER_S:
            self._admin = self._new_admin()
            self._failing_since = self._renewed = now
            self.renewals += 1
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
            self._failed(exc)
            return False
        self._failures, self._failing_since, self._last_error = 0, None, ""
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
