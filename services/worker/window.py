"""The offsets of one input partition that are consumed but not all finished.

A checkpoint does not wait for slow handler calls: it commits the *completed prefix* of each
partition (the offset of its first unfinished event) and keeps the unfinished events running;
their effects go into a later transaction. The events after that offset that did finish are
written into the commit's offset metadata (the way Confluent's Parallel Consumer does it), so a
replay after a crash or an abort skips them instead of applying them twice:

    fl1;<next offset>;<base64 bitmap over [committed, next): bit set = unfinished>

:class:`Window` keeps the counts of unfinished events per offset (a pipeline stage's event
shares its input record's offset) and the *skip set*: offsets at or after the committed one
whose effects are committed already.
"""

from __future__ import annotations

import base64
import logging
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["MAX_WINDOW", "Source", "Window", "decode_skips"]

log = logging.getLogger(__name__)

_PREFIX = "fl1;"
#: The widest window the metadata can describe (Kafka's offset.metadata.max.bytes is 4096
#: by default: a bitmap of this many bits, in base64, stays well under it).
MAX_WINDOW = 20_000


def decode_skips(committed: int, metadata: str | None) -> set[int]:
    """The offsets a committed offset's metadata says are done already (empty if none)."""
    if not metadata or not metadata.startswith(_PREFIX):
        return set()
    try:
        _, nxt_text, bits_text = metadata.split(";", 2)
        nxt, bits = int(nxt_text), base64.b64decode(bits_text, validate=True)
        if not 0 <= nxt - committed <= MAX_WINDOW or len(bits) < (nxt - committed + 7) >> 3:
            raise ValueError("the bitmap does not cover the window")
    except (ValueError, TypeError) as exc:
        # Not ours, or damaged: replaying the window again is safe (effects are idempotent
        # per version), skipping on a misread bitmap would not be.
        log.warning("ignoring offset metadata %r: %s", metadata[:80], exc)
        return set()
    return {o for o in range(committed, nxt) if not bits[(o - committed) >> 3] & (1 << ((o - committed) & 7))}


class Window:
    """Unfinished events and already-done offsets of one partition (see the module docstring)."""

    __slots__ = ("counted", "skip", "unfinished", "_at_commit")

    def __init__(self) -> None:
        self.unfinished: Counter[int] = Counter()
        self.skip: set[int] = set()
        #: after a rewind: offsets a committed transaction took (and counted) unfinished; their
        #: replay is processed but not counted as consumed again
        self.counted: set[int] = set()
        self._at_commit: set[int] = set()  # the unfinished offsets of the last commit

    def replayed(self, offset: int) -> int:
        """0: a record not taken before; 1: done already (skip it); 2: taken, unfinished, by
        a committed transaction (process it, but it was counted)."""
        if offset in self.skip:
            return 1
        if offset in self.counted:
            self.counted.discard(offset)
            return 2
        return 0

    def rewound(self) -> None:
        """Back to the committed offset: the calls in flight are forgotten (replayed)."""
        self.unfinished.clear()
        self.counted = set(self._at_commit)

    def track(self, offset: int) -> None:
        self.unfinished[offset] += 1

    def untrack(self, offset: int) -> None:
        n = self.unfinished[offset] - 1
        if n > 0:
            self.unfinished[offset] = n
        else:
            del self.unfinished[offset]

    def commit_point(self, nxt: int) -> tuple[int, str]:
        """The offset to commit (the first unfinished one, or ``nxt``) and its metadata: the
        finished offsets after it, and the done ones a replay has not reached yet (after a
        rewind, the skip set can reach past ``nxt``: they stay done, also for a new owner)."""
        ahead = [o for o in self.skip if o >= nxt] if self.skip else []
        first = min(self.unfinished) if self.unfinished else nxt
        if first >= nxt and not ahead:
            return nxt, ""
        first = min(first, nxt)
        end = max(nxt, max(ahead) + 1) if ahead else nxt
        bits = bytearray((end - first + 7) >> 3)  # bit set: not done
        for o in self.unfinished:
            if first <= o < nxt:
                bits[(o - first) >> 3] |= 1 << ((o - first) & 7)
        if ahead:
            skip = self.skip
            for o in range(nxt, end):
                if o not in skip:
                    bits[(o - first) >> 3] |= 1 << ((o - first) & 7)
        return first, f"{_PREFIX}{end};{base64.b64encode(bytes(bits)).decode()}"

    def committed(self, offset: int, nxt: int) -> None:
        """A commit of ``offset`` succeeded: the finished ones after it are done, and so are
        the done ones beyond ``nxt`` (see :meth:`commit_point`)."""
        ahead = {o for o in self.skip if o >= nxt}
        self.skip = {o for o in range(offset, nxt) if o not in self.unfinished} | ahead
        self._at_commit = set(self.unfinished) | {o for o in self.counted if o >= nxt}

    def wide(self, nxt: int) -> bool:
        """Whether the unfinished events span more offsets than the metadata can describe."""
        return bool(self.unfinished) and nxt - min(self.unfinished) > MAX_WINDOW


@dataclass
class Source:
    """Offsets of one consumed topic: ``base`` is the committed offset of every assigned
    partition (None: nothing committed yet), ``next`` the offset after the last record
    taken into the open transaction."""

    topic: str
    base: dict[int, int | None] = field(default_factory=dict)
    next: dict[int, int] = field(default_factory=dict)
    #: per partition, its events consumed but not all finished (services.worker.window)
    windows: dict[int, Window] = field(default_factory=dict)

    def window(self, p: int) -> Window:
        win = self.windows.get(p)
        if win is None:
            win = self.windows[p] = Window()
        return win

    def known(self, p: int, found: tuple[int | None, str | None]) -> None:
        """The committed offset (and its metadata) of ``p`` as the group coordinator has it."""
        offset, metadata = found
        self.base[p] = offset
        if offset is not None:
            self.window(p).skip = decode_skips(offset, metadata)

    def commit_points(self) -> dict[int, tuple[int, int, str]]:
        """Per partition with something to commit: (offset, position, metadata)."""
        out = {}
        for p in set(self.base) | set(self.next):
            nxt = self.next.get(p, self.base.get(p))
            if nxt is not None:
                win = self.windows.get(p)
                off, meta = win.commit_point(nxt) if win is not None else (nxt, "")
                out[p] = (off, nxt, meta)
        return out
