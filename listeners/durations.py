"""Lease durations as people write them: ``30s``, ``5m``, ``1h``, ``1h30m``, ``500ms``, ``2d``."""

from __future__ import annotations

import re
from datetime import timedelta

from fifolane.errors import ListenerError

__all__ = ["format_duration", "parse_duration"]

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_EXAMPLES = "e.g. '30s', '5m', '1h', '1h30m' (units: ms, s, m, h, d)"


def parse_duration(text: str) -> timedelta:
    """Parse a positive duration; raise :class:`ListenerError` naming the accepted forms."""
    s = text.strip().lower() if isinstance(text, str) else ""
    pos, seconds = 0, 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ListenerError(f"invalid duration {text!r} at offset {pos}: expected {_EXAMPLES}")
        seconds += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not s:
        raise ListenerError(f"invalid duration {text!r}: empty; expected {_EXAMPLES}")
    if seconds <= 0:
        raise ListenerError(f"invalid duration {text!r}: must be longer than zero")
    return timedelta(seconds=seconds)


def format_duration(d: timedelta) -> str:
    """The shortest ``parse_duration`` text for ``d`` (``90s`` -> ``"90s"``, ``1h`` -> ``"1h"``)."""
    ms = round(d.total_seconds() * 1000)
    for unit in ("d", "h", "m", "s"):
        size = round(_UNITS[unit] * 1000)
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
