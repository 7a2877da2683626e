"""Cluster listeners: CEL expressions, registration model and per-change matching.

The worker uses :class:`ListenerSet` (``add``/``remove``/``match``); the CLI and the registry
use :class:`ListenerSpec`. See DESIGN.md §3 for the view semantics.
"""

from listeners.expr import CompiledExpr, EvaluationError, compile_converter, compile_filter
from listeners.matcher import Change, ListenerSet, ListenerStats, Matcher, Notification
from listeners.model import ListenerSpec

__all__ = [
    "Change",
    "CompiledExpr",
    "EvaluationError",
    "ListenerSet",
    "ListenerSpec",
    "ListenerStats",
    "Matcher",
    "Notification",
    "compile_converter",
    "compile_filter",
]
