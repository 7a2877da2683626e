"""Pacing: when the worker's records leave, and when it commits, at low rates.

Commits. The worker commits on its interval (spaced out further when commits are slow:
services.worker.runtime), and early when its input goes idle (a fetch came back empty and
nothing is in flight): exactly-once at once, at-least-once, whose output is visible without
a commit, once nothing has come for :data:`PAUSE_S`.

Early sends. The producer lingers 20 ms to batch well at full speed (services.worker.clients).

- At-least-once output is visible once the broker has it, so a low rate paid the linger in
  full. When the worker is *caught up* after a batch (:func:`caught_up`: nothing in flight,
  and its consumer has seen at most a few records beyond what it took, from the end offsets
  of its last fetches: no round trip), it pushes out what the producer holds, at most every
  :data:`EVERY_S`. A backlog is never caught up: at full speed nothing changes. (A batch
  smaller than asked is not enough to tell: a worker draining a backlog gets partial
  batches too, whenever it outruns its fetches.)
- An exactly-once transaction's records would all wait for the commit's flush, one request
  per partition, and every event of it for them. A worker whose last commit was an idle one
  is at a low rate; there, each batch smaller than asked pushes the producer's records out
  (:class:`EarlySend`). At full speed the consumer's queue is never empty, commits come from
  the interval, and nothing changes (benchmarks/README.md, "A warm broker").

Exactly-once does not commit when merely caught up (tried: benchmarks/README.md, "Commits
when caught up"): the extra commits, and the entity directory's claims read back after
each, cost the broker more than the events gained.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from services.worker.metrics import lag_of

__all__ = ["EVERY_S", "PAUSE_S", "SLACK", "SMALL", "EarlySend", "caught_up", "settle_gc"]

#: At most one early send per this many seconds.
EVERY_S = 0.002

#: At-least-once commits before its interval once its input has paused this long (nothing
#: fetched, nothing in flight). Its output is visible without a commit, so a commit at every
#: empty fetch only blocked the loop; but the offsets of a finished burst waited for the
#: pause, and 100 ms held a drain's last commit back (benchmarks/README.md, "At-least-once
#: commits after a 20 ms pause"). Input slower than ~50 events/s pauses after every event
#: and commits about once per event, as exactly-once does at any low rate.
PAUSE_S = 0.02


class EarlySend:
    """When to push the producer's queue out before the commit (a pure policy: the caller
    sends)."""

    def __init__(self, every: float = EVERY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.every = every
        self._clock = clock
        self.low_rate = False
        self._last = 0.0

    def committed(self, *, idle: bool) -> None:
        """A commit happened: an idle one means a low rate, an interval one full speed."""
        self.low_rate = idle

    def after_batch(self, got: int, asked: int) -> bool:
        """Whether to send now, after taking a batch of ``got`` records of ``asked``."""
        if not self.low_rate or got == 0 or got >= asked:
            return False
        return self.due()

    def due(self) -> bool:
        """Whether the last early send is :attr:`every` ago (and this one is noted)."""
        now = self._clock()
        if now - self._last < self.every:
            return False
        self._last = now
        return True


#: Records a partition may still have beyond what was taken and count as caught up: a
#: transactional input ends each transaction with a marker the consumer never hands out.
SLACK = 1
#: At most this many records in all may wait and the worker still count as caught up (what
#: arrives during a batch at a low rate); the end of a drained backlog is not a low rate.
SMALL = 200


def caught_up(consumer: Any, topic: str, partitions: Iterable[int], allowed: int = 0,
              starts: Mapping[int, int | None] | None = None) -> bool:
    """Whether ``consumer`` (a WorkerConsumer) is at most ``allowed`` records (plus
    :data:`SLACK` per partition) behind what it knows of ``topic`` on ``partitions``: its
    position against the end offset of its last fetch (the last stable offset: the worker
    reads committed). A partition that handed out nothing yet is at its entry in ``starts``
    (the committed offset: services.worker.metrics.lag_of). Unknown counts as behind."""
    starts = starts or {}
    behind = 0
    for p in partitions:
        lag = lag_of(consumer, topic, p, starts.get(p))
        if lag is None:
            return False
        behind += max(0, lag - SLACK)
        if behind > allowed:
            return False
    return True


def settle_gc() -> None:
    """Keep start-up's objects (modules, schemas: as old as the process) out of the collector's
    scans, and collect young objects less often (an event's containers are freed at once): the
    collector's pauses hold the poll loop like a slow commit does."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)
