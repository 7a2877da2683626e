"""The entity directory: where each entity lives, so an entity can change its FIFO group.

An entity belongs to one group, and its group decides its partition. When an event moves an
entity to another group (a reservation rebooked onto another flight), the new group's
partition may belong to another worker, which knows nothing of the copy in the old group.
Semantics (docs/formats.md, "Group changes"): **the entity's version decides**; a group
change is a delete in the old group plus an upsert in the new one, and an older version
arriving later in either group is stale.

How the move reaches the old group, exactly once like every other effect:

1. **Claim.** A write that makes an entity appear in a partition (new there, deleted
   there before, or of another group before) also produces a claim to the *directory
   topic* (compacted, keyed by entity key ``<type>/<key>``, Java-compatible murmur2
   partitioning), in the same transaction: "the entity lives in group G, partition P,
   at version V".
2. **Decide.** The owner of the directory partition (any worker: the directory topic is
   consumed by the same consumer group) keeps the winning claim per entity in RocksDB. The
   winner is the claim with the highest ``(version, live, group)`` (:func:`wins`). A new claim that
   beats a live claim of another group sends that group a **move-out** (an input record
   keyed by the old group, header ``fifolane.control: move-out``, to the old partition); a
   claim that loses sends the move-out to its own group, and the winner is written again so
   that the topic's last record per entity (what compaction keeps, and what a restore
   reads) is always the winner.
3. **Move out.** The move-out is processed in the old group's order, like any event of the
   group: if that partition's copy is older, it is deleted there (a tombstone with the
   winner's version, so older events arriving later in the old group are dropped; listeners
   see ``removed`` with ``moved_to``); if that copy is newer after all (an update raced the
   move), it claims again and the other copy is moved out instead. Each round raises the
   winning version, so this ends.

The directory's RocksDB stores are restored from the directory topic up to the consumer
group's committed offset, since the topic is both their input and their changelog.
"""

from __future__ import annotations

import base64
import json
import logging
import struct
from collections.abc import Callable
from typing import Any, NamedTuple

from services.worker.kafka import Record
from services.worker.metrics import Stats
from services.worker.state import (
    MAX_GROUP_BYTES,
    MAX_VERSION,
    MIN_VERSION,
    PartitionStore,
    RestoredRow,
    Row,
)

__all__ = [
    "CONTROL_HEADER",
    "MOVE_OUT",
    "Claim",
    "ClaimSender",
    "DirectoryApplier",
    "MoveOut",
    "claim_value",
    "move_out_record",
    "parse_move_out",
    "read_claim",
    "wins",
]

log = logging.getLogger(__name__)

#: Header of control records on the input topic, and its value for a move-out.
CONTROL_HEADER = "fifolane.control"
MOVE_OUT = b"move-out"

_CLAIM = struct.Struct(">qBi")  # version, flags, partition; then the group, UTF-8
_DELETED = 1
_PARTITION = struct.Struct(">i")
_VERSION_FLAGS = struct.Struct(">qB")  # a claim's first fields (then its partition)
#: The longest claim: no group is longer than a stored row can keep (an input record of a
#: longer group is dead-lettered), and a longer one would fail the store's commit.
_MAX_CLAIM = _CLAIM.size + MAX_GROUP_BYTES

#: Produce a record: topic, value, key, partition, headers.
Produce = Callable[..., None]


class Claim(NamedTuple):
    """Where an entity lives: its group, that group's partition, its version there."""

    group: str
    partition: int
    version: int
    deleted: bool = False

    def rank(self) -> tuple[int, bool, str]:
        return (self.version, not self.deleted, self.group)


# tuple.__new__ skips the NamedTuple's Python-level __new__: a claim is read for every
# directory record (every new entity).
_new_claim = tuple.__new__


def wins(a: Claim | tuple[int, bool, str], b: Claim | tuple[int, bool, str]) -> bool:
    """Whether ``a`` beats ``b``: the higher ``(version, live, group)`` wins. At one version a
    live copy beats a deleted one (a move-out leaves a deletion with the version of the copy
    that moved, which must not beat that copy), and ties between groups are settled the
    same way everywhere. Tuples are ``Claim.rank()`` values."""
    ra = a.rank() if isinstance(a, Claim) else a
    rb = b.rank() if isinstance(b, Claim) else b
    return ra > rb


def claim_value(group: str, partition: int, version: int, deleted: bool) -> bytes:
    """The directory record value of a claim."""
    return _CLAIM.pack(version, _DELETED if deleted else 0, partition) + group.encode()


def read_claim(value: bytes | None) -> Claim | None:
    """A directory record value as a claim (None if it is not one)."""
    if value is None or not _CLAIM.size <= len(value) <= _MAX_CLAIM:
        return None
    version, flags, partition = _CLAIM.unpack_from(value)
    try:
        group = value[_CLAIM.size :].decode()
    except UnicodeDecodeError:
        return None
    return _new_claim(Claim, (group, partition, version, bool(flags & _DELETED)))


def restored_row(msg: Record, _raw: bool) -> RestoredRow | None:
    """A directory record as a store row (the restore's reader)."""
    claim = read_claim(msg.value())
    key = msg.key()
    if claim is None or not key:
        return None
    return (key, claim.version, claim.deleted, claim.group, _PARTITION.pack(claim.partition))


def _claim_of(row: Row) -> Claim:
    partition = _PARTITION.unpack(row.value)[0] if row.value else -1
    return _new_claim(Claim, (row.group, partition, row.version, row.deleted))


class ClaimSender:
    """Sends claims (step 1 of the module docstring) in the open transaction: called as
    ``(partition, entity key, group, version, deleted)`` for every entity that appears in a
    partition (half the events of a stream of new entities, so compiled, not a closure)."""

    def __init__(self, topic: str, produce: Produce, stats: Stats) -> None:
        self._topic = topic
        self._produce = produce
        self._stats = stats

    def __call__(self, partition: int, ekey: bytes, group: str, version: int, deleted: bool) -> None:
        self._produce(self._topic, claim_value(group, partition, version, deleted), ekey)
        self._stats.claims_sent += 1


class MoveOut(NamedTuple):
    """A move-out: the entity ``key`` (``<type>/<key>``) must leave group ``group`` unless its
    copy there beats the winner: the copy in ``to_group`` at ``version`` (deleted there if
    ``to_deleted``)."""

    key: bytes
    group: str
    version: int
    to_group: str
    to_deleted: bool
    #: the copy's encoded value when the new group's write replaced it in the same partition
    #: (the old group's app handler reads it: services/worker/moveouts.py); None otherwise
    copy: bytes | None = None


def move_out_record(move: MoveOut) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """Key, value and headers of a move-out input record."""
    fields: dict[str, Any] = {"key": move.key.decode(), "version": move.version, "to": move.to_group,
                              "to_deleted": move.to_deleted}
    if move.copy is not None:
        fields["copy"] = base64.b64encode(move.copy).decode()
    return move.group.encode(), json.dumps(fields, separators=(",", ":")).encode(), [(CONTROL_HEADER, MOVE_OUT)]


def parse_move_out(group: str, value: bytes | None) -> MoveOut | str:
    """A move-out record's content, or why it is not one."""
    try:
        body: Any = json.loads(value or b"")
        key, version, to = body["key"], body["version"], body["to"]
        to_deleted = bool(body.get("to_deleted", False))
        copy = body.get("copy")
        copy = None if copy is None else base64.b64decode(copy, validate=True)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"malformed move-out record: {exc}"
    if not isinstance(key, str) or "/" not in key or type(version) is not int or not isinstance(to, str):
        return "malformed move-out record: needs key '<type>/<key>', integer version and group 'to'"
    if not MIN_VERSION <= version <= MAX_VERSION:
        return f"malformed move-out record: version {version} is not a signed 64-bit integer"
    return MoveOut(key.encode(), group, version, to, to_deleted, copy)


class DirectoryApplier:
    """Decides the claims of one directory partition (step 2 of the module docstring)."""

    def __init__(self, store: PartitionStore, topic: str, input_topic: str, produce: Produce,
                 stats: Stats, input_has: Callable[[int], bool] | None = None) -> None:
        self.store = store
        self.partition = store.partition
        self._topic = topic
        self._input = input_topic
        self._produce = produce
        self.stats = stats
        self._input_has = input_has  # whether the input topic has a partition (None: assumed)
        # Staging a write is setting its row (no group index in a directory store).
        self._overlay = None if store.group_index else store.overlay

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        if not key or value is None or not _CLAIM.size <= len(value) <= _MAX_CLAIM:
            log.warning("directory %s[%d]: ignoring a record that is not a claim", self._topic, self.partition)
            return
        row = self.store.get(key)
        if row is None and self._overlay is not None:
            # The common case, an entity the directory has not seen: the claim wins as it is
            # (its partition field is the row's value: both are ">i"), with no Claim built.
            try:
                group = value[_CLAIM.size :].decode()
            except UnicodeDecodeError:
                group = None
            if group is not None:
                self.stats.claims += 1
                version, flags = _VERSION_FLAGS.unpack_from(value)
                self._overlay[key] = Row(version, bool(flags & _DELETED), group,
                                         value[_VERSION_FLAGS.size : _CLAIM.size])
                return
        claim = read_claim(value)
        if claim is None:
            log.warning("directory %s[%d]: ignoring a record that is not a claim", self._topic, self.partition)
            return
        self.stats.claims += 1
        cur = None if row is None else _claim_of(row)
        if cur == claim:
            return  # the winner written again (or a repeated claim)
        if cur is None or (cur.group == claim.group and claim.version >= cur.version) \
                or (cur.group != claim.group and wins(claim, cur)):
            self.store.put(key, _row(claim), row)
            if cur is not None and cur.group != claim.group and not cur.deleted:
                self._move_out(MoveOut(key, cur.group, claim.version, claim.group, claim.deleted),
                               cur.partition)
            return
        # The claim loses: keep the winner as the entity's last directory record.
        self._produce(self._topic, claim_value(cur.group, cur.partition, cur.version, cur.deleted),
                      key, self.partition)
        if claim.group != cur.group and not claim.deleted:
            self._move_out(MoveOut(key, claim.group, cur.version, cur.group, cur.deleted), claim.partition)

    def _move_out(self, move: MoveOut, partition: int) -> None:
        if self._input_has is not None and not self._input_has(partition):
            log.warning("directory %s[%d]: a claim put %s in group %r of partition %d, which %s does not "
                        "have (a forged claim): no move-out sent", self._topic, self.partition,
                        move.key.decode(errors="replace"), move.group, partition, self._input)
            return
        key, value, headers = move_out_record(move)
        self._produce(self._input, value, key, partition, headers)
        self.stats.moves_sent += 1


def move_out(table: Any, move: MoveOut, partition: int, offset: int, ts: int,
             claim: Callable[[bytes, str, int, bool], None]) -> bool:
    """Step 3 of the module docstring in the old group's partition (``table``: its
    :class:`services.worker.table.TableApplier`). True if the copy here was removed."""
    old = table.latest(move.key)
    here = None if old is None else Claim(old.group, partition, old.version, old.deleted)
    if here is not None and wins(here, (move.version, not move.to_deleted, move.to_group)):
        # The copy here is newer (an update raced the move): it wins, the other one goes.
        claim(move.key, here.group, here.version, here.deleted)
        return False
    if here is not None and here.group != move.group:
        # The entity moved on to another group of this partition meanwhile (its claim tells
        # the directory): this move-out is not about that copy.
        return False
    # Remove it here, keeping the winner's version so older events of this group are stale.
    gone = Row(move.version, True, old.group if old is not None else move.group, None)
    # (a deletion that won in another group is no move: its listeners get a plain `removed`)
    table.write(move.key, gone, None, offset, ts, moved_to=move.to_group, deleted_there=move.to_deleted)
    table.stats.state_writes += 1
    return old is not None and not old.deleted


def _row(claim: Claim) -> Row:
    return Row(claim.version, claim.deleted, claim.group, _PARTITION.pack(claim.partition))
