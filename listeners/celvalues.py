"""Decoded Avro values the ``cel`` library cannot take, turned into values it can.

The ``cel`` binding converts ``None``, bools, ints, floats, strings, bytes, lists, tuples,
maps, ``datetime`` (a CEL timestamp; naive ones as UTC), ``timedelta`` (a duration) and
``Decimal`` (a double), but raises ``ValueError`` on anything else. fastavro also returns
``datetime.date`` (``date``), ``datetime.time`` (``time-millis``/``time-micros``) and
``uuid.UUID`` (``uuid``): in listener expressions they are the strings the notification JSON
carries for them (docs/formats.md): ``date`` ``"2026-12-01"``, time of day ``"13:45:00"`` or
``"13:45:00.250000"``, UUIDs in the canonical lower-case form. ISO dates compare as strings in
date order (``value.departure >= "2026-12-01"``), and ``timestamp(value.departure +
"T00:00:00Z")`` makes a timestamp of one.

Building a context is the cost per change, so values are converted only when the binding
refused them (:func:`cel_context`): the plain case costs nothing more.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import cel

__all__ = ["cel_context", "cel_value"]

_AS_IS = (str, int, float, bool, bytes, type(None), datetime.datetime, datetime.timedelta, Decimal)


def cel_value(v: Any, depth: int = 0) -> Any:
    """``v`` with every value CEL cannot take replaced (see the module docstring)."""
    if isinstance(v, _AS_IS):
        return v
    if isinstance(v, datetime.date | datetime.time):  # datetime is a date: handled above
        return v.isoformat()
    if isinstance(v, uuid.UUID):
        return str(v)
    if depth > 64:  # deeper than any schema: let the binding say what it thinks
        return v
    if isinstance(v, Mapping):
        return {k: cel_value(x, depth + 1) for k, x in v.items()}
    if isinstance(v, list | tuple | set | frozenset):
        return [cel_value(x, depth + 1) for x in v]
    if isinstance(v, bytearray | memoryview):
        return bytes(v)
    return v


def cel_context(variables: dict[str, Any]) -> Any:
    """``cel.Context(variables)``, converting the values first if the binding refuses them.

    Raises whatever the binding raises if it still refuses them (the matcher counts that
    as the listener's evaluation error)."""
    try:
        return cel.Context(variables)
    except ValueError:
        return cel.Context({k: cel_value(v) for k, v in variables.items()})
