"""Listeners suspended on this worker (their expressions over budget, or their output topic
refusing their notifications for good), and the status records that say so
(``<name>/status/<worker>``, shown by ``fifolane listeners describe``).

A suspension holds for the registration it was made for, also after the worker restarts (its
status record says so): registering the listener again (a new ``created_at``) lifts it. A
status record is produced at the next safe point and produced again if its transaction aborts.
The ``failing`` status records (:mod:`listeners.failures`) go out at the same safe points,
before the suspensions (a suspension's record is the last word on its listener).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from listeners.failures import FailureReports
from listeners.plan import ListenerStats
from listeners.registry_view import status_record

if TYPE_CHECKING:
    from listeners.matcher import ListenerSet
    from listeners.notifier import Active

__all__ = ["Suspensions", "output_refused", "overrun"]

log = logging.getLogger(__name__)

Produce = Callable[..., None]


def overrun(stats: ListenerStats, budget: float) -> str:
    """Why a listener whose expressions took too long is suspended."""
    return (f"{stats.overruns} evaluations over the budget of {budget * 1000:.0f} ms of CPU per change (the "
            "longest took {:.0f} ms): simplify the filter or converter, then register it again"
            ).format(stats.longest * 1000)


def output_refused(topic: str, error: object) -> str:
    """Why a listener whose output topic refuses its notifications is suspended."""
    return (f"Kafka refused its notifications to output topic {topic!r} ({error}): the topic was deleted (or "
            "created again with fewer partitions), or this worker may no longer write to it; create it (or "
            "grant WRITE), then register the listener again")


class Suspensions:
    """Suspended listeners of one worker and their pending status records."""

    def __init__(self, registry_topic: str, said: Mapping[tuple[str, str], tuple[str, str]] | None = None,
                 listeners: ListenerSet | None = None, active: Mapping[str, Active] | None = None) -> None:
        self._topic = registry_topic
        #: the failing listeners' status records (of ``listeners``' errors, for the ``active`` ones)
        self.reports = FailureReports(listeners, active if active is not None else {}) if listeners is not None else None
        #: (name, worker) -> (registration, reason): suspensions in the registry's status
        #: records (RegistryView.suspended); this worker's own hold after it restarts
        self._said = said if said is not None else {}
        self.worker = ""  # this worker's id (set when the runtime opens)
        self._held: dict[str, tuple[str, str]] = {}  # name -> (registration, reason)
        self._out: list[tuple[bytes, bytes]] = []  # to produce at the next safe point
        self._sent: list[tuple[bytes, bytes]] = []  # produced, not yet committed

    def suspend(self, name: str, registration: str, reason: str, worker_id: str) -> None:
        self._held[name] = (registration, reason)
        self._out.append(status_record(name, worker_id, "suspended", reason, registration))

    def holds(self, name: str, registration: str | None) -> bool:
        """Whether ``name`` is suspended for this registration (a new one lifts it)."""
        held = self._held.get(name)
        if held is None:
            said = self._said.get((name, self.worker))
            if said is None or said[0] != registration:
                return False
            self._held[name] = held = said  # said before this worker restarted: it still holds
            log.info("listener %r stays suspended on this worker: %s", name, said[1])
        if held[0] != registration:
            del self._held[name]
            return False
        return True

    def reasons(self) -> dict[str, str]:
        return {name: reason for name, (_reg, reason) in self._held.items()}

    def __len__(self) -> int:
        return len(self._held)

    # -- the status records, at safe points -----------------------------------------------------
    def flush(self, produce: Produce) -> None:
        if self.reports is not None:
            self.reports.flush(self._topic, self.worker, produce)
        for key, value in self._out:
            produce(self._topic, value, key, 0)
        self._sent, self._out = self._out, []

    def commit(self) -> None:
        self._sent.clear()
        if self.reports is not None:
            self.reports.commit()

    def rollback(self) -> None:
        self._out = self._sent + self._out
        self._sent = []
        if self.reports is not None:
            self.reports.rollback()
