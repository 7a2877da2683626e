"""What a query reader reads: secondary instances of the worker's stores, at published views.

A :class:`Secondary` is one partition's pair of RocksDB secondary instances (services/
worker/query/reader.py) and the views the worker published of the store: RocksDB sequence
number -> position. Reads go to the *current* instance, which always stands exactly at a
published sequence. When a newer view is published the *spare* catches up with the worker's
store (``try_catch_up_with_primary``); a catch-up reaches whatever the store holds, often a
commit whose position is not resolved yet, so the spare becomes current only once it stands
at a published sequence, and until then reads keep the current one's view. Two instances,
because one would have to stop answering whenever it caught up too far (under load, 40% of
the reads in the ``query`` benchmark). :class:`ReaderLocal` is what
:class:`services.worker.query.answers.Answers` reads in a reader process.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Callable
from typing import Any

from rocksdict import Rdict

from services.worker.query.members import MemberInfo, Routing
from services.worker.query.views import View, Views
from services.worker.state import Row

__all__ = ["ReaderLocal", "Secondary"]

log = logging.getLogger(__name__)

#: published (seq -> position) pairs a partition remembers: a secondary that caught up to
#: a sequence whose view is published later still finds it
_KEEP = 64


class _Get:
    """``snap[key]`` of a view, for :func:`services.worker.query.reads.row_at`: the live
    secondary (nothing changes it between two catch-ups, which run on the loop's thread)."""

    __slots__ = ("get",)

    def __init__(self, db: Rdict) -> None:
        self.get = db.get

    def __getitem__(self, key: bytes) -> bytes | None:
        data: bytes | None = self.get(key)
        return data


class _Instance:
    """One secondary instance of a store.

    An instance that misses a flush's WAL (the worker flushed a memtable, wrote more and
    flushed again between two catch-ups) keeps the older rows of its own memtable in front of
    the newer ones of the flushed files: RocksDB answers the old value, at the new sequence
    number. Every flush makes a new table file (and a compaction of it another), so when a
    catch-up finds a table file it has not seen, the instance is opened again, which reads
    the files and the live WAL afresh (``test_query_secondary``). An instance that fails to
    catch up or to open is closed, and opened again at its next catch-up.
    """

    def __init__(self, open_db: Callable[[str], Rdict], where: str) -> None:
        self._open_db = open_db
        self.where = where
        self.db: Rdict | None = None
        self.seq = -1
        self._files: set[str] = set()
        self.view: View | None = None  # the view it stands at, once current
        self.reopened = 0
        self._open()

    def _open(self) -> None:
        self.db = db = self._open_db(self.where)
        self._files = {f["name"] for f in db.live_files()}
        self.seq = db.latest_sequence_number()

    def close(self) -> None:
        db, self.db, self.seq, self.view = self.db, None, -1, None
        if db is not None:
            with contextlib.suppress(Exception):  # closed already: nothing to release
                db.close()

    def catch_up(self) -> None:
        try:
            db = self.db
            if db is None:
                self._open()
                self.reopened += 1
                return
            db.try_catch_up_with_primary()
            files = {f["name"] for f in db.live_files()}
            if files - self._files:
                self.close()
                self._open()
                self.reopened += 1
                return
            self._files = files
            self.seq = db.latest_sequence_number()
        except Exception:
            self.close()
            raise


class Secondary:
    """One partition's secondary instances and the views the worker published for it (see
    the module docstring)."""

    def __init__(self, p: int, path: str, open_db: Callable[[str], Rdict], where: str,
                 unpack: Callable[[bytes], Row | None]) -> None:
        self.p = p
        self.path = path
        self.unpack = unpack
        self._pair = (_Instance(open_db, where + ".a"), _Instance(open_db, where + ".b"))
        self._current: int | None = None  # which of the pair reads go to
        #: RocksDB sequence -> the position of the view published at it
        self.published: dict[int, int] = {}
        self.newest = -1  # the highest published sequence

    @property
    def reopened(self) -> int:
        return self._pair[0].reopened + self._pair[1].reopened

    def publish(self, seq: int, position: int) -> None:
        self.published[seq] = position
        self.newest = max(self.newest, seq)
        if len(self.published) > _KEEP:
            for s in sorted(self.published)[:-_KEEP]:
                del self.published[s]

    def view(self) -> View | None:
        """The newest published view an instance stands at (None: none yet)."""
        c = self._current
        cur = None if c is None else self._pair[c]
        at = -1 if cur is None else cur.seq
        if self.newest > at:
            s = 0 if c is None else 1 - c
            spare = self._pair[s]
            if spare.seq < self.newest:
                try:
                    spare.catch_up()
                except Exception as exc:  # noqa: BLE001 - reads stay at the current view
                    log.warning("partition %d: a secondary of the store failed to catch up (%s); "
                                "it is opened again at the next view", self.p, exc)
            position = self.published.get(spare.seq)
            if position is not None and spare.seq > at:
                assert spare.db is not None  # (a failed instance has no sequence)
                spare.view = View(_Get(spare.db), position, 0, spare.seq, None, self.unpack)
                self._current, cur = s, spare
                low = min(self._pair[0].seq, self._pair[1].seq)
                for old in [q for q in self.published if q < low]:
                    del self.published[old]
        return None if cur is None else cur.view

    def close(self) -> None:
        for inst in self._pair:
            inst.close()
            shutil.rmtree(inst.where, ignore_errors=True)  # its info log


class ReaderLocal:
    """:class:`services.worker.query.answers.Local` of the reader: the partitions whose
    secondary stands at a published view are its views; it restores nothing and keeps no
    standby or directory view (those reads go upstream)."""

    def __init__(self, types: list[str], decode: Any, group_index: bool, directory: bool) -> None:
        self.me = MemberInfo("", None)
        self.views = Views()
        self.standby_views = Views()
        self.directory_views = Views()
        self.directory = directory
        self.group_index = group_index
        self._types = types
        self._decode = decode
        self.secondaries: dict[int, Secondary] = {}
        self._counts = (0, 0)  # input and directory partitions
        self._routing: Routing | None = None  # made again when what it says changes

    def set_routing(self, input_partitions: int, directory_partitions: int) -> None:
        self._counts = (input_partitions, directory_partitions)
        self._routing = None

    def set_me(self, me: MemberInfo) -> None:
        self.me = me
        self._routing = None

    def add(self, sec: Secondary) -> None:
        self.secondaries[sec.p] = sec
        self._routing = None

    def remove(self, p: int) -> Secondary | None:
        self.views.withdraw(p, 0)
        self._routing = None
        return self.secondaries.pop(p, None)

    def refresh(self, p: int) -> None:
        """Publish partition p's view as its secondary now stands (or withdraw it)."""
        sec = self.secondaries.get(p)
        view = None if sec is None else sec.view()
        if view is None:
            self.views.withdraw(p, 0)
        elif self.views.get(p) is not view:
            self.views.publish(p, view)

    def routing_partitions(self) -> int:
        return self._counts[0]

    def routing(self) -> Routing:
        """This reader's map: the partitions it reads are owned by its worker."""
        r = self._routing
        if r is None:
            owners = {p: self.me.worker for p in self.secondaries}
            urls = {self.me.worker: self.me.url} if self.me.url else {}
            r = self._routing = Routing(*self._counts, owners, urls=urls)
        return r

    def active(self, partition: int) -> bool:
        return partition in self.secondaries

    def restoring(self, partition: int) -> tuple[int, int] | None:
        return None

    def decode(self, value: bytes) -> dict[str, Any]:
        record: dict[str, Any] = self._decode(value).record
        return record

    def types(self) -> list[str]:
        return self._types
