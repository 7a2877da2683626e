"""Listeners whose evaluations fail on this worker, told in status records (``failing``).

A filter or converter that fails at run time (a missing field, a type mismatch, a division by
zero, a projection JSON cannot carry) does not stop anything: the change is not notified for
that listener, and the error is counted (:func:`listeners.plan.count_error`). So that users
see it (``fifolane listeners list/describe``), the worker writes the listener's status record
``<name>/status/<worker>`` with state ``failing``, the count of errors of this registration
on this worker and the last error, in its transaction at a safe point.

At most one such record per listener per :data:`INTERVAL_S` seconds, so a listener failing on
every change cannot flood the registry topic: errors in between are counted and go in the
next record. A record of an aborted transaction is written again (with the count as it is
then).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol

from listeners.notifier import Active
from listeners.plan import ListenerStats
from listeners.registry_view import status_record

__all__ = ["INTERVAL_S", "FailureReports"]

#: Seconds between two ``failing`` status records of one listener on one worker.
INTERVAL_S = 5.0

Produce = Callable[..., None]


class _Listeners(Protocol):
    def take_failing(self) -> set[str]: ...
    def stats(self, name: str) -> ListenerStats: ...


class FailureReports:
    """Pending ``failing`` status records of one worker (see the module docstring).

    ``listeners``: the worker's :class:`listeners.matcher.ListenerSet`; ``active``: the
    listeners it delivers to (a listener no longer active is not reported: removed, or
    suspended, whose own status record says why).
    """

    def __init__(self, listeners: _Listeners, active: Mapping[str, Active], interval: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self._listeners = listeners
        self._active = active
        self.interval = interval
        self._clock = clock
        self._pending: set[str] = set()  # errors not yet told
        self._due: dict[str, float] = {}  # name -> when its next record may be written
        self._sent: set[str] = set()  # told in the open transaction
        self.written = 0

    def flush(self, registry_topic: str, worker: str, produce: Produce) -> None:
        """Produce the records that are due (in the open transaction)."""
        failing = self._listeners.take_failing()
        if failing:
            self._pending |= failing
        if not self._pending:
            return
        now = self._clock()
        for name in sorted(self._pending):
            act = self._active.get(name)
            if act is None:
                self._pending.discard(name)
                self._due.pop(name, None)
                continue
            if self._due.get(name, 0.0) > now:
                continue
            st = self._listeners.stats(name)
            key, value = status_record(name, worker, "failing", st.last_error or "", act.spec.created_at.isoformat(),
                                       errors=st.errors)  # fmt: skip
            produce(registry_topic, value, key, 0)
            self._due[name] = now + self.interval
            self._pending.discard(name)
            self._sent.add(name)
            self.written += 1

    def commit(self) -> None:
        self._sent.clear()

    def rollback(self) -> None:
        """The transaction aborted: its records are written again, at the next safe point."""
        for name in self._sent:
            self._due.pop(name, None)
        self._pending |= self._sent
        self._sent.clear()
