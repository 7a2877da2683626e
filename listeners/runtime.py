"""The worker side of cluster listeners: a change sink (services.worker.sink.ChangeSink).

``ListenerRuntime(settings)`` is passed as ``Worker(..., sink=runtime)``. It sees the worker
only through its sink context (produce in the open transaction, committed rows, decode), and
wires these parts, each in its own module:

- :class:`listeners.follower.RegistryFollower` reads the registry topic on a thread;
  :class:`listeners.registry_view.RegistryView` folds it into registrations. Records are
  applied at every checkpoint (a safe point), and a newly assigned partition is processed
  only once the registry is read to its end as of the assignment (:meth:`ready`), so no
  partition runs with an outdated listener set, also while the follower restarts;
- :class:`listeners.matcher.ListenerSet` decides, per table change, which listeners get a
  notification of which kind; :class:`listeners.notifier.Notifier` numbers
  (:class:`listeners.journal.SeqJournal`) and produces them in the worker's transaction, so
  live notifications commit exactly once with their change;
- :class:`listeners.snapshots.Snapshots` announces the current state to
  include-current-state listeners, chunk by chunk;
- :class:`listeners.registry_view.Housekeeper`: the worker owning input partition 0
  dead-letters invalid registrations, once.

A listener whose expressions overrun their budget (a CEL evaluation over ``budget`` s), or whose
output topic Kafka refuses its notifications for (deleted, not writable), is suspended on this
worker: the worker and the others go on; a status record (``<name>/status/<worker>``, shown by
`listeners describe`) says why. Registering it again lifts it. One whose evaluations fail is
reported ``failing`` there (listeners.failures), at most every few seconds.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from functools import partial
from typing import Any

from fifolane.config import Settings
from fifolane.errors import FifolaneError, KafkaClientError, ListenerError
from listeners.follower import RegistryFollower, RegistryRecord
from listeners.hints import Hints
from listeners.journal import SeqJournal
from listeners.matcher import BUDGET_S, Change, ListenerSet, ListenerStats
from listeners.model import ListenerSpec
from listeners.notifier import Active, Notifier, resize
from listeners.notify import change_parts
from listeners.outputs import role_topic_problem
from listeners.refusals import OutputRefusals, existing_topics
from listeners.registry import ensure_output_topic, ensure_registry_topic, same_definition
from listeners.registry_view import Housekeeper, RegistryView
from listeners.snapshots import Snapshots
from listeners.suspensions import Suspensions, output_refused, overrun
from services.worker.sink import Row, SinkContext

__all__ = ["ListenerRuntime"]

log = logging.getLogger(__name__)

#: Registry batches larger than this are logged as a summary, not one line per listener.
_LOG_EACH = 20


class ListenerRuntime:
    """Evaluates registered listeners for a worker (see the module docstring).

    ``snapshot_batch``: entities scanned per checkpoint for include-current-state (shared by
    the snapshots in progress); ``housekeeping_interval``: seconds between lease and
    invalid-registration checks; ``topic_partitions``: output topic -> partition count,
    creating it if missing (replaceable in benchmarks); ``budget``: seconds one CEL
    evaluation may take before its listener is suspended here.
    """

    def __init__(self, settings: Settings, *, snapshot_batch: int = 5000, housekeeping_interval: float = 0.5,
                 topic_partitions: Callable[[str], int] | None = None,
                 budget: float = BUDGET_S, follower: RegistryFollower | None = None) -> None:
        self.settings = settings
        self.topic_partitions = topic_partitions or (lambda t: ensure_output_topic(settings, t))
        self.housekeeping_interval = housekeeping_interval
        self.listeners = ListenerSet(budget)
        self.journal = SeqJournal()
        self.snapshots = Snapshots(settings.registry_topic, snapshot_batch)
        self.view = RegistryView(self.snapshots.durable)
        self._follower = follower or RegistryFollower(settings, ensure_topic=ensure_registry_topic)
        self._ctx: SinkContext | None = None
        self._notifier: Notifier | None = None
        self._keeper: Housekeeper | None = None
        self._hints: Hints | None = None
        self._active: dict[str, Active] = {}
        self._suspended = Suspensions(settings.registry_topic, self.view.suspended, self.listeners, self._active)
        self._owned: set[int] = set()
        self._waiting: set[int] = set()  # assigned, snapshots not begun (registry not read yet)
        self._live = False
        self._any_type = False
        self._types: frozenset[bytes] = frozenset()
        self._untyped = 0  # active listeners without a type
        self._typed: Counter[bytes] = Counter()  # active listeners per type
        self._leased: set[str] = set()  # active listeners with a lease (housekeeping reads them)
        self._partitions: dict[str, int] = {}  # output topic -> partition count (cached)
        self._refusals = OutputRefusals(lambda topics: existing_topics(settings, topics))
        self._next_housekeeping = 0.0
        self._verbose = True
        self.live_sent = self.expired = 0  # live notifications sent, expired leases seen

    # -- public --------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The listeners this worker currently delivers to."""
        return sorted(self._active)

    def stats(self, name: str) -> ListenerStats:
        """Per-listener counters (notifications, run-time expression errors, overruns)."""
        return self.listeners.stats(name)

    def suspended(self) -> dict[str, str]:
        """Listeners suspended on this worker, and why."""
        return self._suspended.reasons()

    def snapshot_pending(self) -> list[tuple[str, int]]:
        """(listener, partition) pairs whose include-current-state snapshot is in progress."""
        return self.snapshots.pending

    @property
    def snapshot_sent(self) -> int:
        return self.snapshots.sent

    @property
    def dead_lettered(self) -> int:
        return self._keeper.dead_lettered if self._keeper is not None else 0

    @property
    def follower(self) -> RegistryFollower:
        return self._follower

    # -- the sink (services.worker.sink.ChangeSink) --------------------------------------------
    def open(self, ctx: SinkContext) -> None:
        self._ctx = ctx
        self._notifier = Notifier(self.journal, ctx.produce, self.listeners.converter_failed)
        self._keeper = Housekeeper(self.settings.registry_topic, self.settings.dlq_topic, ctx.worker_id,
                                   self._dead_letter, ctx.produce)
        self._hints = Hints(ctx.entity_type)
        ctx.answer_refusals(self.refused)
        self._suspended.worker = ctx.worker_id
        if not self._follower.alive:
            self._follower.start()
        self._follower.mark()

    def on_assign(self, partitions: list[int]) -> None:
        """New partitions: they run once the registry is read to its end as of now."""
        self._owned.update(partitions)
        self._waiting.update(partitions)
        self._follower.mark()

    def ready(self) -> bool:
        if not self._waiting:
            return True
        if not self._follower.caught_up():
            return False
        self._apply(self._follower.drain())
        for p in sorted(self._waiting):
            for act in self._active.values():
                self.snapshots.begin(act.spec, p)
        self._waiting.clear()
        return True

    def on_release(self, partitions: list[int]) -> None:
        gone = set(partitions)
        self._owned -= gone
        self._waiting -= gone
        self.journal.release(gone)
        self.snapshots.release(gone)

    def needs_records(self, types: Collection[str]) -> bool:
        return self._live and (self._any_type or any(t.encode() in self._types for t in types))

    def on_change(self, partition: int, offset: int | None, timestamp: int, ekey: bytes,
                  old: Row | None, new: Row, record: dict[str, Any] | None,
                  moved_to: str | None = None) -> None:
        """One applied table write: notify the listeners it concerns."""
        if not self._live:
            return
        slash = ekey.find(b"/")
        tb = ekey[:slash]
        if not self._any_type and tb not in self._types:
            return
        ctx = self._ctx
        assert ctx is not None and self._hints is not None and self._notifier is not None
        old_live = old is not None and not old.deleted
        if new.deleted:
            if not old_live:
                return  # delete of an absent entity: no table change
            table_change = "removed"
            new_rec = None
        else:
            table_change = "modified" if old_live else "created"
            assert new.value is not None
            new_rec = record if record is not None else ctx.decode(new.value)
        type_ = tb.decode()
        key = ekey[slash + 1 :].decode()
        old_state: Any = None
        known: tuple[Any, ...] = ()
        if old_live:
            assert old is not None and old.value is not None
            old_state = partial(ctx.decode, old.value)  # decoded if an expression needs it
            plan = self.listeners.built.get(type_)  # an index takes the old group and key
            if plan is None or plan.indexed:  # from the row and the entity key: no decode
                known = self._hints.known(tb, type_, key, old, new, new_rec)
        version = new.version
        notes = self.listeners.match_lazy(type_, key, new_rec, old_state, table_change,
                                          (partition, offset, timestamp, version), known)  # fmt: skip
        if self.listeners.overruns:
            self._suspend_overrun()
        if not notes:
            return
        snaps = self.snapshots if self.snapshots.in_progress else None  # once, not per note
        parts = change_parts(type_, key, table_change, partition, offset, version, timestamp,
                             moved_to=moved_to)
        self.live_sent += self._notifier.send_all(notes, self._active, snaps, partition, ekey, parts, self.refused)

    def after_commit(self) -> None:
        """Safe point: settle the journal, apply the registry, housekeeping, snapshot chunks."""
        assert self._ctx is not None and self._keeper is not None
        self.journal.commit()
        self.snapshots.commit()
        self._keeper.commit(self.view)
        self._suspended.commit()
        self._refusals.settled()
        records = self._follower.drain()
        if records:
            self._apply(records)
        now = time.monotonic()
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + self.housekeeping_interval
            self._expire()
            if 0 in self._owned:
                self._keeper.run(self.view)
        self._suspended.flush(self._ctx.produce)
        if self.snapshots:
            ctx = self._ctx
            self.snapshots.chunks(self._owned, ctx.committed_rows, self._type_of, self._announce, ctx.produce)

    def after_abort(self) -> None:
        """The transaction aborted: take back its numbers, cursors and records."""
        self.journal.rollback()
        self.snapshots.rollback()
        if self._keeper is not None:
            self._keeper.rollback()
        self._suspended.rollback()
        self._refusals.settled()
        if self._ctx is not None:  # the worker may have read the topics' limits again (Limits.refresh)
            resize(self._active.values(), self._ctx.room)

    def close(self) -> None:
        self._follower.stop()

    def metrics(self) -> dict[str, float]:
        f = self._follower
        return {
            "listeners_active": len(self._active),
            "listeners_suspended": len(self._suspended), "listener_errors": sum(self.listeners.stats(n).errors for n in self._active),
            "listener_notifications": self.live_sent + self.snapshots.sent,
            "listener_notifications_too_large": self._notifier.too_large if self._notifier else 0,
            "listener_snapshots_pending": len(self.snapshots.pending),
            "listener_invalid_registrations": len(self.view.invalid),
            "registry_follower_healthy": float(f.healthy and f.alive), "registry_follower_restarts": f.restarts,
        }

    # -- registry ------------------------------------------------------------------------------
    def _apply(self, records: list[RegistryRecord]) -> None:
        changed = self.view.apply(records)
        self._verbose = len(changed) <= _LOG_EACH
        try:
            for name in changed:
                self._reconcile(name)
        finally:
            self._verbose = True
        if len(changed) > _LOG_EACH:
            log.info("registry: %d registrations applied, %d listeners active",
                     len(changed), len(self._active))  # fmt: skip

    def apply_records(self, records: list[RegistryRecord]) -> None:
        """Apply registry records directly (unit tests and benchmarks without a registry)."""
        self._apply(records)

    def _reconcile(self, name: str) -> None:
        spec = self.view.specs.get(name)
        instance = spec.created_at.isoformat() if spec is not None else None
        # suspended here unless registered again since
        want = spec is not None and not spec.is_expired() and not self._suspended.holds(name, instance)
        act = self._active.get(name)
        if act is not None and spec is not None and want and same_definition(act.spec, spec) \
                and act.spec.created_at == spec.created_at:  # fmt: skip
            act.spec = spec  # a renewal
            return
        if act is not None:
            self._deactivate(name, forget=spec is None or spec.created_at != act.spec.created_at)
        if want and spec is not None:
            self._activate(spec)

    def _activate(self, spec: ListenerSpec) -> None:
        assert self._ctx is not None
        topic = spec.topic(self.settings)
        try:  # a role topic as output is refused here too, not only at registration
            if (problem := role_topic_problem(self.settings, topic)) is not None:
                raise ListenerError(problem)
            parts = self._partitions.get(topic)
            if parts is None:  # one metadata round trip per output topic, not per listener
                parts = self._partitions[topic] = self.topic_partitions(topic)
                self._ctx.refresh_topic(topic)  # the producer may have seen it deleted (refusals.py)
            self.listeners.add(spec)
        except FifolaneError as exc:  # invalid (from_json validated; be safe), or a missing topic
            log.warning("listener %r not activated: %s", spec.name, exc)
            return
        self._active[spec.name] = Active.of(spec, topic, parts, self._ctx.room(topic))
        self._retype(spec, +1)
        for p in self._owned - self._waiting:
            self.snapshots.begin(spec, p)
        if self._verbose:
            log.info("listener %r active (filter %r)", spec.name, spec.filter)

    def _deactivate(self, name: str, *, forget: bool) -> None:
        assert self._ctx is not None
        self.listeners.remove(name)
        act = self._active.pop(name)
        self._retype(act.spec, -1)
        self.journal.end(name)  # a later activation is a new run of numbers
        self.snapshots.end(name, self._owned, forget=forget, produce=self._ctx.produce)
        if self._verbose:
            log.info("listener %r inactive", name)

    def _retype(self, spec: ListenerSpec, sign: int) -> None:
        """Keep the per-type counts and the leased set of active listeners (O(1) each)."""
        if spec.lease is not None:
            (self._leased.add if sign > 0 else self._leased.discard)(spec.name)
        if spec.type is None:
            self._untyped += sign
        else:
            t = spec.type.encode()
            self._typed[t] += sign
            if self._typed[t] <= 0:
                del self._typed[t]
            self._types = frozenset(self._typed)
        self._live = bool(self._active)
        self._any_type = self._untyped > 0

    def _expire(self) -> None:
        """Leases that ran out: inactive here at once (never deleted from the registry)."""
        now = datetime.now(UTC)
        for name in [n for n in self._leased if self._active[n].spec.is_expired(now)]:
            log.info("listener %r: lease expired at %s", name, self._active[name].spec.expires_at)
            self._deactivate(name, forget=False)
            self.expired += 1

    def _suspend_overrun(self) -> None:
        self._suspend(self.listeners.take_overruns(), lambda n: overrun(self.listeners.stats(n), self.listeners.budget))

    def refused(self, topic: str | None, error: KafkaClientError) -> bool:
        """Kafka will not take a record to ``topic`` (None: records timed out): the listeners
        writing where it is gone are suspended here (listeners.refusals). True: replay without them."""
        names = self._refusals.names(topic, error, self._active)
        if names is None:
            return False
        for name in names:
            self._partitions.pop(self._active[name].topic, None)  # registered again: looked up again
        self._suspend(names, lambda n: output_refused(self._active[n].topic, error))
        return True

    def _suspend(self, names: Collection[str], reason_of: Callable[[str], str]) -> None:
        assert self._ctx is not None
        for name in names:
            act = self._active.get(name)
            if act is not None:
                reason = reason_of(name)
                self._deactivate(name, forget=False)
                self._suspended.suspend(name, act.spec.created_at.isoformat(), reason, self._ctx.worker_id)
                log.warning("listener %r suspended on this worker: %s", name, reason)

    def _dead_letter(self, rec: RegistryRecord, error: str) -> None:
        assert self._ctx is not None
        self._ctx.dead_letter(rec.key.encode(), rec.value, list(rec.headers), self.settings.registry_topic,
                              0, rec.offset, "invalid-listener", error)

    # -- include current state -----------------------------------------------------------------
    def _type_of(self, name: str) -> str | None:
        act = self._active.get(name)
        return act.spec.type if act is not None else None

    def _announce(self, name: str, p: int, ekey: bytes, row: Row) -> bool:
        act = self._active.get(name)
        if act is None or row.value is None:
            return False
        assert self._ctx is not None and self._notifier is not None
        type_, _, key = ekey.decode().partition("/")
        now = int(time.time() * 1000)
        change = Change(type_, key, self._ctx.decode(row.value), None, "created", {
            "partition": p, "offset": None, "timestamp": now, "version": row.version, "type": type_,
        })  # fmt: skip
        n = self.listeners.match_current(name, change)
        if n is None:
            return False
        parts = change_parts(type_, key, None, p, None, row.version, now, snapshot=True)
        return self._notifier.send_checked(act, n.kind, p, ekey, parts, n.value, self.refused)
