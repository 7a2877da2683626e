"""The worker side of cluster listeners: a change sink for :class:`services.worker.runtime.Worker`.

``ListenerRuntime(settings)`` is passed as ``Worker(..., listeners=runtime)``. Everything runs on
the worker's poll thread except :class:`listeners.registry.RegistryFollower`, which reads the
registry topic in the background and hands records over.

Registry. Records are applied at every ``after_commit`` (a safe point), and on partition
assignment after waiting until the registry is read to its current end, so a worker (also one
started later) never processes a partition with an outdated listener set. A removal therefore
stops delivery for changes applied later than about one registry poll (0.1 s) plus one
checkpoint interval (``--commit-interval``, 0.25 s) after the tombstone is written. The worker
owning input partition 0 is the housekeeper: it tombstones expired leases and dead-letters
registrations that do not validate (reason ``invalid-listener``, and tombstones them); every
worker stops delivering to an expired listener on its own at once.

Per change (``on_change``): nothing at all when no listener exists or none applies to the
entity type; else one :meth:`ListenerSet.match_lazy` call, which decodes the old row only if
an expression or an index lookup needs it (the index reads the old state's group and key
fields from the row and the entity key, when those are plain string fields, as they are
written by the worker). Each notification is sent with
``worker.produce`` to the listener's output topic, partition = the source partition, key = the
state-topic key, so it commits in the same Kafka transaction as the state change: live
notifications are exactly once with the change.

Sequence numbers (:mod:`listeners.seq`): per listener and source partition, consecutive from
``epoch * DELTA`` where the epoch is taken at partition assignment; counters of an aborted
transaction are rolled back, so a run stays gap-free.

Include current state (per listener and owned partition). The owner announces the existing
entities in key order, in chunks, each read at an ``after_commit`` safe point from committed
RocksDB state. Live notifications of that listener for keys *after* the cursor are held back
(the chunk that reaches the key announces its then current state); keys at or before the
cursor get live notifications. So, per key, the consumer sees the state as of its chunk, then
every later change: nothing lost, nothing repeated at the seam. Each chunk writes its progress
(``<name>/snapshot/<partition>``, :class:`listeners.registry.Progress`) to the registry in the
same transaction as its notifications; a new owner (after a move or a crash) resumes from the
committed cursor, so the snapshot is neither repeated nor lost. Snapshot notifications carry
``"snapshot": true``, ``table_change`` and ``offset`` null, and the same sequence numbers as
live ones (one counter).

With ``--guarantee at-least-once`` there are no transactions: after a crash, replayed changes
are notified again with numbers of the new run (duplicates then cannot be recognised by seq).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from fifolane.config import Settings
from fifolane.errors import ExpressionError, ListenerError
from listeners.index import lookup
from listeners.matcher import Change, Known, ListenerSet, ListenerStats
from listeners.model import ListenerSpec
from listeners.notify import HEADER_LISTENER, assemble, change_parts, encode_value
from listeners.notify import listener_prefix as _prefix
from listeners.registry import (
    Progress,
    RegistryFollower,
    RegistryRecord,
    ensure_output_topic,
    parse_progress_key,
    progress_key,
    same_definition,
)
from listeners.seq import DELTA, next_epoch

__all__ = ["ListenerRuntime"]

log = logging.getLogger(__name__)

_MISSING: Any = object()
_SNAP = 1  # journal table of snapshot cursors
_Key = tuple[str, int]  # (listener, source partition)
#: Registry batches larger than this are logged as a summary, not one line per listener.
_LOG_EACH = 20


@dataclass(slots=True)
class _Active:
    spec: ListenerSpec
    topic: str
    partitions: int
    headers: list[tuple[str, bytes]]
    prefix: str  # the constant start of its notifications' JSON
    #: Next sequence number per owned source partition.
    seq: dict[int, int] = field(default_factory=dict)
    #: Per partition, the number before the open transaction's first notification (-1: none).
    undo: dict[int, int] = field(default_factory=dict)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _decoded(decode: Callable[[bytes], Any], raw: bytes) -> Any:
    return decode(raw).record


_Path = tuple[str, ...]
#: An entity type whose old rows tell nothing about the old state's fields.
_NO_HINT: tuple[_Path | None, _Path | None] = (None, None)


def _string_path(schema: Any, path: str) -> _Path | None:
    """``path`` as a tuple if it names a non-null ``string`` field (through nested records)
    of the Avro record ``schema``, else None."""
    names = tuple(path.split("."))
    node = schema
    for i, name in enumerate(names):
        if not isinstance(node, dict) or node.get("type") != "record":
            return None
        field = next((f for f in node.get("fields", ()) if f.get("name") == name), None)
        if field is None:
            return None
        node = field.get("type")
        if i == len(names) - 1:
            if node == "string" or (isinstance(node, dict) and node.get("type") == "string"
                                    and "logicalType" not in node):  # fmt: skip
                return names
            return None
    return None


class ListenerRuntime:
    """Evaluates registered listeners for a worker (see the module docstring).

    ``snapshot_batch``: entities scanned per ``after_commit`` for include-current-state
    (shared by the snapshots in progress); ``housekeeping_interval``: seconds between lease
    and invalid-registration checks; ``topic_partitions``: see the attribute.
    """

    def __init__(self, settings: Settings, *, snapshot_batch: int = 5000,
                 housekeeping_interval: float = 0.5, sync_timeout: float = 60.0,
                 topic_partitions: Callable[[str], int] | None = None) -> None:  # fmt: skip
        self.settings = settings
        #: Output topic -> partition count, creating it if missing (replaceable in benchmarks).
        self.topic_partitions = topic_partitions or (lambda t: ensure_output_topic(settings, t))
        self.snapshot_batch = snapshot_batch
        self.housekeeping_interval = housekeeping_interval
        self.sync_timeout = sync_timeout
        self.listeners = ListenerSet()
        self._specs: dict[str, ListenerSpec] = {}  # latest valid registrations
        self._active: dict[str, _Active] = {}  # the ones in the matcher
        self._invalid: dict[str, tuple[RegistryRecord, str]] = {}
        self._invalid_sent: dict[str, tuple[RegistryRecord, str]] = {}
        self._expiry_sent: set[tuple[str, str]] = set()
        self._durable: dict[_Key, Progress] = {}  # committed progress, from the registry
        self._snap: dict[_Key, Progress] = {}  # snapshots in progress on owned partitions
        self._undo: dict[tuple[int, _Key], Any] = {}  # snapshot cursors since the last commit
        self._dirty: list[_Active] = []  # listeners that numbered since the last commit
        self._owned: set[int] = set()
        self._epoch: dict[int, int] = {}
        self._last_epoch = 0
        self._aborts = 0
        self._live = False
        self._any_type = False
        self._types: frozenset[bytes] = frozenset()
        self._untyped = 0  # active listeners without a type
        self._typed: Counter[bytes] = Counter()  # active listeners per type
        self._leased: dict[str, ListenerSpec] = {}  # registrations with a lease
        self._partitions: dict[str, int] = {}  # output topic -> partition count (cached)
        #: entity type -> paths of its group and key fields, where old rows carry them
        self._hints: dict[bytes, tuple[_Path | None, _Path | None]] = {}
        self._follower: RegistryFollower | None = None
        self._next_housekeeping = 0.0
        self._verbose = True
        #: Counters: notifications sent live and from snapshots, invalid registrations
        #: dead-lettered, expired leases tombstoned.
        self.live_sent = 0
        self.snapshot_sent = 0
        self.dead_lettered = 0
        self.expired = 0

    # -- public ----------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The listeners this worker currently delivers to."""
        return sorted(self._active)

    def stats(self, name: str) -> ListenerStats:
        """Per-listener counters (notifications, run-time expression errors)."""
        return self.listeners.stats(name)

    def snapshot_pending(self) -> list[_Key]:
        """(listener, partition) pairs whose include-current-state snapshot is in progress."""
        return sorted(self._snap)

    def close(self) -> None:
        """Stop following the registry."""
        if self._follower is not None:
            self._follower.stop()
            self._follower = None

    # -- worker hooks ----------------------------------------------------------------------
    def on_assign(self, worker: Any, partitions: list[int]) -> None:
        """New partitions: catch up with the registry, open a run (epoch), resume snapshots."""
        self._sync(worker)
        self._last_epoch = next_epoch(self._last_epoch)
        for p in partitions:
            self._owned.add(p)
            self._epoch[p] = self._last_epoch
            for act in self._active.values():
                self._begin_snapshot(act.spec, p)

    def on_release(self, worker: Any, partitions: list[int]) -> None:
        """Partitions gone: forget their counters and snapshots."""
        if (self._undo or self._dirty) and not getattr(worker, "_txn_open", True):
            self._rollback()  # lost partitions: the open transaction was aborted
        gone = set(partitions)
        self._owned -= gone
        for p in gone:
            self._epoch.pop(p, None)
        for act in self._active.values():
            if act.seq:
                for p in gone:
                    act.seq.pop(p, None)
                    act.undo.pop(p, None)
        for k in [k for k in self._snap if k[1] in gone]:
            del self._snap[k]
        for uk in [uk for uk in self._undo if uk[1][1] in gone]:
            del self._undo[uk]

    def wants_records(self, types: Iterable[str]) -> bool:
        """Whether a change of one of ``types`` can notify a listener now, that is whether
        on_change would decode its record (the worker then decodes it up front instead of
        reading only key, group and version)."""
        return self._live and (self._any_type or any(t.encode() in self._types for t in types))

    def on_change(self, worker: Any, event: Any, ekey: bytes, old: Any, new: Any,
                  record: dict[str, Any] | None) -> None:  # fmt: skip
        """One applied table write: notify the listeners it concerns."""
        if not self._live:
            return
        slash = ekey.find(b"/")
        tb = ekey[:slash]
        if not self._any_type and tb not in self._types:
            return
        if worker.stats.aborts != self._aborts:
            self._rollback()
            self._aborts = worker.stats.aborts
        old_live = old is not None and not old.deleted
        if new.deleted:
            if not old_live:
                return  # delete of an absent entity: no table change
            table_change = "removed"
            new_rec = None
        else:
            table_change = "modified" if old_live else "created"
            new_rec = record if record is not None else worker.codec.decode(new.value).record
        type_ = tb.decode()
        key = ekey[slash + 1 :].decode()
        p = event.partition
        old_state: Any = None
        known: tuple[Known, ...] = ()
        if old_live:
            # Decoded only if an expression or an index lookup needs the old state: the
            # index takes the group and key fields from the row and the entity key.
            old_state = partial(_decoded, worker.codec.decode, old.value)
            hint = self._hints.get(tb)
            if hint is None:
                hint = self._hint(worker, type_, tb)
            if hint is not _NO_HINT:
                known = self._known(hint, tb, key, old, new, new_rec)
        offset, ts, version = event.offset, event.timestamp, new.version
        notes = self.listeners.match_lazy(type_, key, new_rec, old_state, table_change,
                                          (p, offset, ts, version), known)  # fmt: skip
        if not notes:
            return
        snap = self._snap
        active = self._active
        parts = change_parts(type_, key, table_change, p, offset, version, ts)
        # Listeners without a converter share the projection (the new record): encode once.
        last_value: Any = _MISSING
        value_json = ""
        for n in notes:
            if snap:
                st = snap.get((n.listener, p))
                if st is not None and (st.cursor is None or ekey > st.cursor):
                    continue  # its snapshot chunk will announce the then current state
            if n.value is not last_value:
                last_value = n.value
                value_json = encode_value(n.value)
            self._send(worker, active[n.listener], n.kind, p, ekey, parts, value_json)
            self.live_sent += 1

    def _hint(self, worker: Any, type_: str, tb: bytes) -> tuple[_Path | None, _Path | None]:
        """The entity type's group and key field paths, each if it is a plain string field
        (then a stored row's group and the entity key equal the old state's fields)."""
        entity = getattr(getattr(worker.codec, "catalog", None), "types", {}).get(type_)
        hint = _NO_HINT
        if entity is not None:
            hint = (_string_path(entity.schema, entity.group_path),
                    _string_path(entity.schema, entity.key_path))  # fmt: skip
            if hint == _NO_HINT:
                hint = _NO_HINT
        self._hints[tb] = hint
        return hint

    def _known(self, hint: tuple[_Path | None, _Path | None], tb: bytes, key: str, old: Any,
               new: Any, new_rec: Any) -> tuple[Known, ...]:  # fmt: skip
        gpath, kpath = hint
        if new_rec is not None and (
            (gpath is not None and (new_rec.get(gpath[0]) if len(gpath) == 1
                                    else lookup(new_rec, gpath)) != new.group)
            or (kpath is not None and (new_rec.get(kpath[0]) if len(kpath) == 1
                                       else lookup(new_rec, kpath)) != key)
        ):  # never seen: rows not written like the worker does; decode from now on
            log.warning("listeners: %s rows do not carry their group/key fields as written; "
                        "decoding old states for the index", tb.decode())  # fmt: skip
            self._hints[tb] = _NO_HINT
            return ()
        if gpath is None:
            return ((kpath, key),) if kpath is not None else ()
        if kpath is None:
            return ((gpath, old.group),)
        return ((gpath, old.group), (kpath, key))

    def after_commit(self, worker: Any) -> None:
        """Safe point: settle the journal, apply the registry, housekeeping, snapshot chunks."""
        if self._follower is None:
            self._sync(worker)
        if worker.stats.aborts != self._aborts:
            self._rollback()
            self._aborts = worker.stats.aborts
        else:
            self._undo.clear()
            for act in self._dirty:
                act.undo.clear()
            self._dirty.clear()
            self._invalid_sent.clear()
        assert self._follower is not None
        records = self._follower.drain()
        if records:
            self._apply(worker, records)
        now = time.monotonic()
        if now >= self._next_housekeeping:
            self._next_housekeeping = now + self.housekeeping_interval
            self._housekeeping(worker)
        if self._snap:
            self._snapshot_chunks(worker)

    # -- registry --------------------------------------------------------------------------
    def _sync(self, worker: Any) -> None:
        if self._follower is None:
            self._follower = RegistryFollower(self.settings)
            self._follower.start()
        self._follower.sync(self.sync_timeout)
        records = self._follower.drain()
        if records:
            self._apply(worker, records)

    def _apply(self, worker: Any, records: list[RegistryRecord]) -> None:
        latest: dict[str, RegistryRecord] = {}  # registrations: the last record per name
        for rec in records:
            pk = parse_progress_key(rec.key)
            if pk is None:
                latest[rec.key] = rec
            elif rec.value is None:
                self._durable.pop(pk, None)
            else:
                try:
                    self._durable[pk] = Progress.from_json(rec.value)
                except (ValueError, KeyError, TypeError) as exc:
                    log.warning("ignoring bad progress record %r: %s", rec.key, exc)
        self._verbose = len(latest) <= _LOG_EACH
        try:
            # Parse and reconcile one name at a time: the matcher then reuses the filter
            # compiled by the spec's validation (expr's compile cache) even for huge batches.
            for name, rec in latest.items():
                self._specs.pop(name, None)
                self._leased.pop(name, None)
                self._invalid.pop(name, None)
                if rec.value is not None:
                    try:
                        spec = ListenerSpec.from_json(rec.value)
                    except (ListenerError, ExpressionError, TypeError, ValueError) as exc:
                        self._invalid[name] = (rec, str(exc))
                        log.warning("invalid listener registration %r: %s", name, exc)
                    else:
                        self._specs[name] = spec
                        if spec.lease is not None:
                            self._leased[name] = spec
                self._reconcile(worker, name)
        finally:
            self._verbose = True
        if len(latest) > _LOG_EACH:
            log.info("registry: %d registrations applied, %d listeners active",
                     len(latest), len(self._active))  # fmt: skip

    def _reconcile(self, worker: Any, name: str) -> None:
        spec = self._specs.get(name)
        want = spec is not None and not spec.is_expired()
        act = self._active.get(name)
        if act is not None and spec is not None and want and same_definition(act.spec, spec) \
                and act.spec.created_at == spec.created_at:  # fmt: skip
            act.spec = spec  # a renewal
            return
        if act is not None:
            self._deactivate(
                worker, name, forget=spec is None or spec.created_at != act.spec.created_at
            )
        if want and spec is not None:
            self._activate(spec)

    def _activate(self, spec: ListenerSpec) -> None:
        try:
            self.listeners.add(spec)
        except (ListenerError, ExpressionError) as exc:  # from_json validated; be safe
            log.warning("listener %r not activated: %s", spec.name, exc)
            return
        topic = spec.topic(self.settings)
        parts = self._partitions.get(topic)
        if parts is None:  # one metadata round trip per output topic, not per listener
            parts = self._partitions[topic] = self.topic_partitions(topic)
        self._active[spec.name] = _Active(
            spec,
            topic,
            parts,
            [(HEADER_LISTENER, spec.name.encode())],
            _prefix(spec.name),
        )
        self._retype(spec, +1)
        for p in self._owned:
            self._begin_snapshot(spec, p)
        if self._verbose:
            log.info("listener %r active (filter %r)", spec.name, spec.filter)

    def _deactivate(self, worker: Any, name: str, *, forget: bool) -> None:
        self.listeners.remove(name)
        act = self._active.pop(name)
        self._retype(act.spec, -1)
        # Per (listener, partition) state only exists for owned partitions (on_release drops
        # the rest): cost per removal is O(owned partitions), not O(listeners x partitions).
        for p in self._owned:  # (its sequence numbers go with its _Active)
            k = (name, p)
            self._snap.pop(k, None)
            self._undo.pop((_SNAP, k), None)
            if forget and k in self._durable:  # removed or replaced: clean up its progress
                worker.produce(self.settings.registry_topic, None, progress_key(*k).encode(),
                               partition=0)  # fmt: skip
        if self._verbose:
            log.info("listener %r inactive", name)

    def _retype(self, spec: ListenerSpec, sign: int) -> None:
        """Keep the per-type counts of active listeners (O(1) per (de)activation)."""
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

    def _housekeeping(self, worker: Any) -> None:
        now = datetime.now(UTC)
        keeper = 0 in self._owned
        for name, spec in list(self._leased.items()):
            if not spec.is_expired(now):
                continue
            if name in self._active:
                self._deactivate(worker, name, forget=False)
                log.info("listener %r: lease expired at %s", name, spec.expires_at)
            stamp = (name, (spec.renewed_at or spec.created_at).isoformat())
            if keeper and stamp not in self._expiry_sent:
                self._expiry_sent.add(stamp)
                worker.produce(self.settings.registry_topic, None, name.encode(), partition=0)
                self.expired += 1
        if keeper and self._invalid:
            from services.worker.dlq import dead_letter_headers

            for name, (rec, error) in list(self._invalid.items()):
                headers = dead_letter_headers(None, self.settings.registry_topic, 0, rec.offset,
                                              "invalid-listener", error, worker.opts.worker_id)  # fmt: skip
                worker.produce(self.settings.dlq_topic, rec.value, name.encode(), headers=headers)
                worker.produce(self.settings.registry_topic, None, name.encode(), partition=0)
                self._invalid_sent[name] = self._invalid.pop(name)
                self.dead_lettered += 1

    # -- sequence numbers and the journal ----------------------------------------------------
    def _journal(self, table: int, d: dict[_Key, Any], k: _Key) -> None:
        uk = (table, k)
        if uk not in self._undo:
            self._undo[uk] = d.get(k, _MISSING)

    def _rollback(self) -> None:
        """The transaction since the last commit aborted: restore counters and cursors."""
        for act in self._dirty:
            for p, before in act.undo.items():
                if before < 0:
                    act.seq.pop(p, None)
                else:
                    act.seq[p] = before
            act.undo.clear()
        self._dirty.clear()
        for (_table, k), old in self._undo.items():
            if old is _MISSING:
                self._snap.pop(k, None)
            else:
                self._snap[k] = old
        self._undo.clear()
        self._invalid.update(self._invalid_sent)
        self._invalid_sent.clear()

    def _send(self, worker: Any, act: _Active, kind: str, p: int, ekey: bytes,
              parts: tuple[str, str, str], value_json: str) -> None:  # fmt: skip
        """Number and produce one notification (``parts``: :func:`change_parts` of the change,
        ``value_json``: :func:`encode_value` of its projection)."""
        seqs = act.seq
        seq = seqs.get(p)
        undo = act.undo
        if p not in undo:  # its first one in this transaction: journal the number
            if not undo:
                self._dirty.append(act)
            undo[p] = -1 if seq is None else seq
        if seq is None:
            seq = self._epoch.get(p, self._last_epoch) * DELTA
        seqs[p] = seq + 1
        value = assemble(act.prefix, kind, parts, value_json, seq)
        worker.produce(act.topic, value, ekey, p % act.partitions, act.headers)

    # -- include current state -------------------------------------------------------------
    def _begin_snapshot(self, spec: ListenerSpec, p: int) -> None:
        if not spec.include_current_state or "created" not in spec.kinds:
            return
        instance = spec.created_at.isoformat()
        k = (spec.name, p)
        d = self._durable.get(k)
        if d is not None and d.instance == instance:
            if not d.done:
                self._snap[k] = d
        else:
            self._snap[k] = Progress(spec.name, p, instance)

    def _snapshot_chunks(self, worker: Any) -> None:
        keys = [k for k in self._snap if k[1] in self._owned]
        if not keys:
            return
        budget = max(200, self.snapshot_batch // len(keys))
        for k in keys:
            self._snapshot_chunk(worker, k, budget)

    def _snapshot_chunk(self, worker: Any, k: _Key, budget: int) -> None:
        name, p = k
        st = self._snap[k]
        act = self._active.get(name)
        store = worker.stores.stores.get(p)
        if act is None or store is None:
            return
        decode = worker.codec.decode
        prefix = act.spec.type.encode() + b"/" if act.spec.type else None
        now = _now_ms()
        cursor, sent, scanned, done = st.cursor, st.sent, 0, True
        for ekey, row in store.iter_committed(after=cursor):
            if scanned >= budget:
                done = False
                break
            scanned += 1
            cursor = ekey
            if prefix is not None and not ekey.startswith(prefix):
                continue
            type_, _, key = ekey.decode().partition("/")
            change = Change(type_, key, decode(row.value).record, None, "created", {
                "partition": p, "offset": None, "timestamp": now, "version": row.version,
                "type": type_,
            })  # fmt: skip
            n = self.listeners.match_current(name, change)
            if n is not None:
                parts = change_parts(type_, key, None, p, None, row.version, now, snapshot=True)
                self._send(worker, act, n.kind, p, ekey, parts, encode_value(n.value))
                sent += 1
                self.snapshot_sent += 1
        progress = Progress(name, p, st.instance, cursor, done, sent)
        self._journal(_SNAP, self._snap, k)
        if done:
            del self._snap[k]
            log.info("listener %r: current state of partition %d sent (%d)", name, p, sent)
        else:
            self._snap[k] = progress
        worker.produce(self.settings.registry_topic, progress.to_json(),
                       progress_key(name, p).encode(), partition=0)  # fmt: skip

    # -- for tests and benchmarks ----------------------------------------------------------
    def apply_records(self, worker: Any, records: Iterable[RegistryRecord]) -> None:
        """Apply registry records directly (unit tests, benchmarks without a registry)."""
        self._apply(worker, list(records))
