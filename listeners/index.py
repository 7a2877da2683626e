"""Helpers for the equality index and for projecting entities to the fields expressions read.

Index keys follow CEL equality, not Python's: ``true == 1`` is false in CEL but ``True == 1`` in
Python, so a key carries a type tag. Ints, uints and doubles share the tag ``n`` because CEL
compares numbers across types (``1 == 1.0`` is true), exactly like Python's ``hash``/``==``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any
from uuid import UUID

from listeners.celvalues import cel_value

__all__ = ["MISSING", "eq_key", "lookup", "project"]

#: Returned by :func:`lookup` when a path does not exist.
MISSING: Any = object()


def eq_key(v: Any) -> tuple[str, Any] | None:
    """The index key of a scalar, or ``None`` if the value cannot equal a scalar literal."""
    # bool before int: bool is an int subclass in Python, a distinct type in CEL.
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", v)
    if isinstance(v, str):
        return ("s", str(v))
    if isinstance(v, bytes):
        return ("y", v)
    if isinstance(v, Decimal):  # CEL sees a double (listeners.celvalues)
        return ("n", float(v))
    if isinstance(v, date | time | UUID) and not isinstance(v, datetime):  # CEL sees a string
        return ("s", cel_value(v))
    return None


def lookup(entity: Mapping[str, Any] | None, path: tuple[str, ...]) -> Any:
    """``entity[p0][p1]...`` or :data:`MISSING` if any step is absent or not a map."""
    cur: Any = entity
    for p in path:
        if type(cur) is not dict and not isinstance(cur, Mapping):
            return MISSING
        cur = cur.get(p, MISSING)
        if cur is MISSING:
            return MISSING
    return cur


def project(entity: Mapping[str, Any] | None, fields: frozenset[str] | None) -> Any:
    """The entity restricted to ``fields`` (``None`` = all); absent fields stay absent.

    Converting a Python map into CEL costs per field, so only what some expression reads
    is handed to CEL. Absent fields stay absent so that CEL reports them as missing.
    """
    if entity is None or fields is None:
        return entity
    return {f: entity[f] for f in fields if f in entity}
