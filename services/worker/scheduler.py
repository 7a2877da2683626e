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

``ahead``: lanes dispatched beyond ``concurrency`` that wait for a free handler thread (the
worker's thread pool runs ``concurrency`` calls at once). A thread that finishes a call then
takes the next one at once instead of waiting for the poll thread to apply the result and
dispatch (benchmarks/README.md, "Slow handlers"). Such a lane counts as busy (it has its
event) but not as in flight.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from fifolane.errors import ConfigError

__all__ = ["GroupScheduler", "lanes_ahead"]


class _HasLane(Protocol):
    lane: str


E = TypeVar("E", bound=_HasLane)


class GroupScheduler(Generic[E]):
    """Queues events by group and hands ready ones to ``start`` up to a concurrency bound."""

    __slots__ = ("concurrency", "bound", "queues", "busy", "ready", "queued", "max_in_flight")

    def __init__(self, concurrency: int, ahead: int = 0) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        self.concurrency = concurrency
        self.bound = concurrency + max(0, ahead)  # lanes dispatched at most
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
        """Start the head event of ready groups while below the bound (``concurrency`` plus
        ``ahead``)."""
        started = 0
        busy, ready, queues, bound = self.busy, self.ready, self.queues, self.bound
        while ready and len(busy) < bound:
            group = ready.popleft()
            busy.add(group)
            started += 1
            start(queues[group][0])
        running = min(len(busy), self.concurrency)
        if running > self.max_in_flight:
            self.max_in_flight = running
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
        """Groups whose event runs (at most ``concurrency``)."""
        return min(len(self.busy), self.concurrency)

    @property
    def ready_groups(self) -> int:
        """Groups whose next event waits for a handler: not dispatched yet, or dispatched
        ahead and waiting for a thread."""
        return len(self.ready) + max(0, len(self.busy) - self.concurrency)

    def idle(self) -> bool:
        return self.queued == 0

    def clear(self) -> None:
        self.queues.clear()
        self.busy.clear()
        self.ready.clear()
        self.queued = 0


def lanes_ahead(concurrency: int, *, has_async: bool, parks: bool) -> int:
    """The worker's ``ahead``: as many lanes again as sync handler threads. None when
    handlers are ``async def`` (their calls all run at once on the event loop: ``concurrency``
    is their bound), nor with ``--on-failure park``: a lane dispatched ahead passed the
    parked check before an earlier event of its group, in another lane, failed and parked
    the group (tests/unit/test_worker_ahead_faults.py)."""
    return 0 if has_async or parks else concurrency
