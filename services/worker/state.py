"""Per-partition entity state: RocksDB underneath, an uncommitted overlay on top.

Layout of one partition's RocksDB (raw bytes keys):

    e:<type>/<key>            -> row: version (i64) | flags (u8) | len(group) (u16) | group | value
                                 or a raw row: RAW_VERSION | RAW flag | 0 | value
    i:<group>\\x00<type>/<key> -> b""      (group index, for GroupState.scan)
    m:changelog               -> next state-topic offset already reflected here (i64)
    m:group-index             -> b"1" if the group index is kept, b"0" if not
    m:source                  -> the changelog it was built from: topic \\x00 topic id (restore.py)
    m:written-at              -> wall-clock ms of the last committed write (i64): a restore
                                 replays the changelog from m:changelog only if no tombstone
                                 written since could have been compacted away

The group index serves ``GroupState.scan`` of app handlers; a table-only worker does not
keep it (a RocksDB write less per new entity), and rebuilds the store when an app needs it.

Writes of the current checkpoint live in an in-memory overlay and reach RocksDB in one
WriteBatch only after the Kafka transaction that carries them has committed. RocksDB is
therefore never ahead of the changelog, and a crash needs no local undo: the restore on
assignment replays the changelog from the stored offset.

RocksDB's write-ahead log is off (as in Kafka Streams) unless query readers' secondaries
read the store through it: the changelog is the log. A crash loses the writes since the last
memtable flush; what survives is a prefix of the batches with its own ``m:changelog``, from
which the restore replays the rest. A clean close flushes first.

A restore of a store without a group index writes raw rows: the changelog's value, its version and
group read only when first read (:meth:`PartitionStore.unpack`): most rows of a large table never are.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import rocksdict
from rocksdict import BlockBasedOptions, Cache, Options, Rdict, WriteBatch, WriteBufferManager

from fifolane.errors import StateError
from services.worker.rows import (
    FLAG_DELETED,
    FLAG_RAW,
    MAX_GROUP_BYTES,
    MAX_VERSION,
    MIN_VERSION,
    RAW_HEADER,
    RAW_VERSION,
    ROW,
    ROW_VERSION,
    RestoredRow,
    Row,
    index_key,
)
from services.worker.storedirs import drop, make_root

__all__ = [
    "MAX_GROUP_BYTES", "MAX_VERSION", "MIN_VERSION", "RAW_VERSION", "ROW_VERSION", "PartitionStore",
    "RestoredRow", "Row", "StoreManager", "ValueReader",
]

log = logging.getLogger(__name__)

_OFFSET = struct.Struct(">q")
#: ``value -> (version, group)`` of an entity value, or None if it is not one.
ValueReader = Callable[[bytes], "tuple[int, str] | None"]
_META_CHANGELOG = b"m:changelog"
_META_GROUP_INDEX = b"m:group-index"
_META_WRITTEN_AT = b"m:written-at"
#: Rows of recent commits a partition keeps in memory (see PartitionStore.recent).
RECENT_ROWS = 10_000


class PartitionStore:
    """The state of one input partition: committed rows in RocksDB plus pending ones."""

    def __init__(self, db: Rdict, partition: int, path: Path, group_index: bool = True,
                 read_value: ValueReader | None = None) -> None:
        self.db = db
        self.read_value = read_value  # None: raw rows cannot be read, so none are written
        self.partition = partition
        self.path = path
        self.group_index = group_index
        self.overlay: dict[bytes, Row] = {}
        #: rows of the last commits, as they are in RocksDB now: the entities written lately
        #: are the ones read next (a flight's load, for each of its reservations), and a
        #: dict read costs far less than a RocksDB one. At most RECENT_ROWS; cleared whenever
        #: RocksDB is written another way (a restore).
        self.recent: dict[bytes, Row] = {}
        #: keys RocksDB has no row of (a new entity is looked up by its stale check, the handler
        #: and the write); ``generation`` counts RocksDB's writes (see note_absent)
        self.absent: set[bytes] = set()
        self.generation = 0
        # previous committed group of overlay keys whose group changed (index clean-up)
        self._moved: dict[bytes, str] = {}
        # overlay keys that need a group-index entry (new entities, or moved to another group)
        self._indexed: set[bytes] = set()
        self.unsent: dict[bytes, None] = {}  # overlay keys whose state record waits (table.py)

    # -- reads ------------------------------------------------------------------------
    def get(self, ekey: bytes) -> Row | None:
        """Latest row, pending writes first; deleted rows are returned (they keep a version)."""
        row = self.overlay.get(ekey) or self.recent.get(ekey)
        if row is not None:
            return row
        if ekey in self.absent:
            return None
        generation = self.generation
        data = self.db.get(b"e:" + ekey)
        if data is None:
            self.note_absent(ekey, generation)
            return None
        return self.unpack(data)

    def note_absent(self, ekey: bytes, generation: int) -> None:
        """RocksDB had no row of ``ekey`` at ``generation`` (read before the lookup): noted
        unless RocksDB was written since (checked again after: a writer bumps it first)."""
        absent = self.absent
        if len(absent) >= RECENT_ROWS:
            absent.clear()
        if generation == self.generation:
            absent.add(ekey)
            if generation != self.generation:
                absent.discard(ekey)

    def unpack(self, data: bytes) -> Row | None:
        """A stored row; a raw one is read from its value now (None if that fails: the
        changelog record was not an entity value, and a restore skips those)."""
        if data[8] & FLAG_RAW:  # the flags byte
            value = data[ROW.size:]
            found = self.read_value(value) if self.read_value is not None else None
            if found is None:
                log.warning("partition %d: a restored record is not an entity value; ignored", self.partition)
                return None
            return Row(found[0], False, found[1], value)
        return Row.unpack(data)

    def is_empty(self) -> bool:
        it = self.db.iter()
        it.seek(b"e:")
        return not (it.valid() and it.key().startswith(b"e:"))

    def committed_version(self, ekey: bytes) -> int | None:
        row = self.unpack(data) if (data := self.db.get(b"e:" + ekey)) is not None else None
        return None if row is None else row.version

    def scan_group(self, group: str, prefix: bytes = b"") -> Iterator[tuple[bytes, Row]]:
        """Live (not deleted) entities of a group, optionally of keys starting with prefix."""
        if not self.group_index:
            raise StateError("this store keeps no group index (the worker has no app handlers)")
        seen: set[bytes] = set()
        start = index_key(group, prefix)
        it = self.db.iter()
        it.seek(start)
        while it.valid():
            k = it.key()
            if not k.startswith(start):
                break
            ekey = k[len(start) - len(prefix) :]
            seen.add(ekey)
            row = self.get(ekey)
            if row is not None and not row.deleted and row.group == group:
                yield ekey, row
            it.next()
        for ekey, row in list(self.overlay.items()):
            if ekey not in seen and ekey.startswith(prefix) and row.group == group and not row.deleted:
                yield ekey, row

    def iter_committed(self, after: bytes | None = None) -> Iterator[tuple[bytes, Row]]:
        """Every committed live entity (a consistent RocksDB snapshot), in key order;
        with ``after``, only the entities whose key sorts after it (resumable scans)."""
        snap = self.db.snapshot()
        it = snap.iter()
        it.seek(b"e:" if after is None else b"e:" + after + b"\x00")
        while it.valid():
            k = it.key()
            if not k.startswith(b"e:"):
                break
            row = self.unpack(it.value())
            if row is not None and not row.deleted:
                yield k[2:], row
            it.next()

    # -- writes -----------------------------------------------------------------------
    def put(self, ekey: bytes, row: Row, prev: Row | None) -> None:
        """Stage a write; it reaches RocksDB at :meth:`commit`.

        ``prev`` is the entity's latest row as returned by :meth:`get` (the caller has it
        from its stale check); it tells whether the group index needs an entry.
        """
        if not self.group_index:
            pass
        elif prev is None:
            if ekey not in self.overlay:
                self._indexed.add(ekey)
        elif prev.group != row.group:
            self._indexed.add(ekey)
            self._moved.setdefault(ekey, prev.group)
        self.overlay[ekey] = row

    def commit(self, changelog_offset: int | None) -> None:
        """Persist the staged writes (after their Kafka transaction committed)."""
        self.apply(self.prepare(), changelog_offset)

    def prepare(self) -> WriteBatch | None:
        """The staged writes as a RocksDB batch (None if there are none), not yet written.

        The worker builds it while its Kafka commit is on the wire and writes it with
        :meth:`apply` once that commit succeeded (or drops it with :meth:`rollback`).
        """
        if not self.overlay:
            return None
        wb = WriteBatch(raw_mode=True)
        put = wb.put
        for ekey, row in self.overlay.items():
            put(b"e:" + ekey, row.pack())
        for ekey in self._indexed:
            put(index_key(self.overlay[ekey].group, ekey), b"")
        for ekey, old_group in self._moved.items():
            if self.overlay[ekey].group != old_group:  # moved away (and not back again)
                wb.delete(index_key(old_group, ekey))
        return wb

    def apply(self, wb: WriteBatch | None, changelog_offset: int | None) -> None:
        """Write a batch from :meth:`prepare` (plus the changelog marker) and clear the overlay."""
        if changelog_offset is not None:
            if wb is None:
                wb = WriteBatch(raw_mode=True)
            wb.put(_META_CHANGELOG, _OFFSET.pack(changelog_offset))
        if wb is not None:
            wb.put(_META_WRITTEN_AT, _OFFSET.pack(int(time.time() * 1000)))
            self.db.write(wb)
            self.generation += 1  # before the notes of its keys go (note_absent)
        recent = self.recent
        if len(recent) + len(self.overlay) > RECENT_ROWS:
            recent.clear()
        recent.update(self.overlay)
        self.absent.difference_update(self.overlay)  # in RocksDB now
        self.rollback()  # staged writes are committed now: clear them

    def rollback(self) -> None:
        """Forget the staged writes (their transaction aborted)."""
        for staged in (self.overlay, self._moved, self._indexed, self.unsent):
            staged.clear()

    # -- changelog restore ------------------------------------------------------------
    @property
    def changelog_offset(self) -> int:
        data = self.db.get(_META_CHANGELOG)
        return 0 if data is None else _OFFSET.unpack(data)[0]

    @property
    def written_at_ms(self) -> int | None:
        """Wall-clock ms of the last write of this store's owner (None: never written)."""
        data = self.db.get(_META_WRITTEN_AT)
        return None if data is None else _OFFSET.unpack(data)[0]

    def restore_batch(self, rows: list[RestoredRow], next_offset: int, *, fresh: bool = False) -> None:
        """Apply changelog records directly (restore runs before any processing).

        ``rows`` are ``(entity key, version, deleted, group, value)``, packed here without a
        :class:`Row` in between (a restore writes every entity of the partition).
        ``fresh``: the store started empty, so there is no earlier group index to clean up.
        """
        self.recent.clear()
        wb = WriteBatch(raw_mode=True)
        put = wb.put
        pack = ROW.pack
        index = self.group_index
        for ekey, version, deleted, group, value in rows:
            if version is None:
                assert not index and self.read_value is not None, "raw rows need a value reader, no index"
                put(b"e:" + ekey, RAW_HEADER + value)  # type: ignore[operator]
                continue
            g = group.encode()
            if index and not fresh:
                old = self.db.get(b"e:" + ekey)
                if old is not None:
                    old_row = self.unpack(old)
                    if old_row is not None and old_row.group != group:
                        wb.delete(index_key(old_row.group, ekey))
            if deleted:
                put(b"e:" + ekey, pack(version, FLAG_DELETED, len(g)) + g)
            else:
                put(b"e:" + ekey, pack(version, 0, len(g)) + g + value)  # type: ignore[operator]
            if index:
                put(index_key(group, ekey), b"")
        wb.put(_META_CHANGELOG, _OFFSET.pack(next_offset))
        wb.put(_META_WRITTEN_AT, _OFFSET.pack(int(time.time() * 1000)))
        self.db.write(wb)
        self.generation += 1  # before the notes go: a miss read before the write is not noted
        self.absent.clear()


class StoreManager:
    """Opens one RocksDB per assigned partition, all sharing one block cache and one write-buffer
    budget (memory bounded however many partitions a worker owns); ``owner``: claims the root."""

    def __init__(self, state_dir: Path, name: str, cache_mb: int = 64, write_buffer_mb: int = 64,
                 group_index: bool = True, read_value: ValueReader | None = None,
                 marks: Callable[[int], int | None] | None = None, wal: bool = False, owner: str | None = None) -> None:
        self.root = state_dir / name
        self._write = rocksdict.WriteOptions()  # the write-ahead log: see the module docstring
        setattr(self._write, "disable_wal", not wal)  # noqa: B010 - a property, a method in the stubs
        #: partition -> the changelog's end now, for the restore marker (None: unknown now)
        self.marks = marks
        #: called with a partition before its store closes (a snapshot's reader lets go first)
        self.before_close: Callable[[int], None] | None = None
        self._next_marker = 0.0
        self.group_index, self.read_value = group_index, read_value
        make_root(self.root, owner)  # owner: one worker process per state directory (storedirs.claim)
        self._cache = Cache(cache_mb << 20)
        self._wbm = WriteBufferManager.new_write_buffer_manager_with_cache(write_buffer_mb << 20, False, self._cache)
        self.stores: dict[int, PartitionStore] = {}

    def _options(self) -> Options:
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        table = BlockBasedOptions()
        table.set_block_cache(self._cache)
        # A new entity's stale check misses: the bloom filter answers without reading blocks (~2.5x faster).
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_manager(self._wbm)
        opts.set_max_open_files(64)
        return opts

    def open(self, partition: int) -> PartitionStore:
        store = self.stores.get(partition)
        if store is None:
            path = self.root / f"p{partition}"
            db = Rdict(str(path), self._options())
            db.set_write_options(self._write)
            want = b"1" if self.group_index else b"0"
            store = PartitionStore(db, partition, path, self.group_index, self.read_value)
            # Stores written before the flag existed always kept the index.
            kept = db.get(_META_GROUP_INDEX) or (want if store.is_empty() else b"1")
            if kept != want and self.group_index:
                log.info("partition %d: local state has no group index, rebuilding from the changelog", partition)
                db.close()
                drop(path)
                return self.open(partition)  # empty now
            db.put(_META_GROUP_INDEX, want)
            self.stores[partition] = store
        return store

    def close(self, partition: int) -> None:
        if self.before_close is not None and partition in self.stores:
            self.before_close(partition)
        store = self.stores.pop(partition, None)
        if store is not None:
            store.rollback()
            store.db.close()

    def wipe(self, partition: int) -> PartitionStore:
        """Drop a partition's local state (it no longer matches the changelog) and reopen."""
        self.close(partition)
        drop(self.root / f"p{partition}")
        return self.open(partition)

    # -- a checkpoint's staged state (services.worker.checkpoint.Staged) -------------------
    def prepare(self) -> object:
        """The staged writes of every store as RocksDB batches (not written yet)."""
        return {p: store.prepare() for p, store in list(self.stores.items())}  # restores open stores meanwhile

    def apply(self, prepared: object) -> None:
        """Write the batches of :meth:`prepare` (their transaction committed).

        Every 30 s the batch also records each store's changelog end as its restore start:
        we are the partition's only writer and all we wrote is committed. (An older marker
        only makes the next restore read a little more; each costs a round trip.)
        """
        assert isinstance(prepared, dict)
        now = time.monotonic()
        refresh = self.marks is not None and now >= self._next_marker
        if refresh:
            self._next_marker = now + 30.0
        # Only stores this checkpoint wrote to are marked (active). A store being restored (its
        # thread opens stores meanwhile: iterate a copy) writes its own marker.
        for p, store in list(self.stores.items()):
            batch = prepared.get(p)
            marker = None
            if refresh and batch is not None and self.marks is not None:
                marker = self.marks(p)
                if marker is None:
                    self._next_marker = now  # not known now (leader moving): try next time
            store.apply(batch, marker)

    def rollback(self) -> None:
        """Forget every staged write (their transaction aborted)."""
        for store in list(self.stores.values()):
            store.rollback()

    def close_all(self) -> None:
        for p in list(self.stores):
            self.close(p)
