"""Cluster listeners: CEL expressions, registration model and per-change matching.

The worker's listener runtime (:class:`listeners.runtime.ListenerRuntime`, a change sink)
uses :class:`ListenerSet` (``add``/``remove``/``match``); the CLI and the registry use
:class:`ListenerSpec`. docs/formats.md gives the view semantics and the wire formats.
"""

from listeners.expr import CompiledExpr, EvaluationError, compile_converter, compile_filter
from listeners.matcher import Change, ListenerSet, ListenerStats, Notification
from listeners.model import ListenerSpec

__all__ = [
    "Change",
    "CompiledExpr",
    "EvaluationError",
    "ListenerSet",
    "ListenerSpec",
    "ListenerStats",
    "Notification",
    "compile_converter",
    "compile_filter",
]
