"""The general path of the worker: every record the fast path does not take, and handlers.

:class:`Processing` turns a record into an event (or a dead letter), runs the built-in table
handler inline, queues app-handler events per FIFO group (the scheduler keeps their order and
exclusivity), applies finished handler calls, and dead-letters what cannot be applied. All of
it on the worker's poll thread; every entity write goes through the partition's
:class:`services.worker.table.TableApplier`.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError

from fifolane.serde import Decoded
from services.worker.app import App, Event, HandlerSpec, table_handler
from services.worker.assignment import Topics
from services.worker.calls import HandlerCalls, Result
from services.worker.checkpoint import Checkpoint
from services.worker.directory import DirectoryApplier
from services.worker.dlq import dead_letter
from services.worker.effects import Effects, check_effects
from services.worker.ingest import Rejected, to_event
from services.worker.kafka import Record, consumer_error
from services.worker.limits import Limits
from services.worker.metrics import Stats
from services.worker.moveouts import Leave, displaced_move_out, end_leave, overtaken, start_move_out
from services.worker.parking import Parking
from services.worker.release import Releases
from services.worker.scheduler import GroupScheduler
from services.worker.state import Row
from services.worker.table import APPLIED, STALE, Claim, TableApplier

__all__ = ["Processing"]

log = logging.getLogger(__name__)


class Processing:
    """The general path and the handlers of one worker (see the module docstring)."""

    def __init__(self, *, app: App, codec: Any, topics: Topics, state_topic: str, dlq_topic: str,
                 worker_id: str, ckpt: Checkpoint, tables: Mapping[int, TableApplier],
                 directories: Mapping[int, DirectoryApplier], sched: GroupScheduler[Event],
                 calls: HandlerCalls, limits: Limits, stats: Stats, claim: Claim | None,
                 parking: Parking | None = None, park_failures: bool = False) -> None:
        self.app = app
        self.codec = codec
        self._decode = codec.decoder()
        self.topics = topics
        self._state_topic = state_topic
        self._reserved = frozenset(t for t in (state_topic, topics.directory) if t)  # no emits there
        self._dlq = dlq_topic
        self._worker_id = worker_id
        self.ckpt = ckpt
        self.tables = tables
        self.directories = directories
        self.sched = sched
        self.calls = calls
        self.limits = limits
        self.stats = stats
        self._claim = claim
        self.park_failures = park_failures  # --on-failure park
        self.releases = None if parking is None else Releases(
            parking, input_topic=topics.input, codec=codec, stats=stats, submit=self._resubmit,
            dead_letter=self.dead_letter)
        self.avg_call = 0.0  # seconds, EWMA over handler calls (pool and async handlers)
        self._specs: dict[str, HandlerSpec] = {}  # type -> handler (the app's, looked up once)
        self._staged = frozenset(t for t in app.types if app.stages_of(t))  # types with stage handlers
        #: events of a later pipeline stage queued or running: their input record's earlier
        #: stages have effects already, so a checkpoint waits for them (no half chain commits)
        self.partial = 0
        self.leaving = False  # applying a handler's effects on a move-out (services/worker/moveouts.py)
        self._leaves: dict[int, Leave] = {}  # id(the call's event) -> the move-out's handler call running
        self.consumer_failed: KafkaError | None = None  # a fatal error the consumer delivered

    def take(self, msg: Record, decoded: Decoded | None = None) -> None:
        """Take one record the fast path did not (any kind of record)."""
        err = msg.error()
        if err is not None:  # logged; a fatal one makes the worker renew its consumer (rebalance.py)
            self.consumer_failed = consumer_error(err) or self.consumer_failed
            return
        ckpt = self.ckpt
        topic, p, offset = msg.topic(), msg.partition(), msg.offset()
        if topic != self.topics.input:
            directory = self.directories.get(p)
            if directory is not None and topic == self.topics.directory:
                ckpt.consumed(topic, p, offset)
                poison = ckpt.poison_of(topic, p, offset)
                if poison is None:
                    directory.apply(msg.key(), msg.value())
                else:  # what it sends Kafka refuses: dead-lettered (not an input event, so
                    # counted by its reason only: consumed = processed + superseded + dead_lettered)
                    self.dead_letter(msg.key(), msg.value(), msg.headers(), topic, p, offset,
                                     "output-refused", poison, counted=False)
                    ckpt.poison_settled(topic, p, offset)
            return
        if p not in self.tables:
            return  # not ours (any more), or not restored yet: replayed once it is
        ckpt.consumed(topic, p, offset)
        seen = ckpt.replayed(topic, p, offset)
        if seen == 1:
            self.stats.replay_skipped += 1  # finished after the last committed offset
            return
        self.stats.consumed += seen == 0  # 2: counted by a committed transaction already
        poison = ckpt.poison_of(topic, p, offset)
        if poison is not None:
            self.refuse(msg, "output-refused", poison)
            ckpt.poison_settled(topic, p, offset)
            return
        event = to_event(msg, self._decode, decoded)
        if isinstance(event, Rejected):
            self.refuse(msg, event.reason, event.error)
            return
        if self.releases and self.releases.parked(event.group) and event.op not in ("release", "move-out"):
            self.releases.hold(event)
            return
        self._dispatch(event)

    def _dispatch(self, event: Event) -> None:
        """Run an event inline, or queue it in its lane."""
        spec = self._spec_of(event.type) if event.op not in ("move-out", "release") else None
        if event.op == "upsert" and event.type in self._staged:
            spec = self._stage(event) or spec
        if spec is not None and spec.inline and not self.sched.has_group(event.lane):
            self._run_inline(event, spec)
        else:
            self._submit(event)

    def _spec_of(self, type_name: str) -> HandlerSpec:
        spec = self._specs.get(type_name)
        if spec is None:
            spec = self._specs[type_name] = self.app.handler_for(type_name)
        return spec

    def _submit(self, event: Event) -> None:
        """Queue an event in its lane; its input record stays unfinished until it completes
        (a checkpoint commits up to the first unfinished record: services.worker.window)."""
        if not event.replay:
            self.ckpt.track(self.topics.input, event.partition, event.offset)
        self.sched.submit(event)

    def _stage(self, event: Event) -> HandlerSpec | None:
        """The stage handler of an event of a staged type (its group index value names the
        stage), which then runs in the lane of its group's stage; None: no handler there."""
        stages = self.app.stages_of(event.type)
        index = self.codec.catalog.entity(event.type).group_index_of
        stage = index(event.value) if stages and index is not None and event.value is not None else None
        spec = stages.get(str(stage)) if stages and stage is not None else None
        if spec is not None:
            event.stage = str(stage)
            event.lane = f"{event.group}\x00{stage}"
        return spec

    def _next_stage(self, event: Event, effects: Effects) -> None:
        """After a stage handler's effects: the entities it moved to another stage go on to
        that stage's handler (an event in that lane, the same version), once per stage."""
        passed = event.passed | {event.stage} if event.stage is not None else event.passed
        for w in effects.writes.values():
            if w.record is None or not self.app.stages_of(w.type):
                continue
            nxt = Event(w.type, w.key, w.group, w.version, "upsert", w.record, event.partition,
                        event.offset, event.timestamp, w.value or b"", event.headers)
            if self._stage(nxt) is None or nxt.stage in passed:
                continue  # no handler there, or a stage it passed already (no loops)
            nxt.passed = passed
            self.partial += 1
            self._submit(nxt)

    def _run_inline(self, event: Event, spec: HandlerSpec) -> None:
        if spec.fn is table_handler:
            self._apply_table(event)
            return
        table = self.tables[event.partition]
        if table.prior(event.entity_key, event.version) is STALE:
            self.stats.superseded += 1
            return
        self._finish(self.calls.call_sync(event, spec, table.store, False), scheduled=False)

    def _start(self, event: Event) -> None:
        """Dispatch the head event of a group (called by the scheduler)."""
        self.ckpt.open()  # (it may come after a commit, behind a call that applied nothing)
        table = self.tables.get(event.partition)
        if table is None:  # its partition went away while it waited: replayed by the new owner
            self._complete(event)
            return
        if event.op == "move-out":
            if start_move_out(self, table, event):  # else its handler call runs (moveouts.end_leave)
                self._complete(event)
            return
        if event.op == "release":
            self.stats.processed += 1  # a control record, counted as a move-out is
            self._complete(event)
            if self.releases is not None:
                self.releases.release(event)
            return
        if self.releases and self.releases.parked(event.group) and not event.replay:
            self._complete(event)  # queued before its group was parked: held too
            self.releases.hold(event)
            return
        spec = self._spec_of(event.type)
        if event.stage is not None:
            spec = self.app.stages_of(event.type)[event.stage]  # type: ignore[index]
        if spec.fn is table_handler:
            self._apply_table(event)
            self._complete(event)
            return
        # An event of a later stage has the version its earlier stage wrote: stale only if a
        # newer version came meanwhile.
        if table.prior(event.entity_key, event.version + bool(event.passed)) is STALE:
            if event.passed:
                self.stats.stage_superseded += 1
            else:
                self.stats.superseded += 1
            self._complete(event)
            return
        if spec.inline:
            self._finish(self.calls.call_sync(event, spec, table.store, False))
        else:
            self.calls.submit(event, spec, table.store)

    def _apply_table(self, event: Event) -> None:
        """The built-in table handler: apply the upsert or delete."""
        table = self.tables[event.partition]
        if event.op == "delete":
            outcome = table.write(event.entity_key, Row(event.version, True, event.group, None), None,
                                  event.offset, event.timestamp)
        else:
            outcome = table.upsert(event.entity_key, event.type.encode(), event.group,
                                   event.group.encode(), event.version, event.raw, event.value,
                                   event.offset, event.timestamp)
        self._count(outcome, event)

    def _count(self, outcome: int, event: Event) -> None:
        if outcome == APPLIED:
            self.stats.processed += 1
            self.stats.state_writes += 1
        elif outcome == STALE:
            self.stats.superseded += 1
        else:
            self._refuse_event(event, "too-large", f"the state record of {event.type} {event.key} is "
                               "over the bytes the state topic takes")

    # ------------------------------------------------------------------ handler results
    def pump(self, block: bool) -> None:
        """Dispatch ready groups and apply finished handler calls until nothing moves."""
        sched = self.sched
        while True:
            sched.dispatch(self._start)
            try:
                result = self.calls.take(0.005 if block else None)
            except queue.Empty:
                break
            self._finish(result, late=True)
            block = False
        self.stats.in_flight = sched.in_flight
        self.stats.ready_groups = sched.ready_groups
        self.stats.max_in_flight = sched.max_in_flight

    def _finish(self, result: Result, scheduled: bool = True, late: bool = False) -> None:
        event, effects, exc, retries, took = result
        if self._leaves and id(event) in self._leaves:  # a move-out's handler call
            end_leave(self, self._leaves.pop(id(event)), result)
            return
        self.stats.handler_retries += retries
        if took:  # an EWMA of the calls off the poll thread (inline ones are not timed)
            self.avg_call += 0.05 * (took - self.avg_call)
        try:
            if late and overtaken(self, event):  # superseded while it ran: none of its effects
                return
            if exc is not None:
                log.warning("handler failed for %s %s (group %s, offset %d) after %d retries: %r",
                            event.type, event.key, event.group, event.offset, retries, exc)
                if self.park_failures and not event.passed and self.releases is not None:
                    self.releases.park(event, f"{type(exc).__name__}: {exc}")
                    return
                self._refuse_event(event, "handler-error", f"{type(exc).__name__}: {exc}")
                return
            assert effects is not None
            refused = check_effects(effects, self.limits, self._state_topic, self._reserved)
            if refused is not None:
                # Kafka would refuse it on every replay: none of the call's effects are applied.
                log.warning("handler result for %s %s (group %s, offset %d) refused: %s",
                            event.type, event.key, event.group, event.offset, refused.error)
                self._refuse_event(event, refused.reason, refused.error)
                return
            self._apply(event, effects)
            if event.stage is not None:
                self._next_stage(event, effects)
            if not event.passed:
                self.stats.processed += 1  # once per input event, not per stage
        finally:
            self._complete(event, scheduled)

    def _complete(self, event: Event, scheduled: bool = True) -> None:
        """An event is done: free its lane; a replayed one lets the next held one go."""
        if scheduled:
            self.sched.complete(event)
            if not event.replay:
                self.ckpt.untrack(self.topics.input, event.partition, event.offset)
            if event.passed:
                self.partial -= 1
        if event.replay and self.releases is not None:
            self.releases.completed(event)

    def _resubmit(self, event: Event) -> None:
        """A replayed held event: into its lane (its stage's, for a staged type)."""
        if event.op == "upsert" and self.app.stages_of(event.type):
            self._stage(event)
        self.sched.submit(event)

    def resume_releases(self) -> None:
        """Groups a previous owner was releasing when it stopped: go on replaying them."""
        if self.releases is not None:
            self.releases.resume(self.tables)

    def _apply(self, event: Event, effects: Effects) -> None:
        # A call may finish after the commit that left it running: its writes (the applier
        # produces directly) go into a new transaction.
        ckpt = self.ckpt
        if not ckpt.is_open:
            ckpt.open()
        table = self.tables[event.partition]
        write = table.write
        own = event.entity_key if event.stage is not None else None
        offset, ts = event.offset, event.timestamp
        writes = effects.writes
        applied = 0
        for ekey, w in writes.items():
            # a stage handler moves its entity on at the version it has (check_effects
            # refused what is too large: each write is applied or stale)
            applied += write(ekey, Row(w.version, w.value is None, w.group, w.value), w.record,
                             offset, ts, same_version=ekey == own) == APPLIED
            if table.displaced is not None:  # its old group (this partition) hears of it: moveouts.py
                displaced_move_out(self, table, event, ekey, w)
        stats = self.stats
        stats.state_writes += applied
        stats.writes_superseded += len(writes) - applied
        if effects.outputs:
            produce = ckpt.produce
            for out in effects.outputs:
                produce(out.topic, out.value, out.key, -1, list(out.headers) or None)
            stats.outputs += len(effects.outputs)

    # ------------------------------------------------------------------ dead letters
    def refuse(self, msg: Record, reason: str, error: str) -> None:
        """Dead-letter an input record (already counted as consumed)."""
        self.dead_letter(msg.key(), msg.value(), msg.headers(), msg.topic() or "", msg.partition(),
                          msg.offset(), reason, error)

    def _refuse_event(self, event: Event, reason: str, error: str) -> None:
        # An event of a later stage: its input record is counted already (by its first
        # stage), so this dead letter is counted as a stage failure instead.
        if event.stage is not None:
            error = f"stage {event.stage}: {error}"
        self.dead_letter(event.group.encode(), event.raw, event.headers, self.topics.input,
                         event.partition, event.offset, reason, error, counted=not event.passed)
        if event.passed:
            self.stats.stage_failures += 1

    def dead_letter(self, key: bytes | None, value: bytes | None, headers: Any, topic: str,
                    partition: int, offset: int, reason: str, error: str, *, counted: bool = True) -> None:
        """Send a record to the dead-letter topic in the open transaction (cut to fit);
        ``counted``: it accounts for its input record (dead_lettered)."""
        dlq = self._dlq
        key, value, hdrs = dead_letter(key, value, headers, topic=topic, partition=partition,
                                       offset=offset, reason=reason, error=error,
                                       worker_id=self._worker_id, room=self.limits.room(dlq))
        self.ckpt.produce(dlq, value, key, -1, hdrs)
        if counted:
            self.stats.dead_lettered += 1
        self.stats.dead_letter_reasons[reason] += 1

    def drain(self) -> None:
        """Run until every consumed event is processed, superseded or dead-lettered."""
        while not self.sched.idle():
            self.pump(block=True)

    def settle(self) -> None:
        """Apply the handler calls finished so far, without waiting for the others."""
        self.pump(block=False)

    def forget(self) -> None:
        """Forget queued events after an abort (they are replayed). Handler calls still
        running would report events the scheduler no longer knows: wait for them (as a
        drain would) and drop their results."""
        self.calls.forget_completions()
        self.sched.clear()
        self._leaves.clear()
        self.partial = 0
        if self.releases is not None:
            self.releases.forget()

