"""Jepsen-style history checking for fifolane's promises under faults.

Record what was produced and what was observed (committed effects, the committed table,
listener notifications) as a :class:`History`, then :func:`check_history` it::

    history = History(produced=events, effects=effects, table=table)
    report = check_history(history)
    assert report.ok, report.summary()

See :mod:`fifolane.testing.model` for the record types, :mod:`fifolane.testing.history`
for the rules, :mod:`fifolane.testing.records` to build records from Kafka messages and
:mod:`fifolane.testing.workload` for a deterministic event stream with delivery tracking.
"""

from __future__ import annotations

from fifolane.testing.history import check_history, expected_effects, reference_table
from fifolane.testing.listener_check import FAILOVER_DELTA, check_notifications
from fifolane.testing.model import Effect, History, Notification, ProducedEvent, TableEntry
from fifolane.testing.report import KINDS, Report, Violation

__all__ = [
    "FAILOVER_DELTA",
    "KINDS",
    "Effect",
    "History",
    "Notification",
    "ProducedEvent",
    "Report",
    "TableEntry",
    "Violation",
    "check_history",
    "check_notifications",
    "expected_effects",
    "reference_table",
]
