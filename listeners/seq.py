"""Delta-well-ordered sequence numbers (seed 004; docs/formats.md, notifications).

Per listener and source partition, the owner of the partition numbers notifications
``base, base + 1, base + 2, ...``. ``base = epoch * DELTA`` where ``epoch`` is the time of the
partition's assignment in milliseconds since :data:`EPOCH_START` (made strictly increasing per
worker). A new owner (after a failover or rebalance) therefore starts above every number the
previous owner used, as long as

- the previous owner produced fewer than ``DELTA`` (about 4.2 million) notifications per
  millisecond of ownership for one listener and partition, and
- the workers' clocks agree to better than the hand-over time (a rebalance or a session
  timeout: hundreds of milliseconds to seconds; NTP does far better).

Numbers fit a signed 64-bit integer until about 2093. A consumer proves a gap between two
numbers ``a < b`` of the same listener and partition when ``b - a < DELTA`` and ``b - a > 1``:
``b - a - 1`` notifications are missing. A difference of ``DELTA`` or more is a new run:
nothing can be inferred (:class:`SeqTracker`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

__all__ = ["DELTA", "EPOCH_START", "Gap", "SeqTracker", "next_epoch"]

#: The delta of delta-well-ordered: consecutive numbers within a run, jumps of at least this.
DELTA = 1 << 22
#: 2024-01-01T00:00:00Z in ms since the Unix epoch: the zero of the epochs.
EPOCH_START = 1_704_067_200_000


def next_epoch(last: int = 0) -> int:
    """The epoch for a new run: now (ms since :data:`EPOCH_START`), above ``last``.

    ``last + 2`` leaves the previous run at least a full ``DELTA`` window of its own.
    """
    return max(int(time.time() * 1000) - EPOCH_START, last + 2)


@dataclass(frozen=True, slots=True)
class Gap:
    """Notifications proven missing: ``missing`` numbers between ``after`` and ``before``."""

    listener: str
    partition: int
    after: int
    before: int

    @property
    def missing(self) -> int:
        return self.before - self.after - 1


@dataclass
class SeqTracker:
    """Drops duplicates and reports provable gaps, per (listener, source partition)."""

    last: dict[tuple[str, int], int] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    duplicates: int = 0
    runs: int = 0

    def accept(self, listener: str, partition: int, seq: int) -> bool:
        """True if ``seq`` is new (deliver it); False for a duplicate or older number."""
        k = (listener, partition)
        prev = self.last.get(k)
        if prev is not None:
            if seq <= prev:
                self.duplicates += 1
                return False
            diff = seq - prev
            if diff >= DELTA:
                self.runs += 1
            elif diff > 1:
                self.gaps.append(Gap(listener, partition, prev, seq))
        else:
            self.runs += 1
        self.last[k] = seq
        return True
