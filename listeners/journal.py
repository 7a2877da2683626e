"""Sequence numbers of notifications, and their journal for aborted transactions.

Per listener *registration* and source partition, notifications are numbered
``base, base + 1, ...`` (consecutive within a run: a gap is a missed notification). A run
starts with ``base = epoch * DELTA`` (:func:`listeners.seq.next_epoch`, time-based and
strictly increasing per worker) whenever a stream starts: a partition assigned to this
worker, or a listener (re)activated here. So numbers never repeat for a listener name, also
when it is replaced, removed and added again, or its lease expires and is renewed: a new
registration starts a new run, which clients recognise by the jump of at least ``DELTA``
(and by the notification's ``registration``).

Numbers handed out in a transaction that aborts are taken back (:meth:`SeqJournal.rollback`),
so a run stays gap-free; after a commit they are final (:meth:`SeqJournal.commit`).
"""

from __future__ import annotations

from listeners.seq import DELTA, next_epoch

__all__ = ["SeqJournal"]


class _Stream:
    """The next number of one listener per source partition, and the journal of the open
    transaction (the number before its first notification; -1: the run started in it)."""

    __slots__ = ("next", "undo")

    def __init__(self) -> None:
        self.next: dict[int, int] = {}
        self.undo: dict[int, int] = {}


class SeqJournal:
    """Numbers notifications (see the module docstring)."""

    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}
        self._dirty: list[_Stream] = []
        self._last_epoch = 0

    def number(self, listener: str, partition: int) -> int:
        """The sequence number of the next notification of ``listener`` from ``partition``."""
        stream = self._streams.get(listener)
        if stream is None:
            stream = self._streams[listener] = _Stream()
        nxt = stream.next
        seq = nxt.get(partition)
        undo = stream.undo
        if partition not in undo:  # its first one in this transaction: journal the number
            if not undo:
                self._dirty.append(stream)
            undo[partition] = -1 if seq is None else seq
        if seq is None:
            self._last_epoch = next_epoch(self._last_epoch)
            seq = self._last_epoch * DELTA
        nxt[partition] = seq + 1
        return seq

    def commit(self) -> None:
        """The numbers handed out since the last commit are final."""
        for stream in self._dirty:
            stream.undo.clear()
        self._dirty.clear()

    def rollback(self) -> None:
        """The transaction aborted: hand out its numbers again."""
        for stream in self._dirty:
            for p, before in stream.undo.items():
                if before < 0:
                    stream.next.pop(p, None)
                else:
                    stream.next[p] = before
            stream.undo.clear()
        self._dirty.clear()

    def end(self, listener: str) -> None:
        """The listener is gone (removed, replaced, expired): its next activation is a new run."""
        stream = self._streams.pop(listener, None)
        if stream is not None and stream.undo:
            self._dirty.remove(stream)

    def release(self, partitions: set[int]) -> None:
        """Partitions gone: their runs end (a new owner, or a later return, starts new ones)."""
        for stream in self._streams.values():
            for p in partitions:
                stream.next.pop(p, None)
                stream.undo.pop(p, None)
        self._dirty = [s for s in self._dirty if s.undo]
