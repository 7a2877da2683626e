"""A move-out meets the app's handler: the old group hears that the entity left.

A group change is a delete in the old group plus an upsert in the new one
(docs/formats.md, "Group changes"). The new group's handler sees the upsert. The old group's
copy is removed by the move-out (services/worker/directory.py), which once bypassed the
app: a flight whose reservation was rebooked onto another flight kept its seats sold. Now,
when the move-out removes a live copy, the type's own handler is called first with a delete
of the entity in the old group, at the winning version, in the old group's order (stage
handlers are not called). An inline handler runs on the poll thread, as for any event; any
other handler runs off it (a pool thread, or the event loop for an ``async`` one), so a slow
or hung handler holds its own group only, as for any event. If the entity's row here changes
while a call for the live copy runs (another group of this partition took it), the call's
result is dropped and the move-out is decided again from the row as it is now. Its other effects (the flight's
seats) are applied; its write of the entity itself is left to the move-out, which removes
the copy (listeners see ``removed`` with ``moved_to``) whatever the handler did. A handler
that fails is logged and its move-out record dead-lettered (reason ``handler-error``, or
``too-large`` / ``bad-version`` for a result that cannot be written; not an input event:
counted by its reason only); the copy is removed all the same.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from services.worker.app import Event, HandlerSpec, table_handler
from services.worker.calls import Result
from services.worker.directory import MoveOut, move_out, move_out_record, wins
from services.worker.effects import Write, check_effects
from services.worker.state import Row
from services.worker.table import STALE, TableApplier

__all__ = ["Leave", "displaced_move_out", "end_leave", "leave_call", "leave_result", "loses_here",
           "overtaken", "remove", "start_move_out"]

log = logging.getLogger(__name__)


class Leave(NamedTuple):
    """A handler call for an entity leaving its group: ``gone`` is the delete the handler
    gets, ``event`` the move-out record's event, ``before`` the entity's row when it began."""

    event: Event
    move: MoveOut
    gone: Event
    seed: dict[bytes, Write] | None
    before: Row | None


def start_move_out(proc: Any, table: TableApplier, event: Event) -> bool:
    """Apply a move-out record (``event``) in the old group's partition (``proc``: the
    worker's Processing): the type's handler first if it removes a live copy, then the
    removal. True when done; False when the handler call was started off the poll thread
    instead (a slow handler on a leave then holds its own group only, not the worker):
    :func:`end_leave` ends it."""
    spec: HandlerSpec | None = proc._spec_of(event.type)
    if spec is not None and (spec.fn is table_handler or event.type in proc._staged):
        spec = None
    leave = leave_call(proc, table, event, spec)
    if leave is not None and spec is not None:
        if not spec.inline:
            proc._leaves[id(leave.gone)] = leave
            proc.calls.submit(leave.gone, spec, table.store, leave.seed)
            return False
        leave_result(proc, table, leave, proc.calls.call_now(leave.gone, spec, table.store, leave.seed))
    remove(proc, table, event)
    return True


def end_leave(proc: Any, leave: Leave, result: Result) -> None:
    """The handler call of ``leave`` finished: apply its result and the removal. If it was
    called for the live copy here and the entity's row changed while it ran (a write of
    another group in this partition took the copy, and sends a move-out carrying it), nothing
    of it is applied and the move-out is decided again (once: the copy is not here any more).
    A call for a copy the move-out carries read that copy, not the row, which belongs to the
    new group and may change as often as it likes meanwhile."""
    event = leave.event
    table = proc.tables.get(event.partition)
    if table is not None and leave.seed is None and table.latest(leave.move.key) != leave.before:
        log.info("%s %s changed while its handler ran for leaving group %s: deciding again",
                 event.type, event.key, event.group)
        if not start_move_out(proc, table, event):
            return
    elif table is not None:
        leave_result(proc, table, leave, result)
        remove(proc, table, event)
    proc._complete(event)


def remove(proc: Any, table: TableApplier, event: Event) -> None:
    """The move-out's own step: remove the old group's copy if it loses (directory.move_out).
    ``proc._claim`` is None for a worker run ``--no-directory``, which meets a directory's
    move-out only from others."""
    claim = proc._claim

    def claim_here(ekey: bytes, group: str, version: int, deleted: bool) -> None:
        if claim is not None:
            claim(event.partition, ekey, group, version, deleted)

    removed = move_out(table, _move_of(event), event.partition, event.offset, event.timestamp, claim_here)
    proc.stats.processed += 1
    proc.stats.moves_applied += int(removed)


def _move_of(event: Event) -> MoveOut:
    assert event.value is not None
    return MoveOut(event.entity_key, event.group, event.version, str(event.value["to"]),
                   bool(event.value["to_deleted"]), event.value.get("copy"))


def leave_call(proc: Any, table: TableApplier, event: Event, spec: HandlerSpec | None) -> Leave | None:
    """The handler call a move-out makes, if it removes a live copy (or carries a genuine
    one) and the type has a handler; else None."""
    if spec is None:
        return None
    move = _move_of(event)
    copy = _genuine_copy(proc, table, event, move)
    if copy is None and not loses_here(table, move):
        return None
    gone = Event(event.type, event.key, event.group, move.version, "delete", None, event.partition,
                 event.offset, event.timestamp, event.raw, event.headers, event.group)
    seed = None
    if copy is not None and move.copy is not None:  # the handler reads this one
        seed = {move.key: Write(event.type, event.key, event.group, move.version - 1, move.copy, copy)}
    return Leave(event, move._replace(copy=None if copy is None else move.copy), gone, seed,
                 table.latest(move.key))


def loses_here(table: TableApplier, move: MoveOut) -> bool:
    """Whether the move-out removes a live copy of the entity in its group here (the
    decision of services.worker.directory.move_out, read without acting)."""
    old = table.latest(move.key)
    if old is None or old.deleted or old.group != move.group:
        return False
    return not wins((old.version, True, old.group), (move.version, not move.to_deleted, move.to_group))


def _genuine_copy(proc: Any, table: TableApplier, event: Event, move: MoveOut) -> dict[str, Any] | None:
    """The record of the copy a move-out carries, if it is one this partition replaced: the
    entity has a row here at the move's version or newer (the replacing write's, or a later
    one's: the entity may have moved on, or back), and the copy decodes to this entity of the
    old group. Anything else (none, forged, damaged) is None."""
    if move.copy is None:
        return None
    row = table.latest(move.key)
    if row is None or row.version < move.version:
        log.warning("move-out of %s %s from %s carries a copy this partition did not replace: ignored",
                    event.type, event.key, event.group)
        return None
    try:
        record: dict[str, Any] = proc.calls.decode_value(move.copy)
        et = proc.codec.catalog.entity(event.type)
        ok = str(et.key_of(record)) == event.key and str(et.group_of(record)) == event.group
    except Exception as bad:  # noqa: BLE001 - a damaged copy: as if it had none
        log.warning("move-out of %s %s: its copy cannot be read (%s): ignored", event.type, event.key, bad)
        return None
    return record if ok else None


def leave_result(proc: Any, table: TableApplier, leave: Leave, result: Result) -> None:
    """Apply the result of the handler called with the delete the move-out makes in the old
    group (``proc``: the worker's Processing): its effects but its write of the entity, or a
    dead letter if it failed."""
    event, move, gone = leave.event, leave.move, leave.gone
    _ev, effects, exc, retries, _took = result
    proc.stats.handler_retries += retries
    error = None if exc is None else f"{type(exc).__name__}: {exc}"
    reason = "handler-error"
    if effects is not None:
        effects.writes.pop(move.key, None)  # the move-out removes the copy itself
        refused = check_effects(effects, proc.limits, proc._state_topic, proc._reserved)
        if refused is None:
            proc.leaving = True  # its writes send no move-out of their own (no chains of them)
            try:
                proc._apply(gone, effects)
            finally:
                proc.leaving = False
            return
        error, reason = refused.error, refused.reason
    log.warning("handler for %s %s leaving group %s (move-out at offset %d) failed: %s; the copy is "
                "removed all the same", event.type, event.key, event.group, event.offset, error)
    proc.dead_letter(event.group.encode(), event.raw, event.headers, proc.topics.input, event.partition,
                     event.offset, reason, f"on leaving group {event.group}: {error}", counted=False)


def displaced_move_out(proc: Any, table: TableApplier, event: Event, ekey: bytes, w: Write) -> None:
    """A handler's write ``w`` replaced the live copy of another group in this partition
    (``table.displaced``): if the entity's type has an app handler, that group gets a move-out
    record carrying the copy, in this transaction, so that its handler hears of it in its own
    order (the directory's move-out finds the copy gone, and calls nobody)."""
    old = table.displaced
    table.displaced = None
    if old is None or old.value is None:
        return
    if proc.leaving:  # a handler called for a leave replaced yet another copy: no chain
        log.warning("a handler called as %s left group %s replaced the copy of %s in group %s: that "
                    "group's handler is not called", w.key, event.group, ekey.decode(errors="replace"), old.group)
        return
    spec = proc._spec_of(w.type)
    if spec.fn is table_handler or w.type in proc._staged:
        return
    key, value, headers = move_out_record(MoveOut(ekey, old.group, w.version, w.group, w.value is None, old.value))
    proc.ckpt.produce(proc.topics.input, value, key, event.partition, headers)
    proc.stats.moves_sent += 1


def overtaken(proc: Any, event: Event) -> bool:
    """Whether a newer version of the event's entity came in another group while its handler
    call ran (off the poll thread): then the event is superseded, as if it had come after
    that one, and none of its effects are applied. (Only its stale write was dropped once: a
    reservation rebooked away while its old flight's call ran left that flight its seats.)"""
    table = proc.tables.get(event.partition)
    if table is None or table.prior(event.entity_key, event.version + bool(event.passed)) is not STALE:
        return False
    proc.stats.superseded += not event.passed
    proc.stats.stage_superseded += bool(event.passed)
    return True
