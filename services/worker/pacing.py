"""Early sends: at low rates, a transaction's records leave while it still takes events in.

The producer lingers 20 ms to batch well at full speed (services.worker.clients). At low
rates an exactly-once transaction then sends nearly all of its records at its commit's
flush, one request per partition, and every event of it waits for them. A worker whose
last commit was an idle one (its input had gone quiet: services.worker.runtime) is at a low
rate; there, each batch smaller than asked (the client had nothing more fetched) pushes
what the producer holds out at once, at most every :data:`EVERY_S`. At full speed the
consumer's queue is never empty, commits come from the interval, and nothing changes
(benchmarks/README.md, "A warm broker").
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["EVERY_S", "EarlySend"]

#: At most one early send per this many seconds.
EVERY_S = 0.002


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
        now = self._clock()
        if now - self._last < self.every:
            return False
        self._last = now
        return True
