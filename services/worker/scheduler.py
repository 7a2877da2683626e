"""FIFO-group scheduling: per-lane queues and a bounded set of in-flight lanes.

A lane is a FIFO group, or a group's stage in a multi-stage pipeline (``<group>\x00<stage>``):
the "group index" of seed 000, which lets the stages of one group run at once. Below,
"group" means lane. Invariants (seed 000):
- a group has at most one event in flight; its next event is dispatched only after the
  previous one completed (exclusivity, arrival order);
- up to ``concurrency`` groups are in flight at once, whatever partition they share, so a
  slow group holds up nothing but itself (no head-of-line blocking);
- "no use in more threads than groups": the number in flight is bounded by the number of
  ready groups, reported as ``ready_groups`` / ``max_in_flight``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from fifolane.errors import ConfigError

__all__ = ["GroupScheduler"]


class _HasLane(Protocol):
    lane: str


E = TypeVar("E", bound=_HasLane)


class GroupScheduler(Generic[E]):
    """Queues events by group and hands ready ones to ``start`` up to a concurrency bound."""

    __slots__ = ("concurrency", "queues", "busy", "ready", "queued", "max_in_flight")

    def __init__(self, concurrency: int) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        self.queues: dict[str, deque[E]] = {}  # groups with queued or in-flight events
        self.busy: set[str] = set()  # groups with an event in flight
        self.ready: deque[str] = deque()  # groups with a queued event and none in flight
        self.queued = 0  # events queued or in flight
        self.max_in_flight = 0

    def has_group(self, lane: str) -> bool:
        return lane in self.queues

    def submit(self, event: E) -> None:
        q = self.queues.get(event.lane)
        if q is None:
            q = self.queues[event.lane] = deque()
            self.ready.append(event.lane)
        q.append(event)
        self.queued += 1

    def dispatch(self, start: Callable[[E], None]) -> int:
        """Start the head event of ready groups while below the concurrency bound."""
        started = 0
        busy, ready, queues = self.busy, self.ready, self.queues
        while ready and len(busy) < self.concurrency:
            group = ready.popleft()
            busy.add(group)
            started += 1
            start(queues[group][0])
        if len(busy) > self.max_in_flight:
            self.max_in_flight = len(busy)
        return started

    def complete(self, event: E) -> None:
        """The head event of ``event.lane`` finished: release the group."""
        group = event.lane
        q = self.queues[group]
        head = q.popleft()
        assert head is event, "completion out of order within a group"
        self.busy.discard(group)
        self.queued -= 1
        if q:
            self.ready.append(group)
        else:
            del self.queues[group]

    @property
    def in_flight(self) -> int:
        return len(self.busy)

    @property
    def ready_groups(self) -> int:
        return len(self.ready)

    def idle(self) -> bool:
        return self.queued == 0

    def clear(self) -> None:
        self.queues.clear()
        self.busy.clear()
        self.ready.clear()
        self.queued = 0
