"""Lease durations as people write them: ``30s``, ``5m``, ``1h``, ``1h30m``, ``500ms``, ``2d``.

Durations are bounded by :data:`MAX_DURATION` (10 years): a lease is a liveness check, and an
unbounded one would overflow date arithmetic (``created_at + lease``) in every reader.
"""

from __future__ import annotations

import re
from datetime import timedelta

from fifolane.errors import ListenerError

__all__ = ["MAX_DURATION", "check_duration", "format_duration", "parse_duration"]

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_EXAMPLES = "e.g. '30s', '5m', '1h', '1h30m' (units: ms, s, m, h, d)"
#: The longest duration accepted (a lease of 10 years is as good as none: leave it out).
MAX_DURATION = timedelta(days=3650)
_MAX_TEXT = 64  # characters: a duration is short; longer text is refused without parsing


def _show(text: object) -> str:
    shown = repr(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def check_duration(d: timedelta, text: object = None) -> timedelta:
    """Return ``d`` if it is longer than zero and at most :data:`MAX_DURATION`, else raise
    :class:`ListenerError` naming the bound."""
    what = _show(text if text is not None else d)
    if d <= timedelta(0):
        raise ListenerError(f"invalid duration {what}: must be longer than zero")
    if d > MAX_DURATION:
        raise ListenerError(
            f"invalid duration {what}: longer than the limit of 10 years (3650d); "
            f"for a listener that never expires, leave the lease out"
        )
    return d


def parse_duration(text: str) -> timedelta:
    """Parse a positive duration of at most 10 years; raise :class:`ListenerError` naming the
    accepted forms (never anything else, whatever ``text`` is)."""
    s = text.strip().lower() if isinstance(text, str) else ""
    if len(s) > _MAX_TEXT:
        raise ListenerError(f"invalid duration {_show(text)}: too long; expected {_EXAMPLES}")
    pos, seconds = 0, 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ListenerError(f"invalid duration {_show(text)} at offset {pos}: expected {_EXAMPLES}")
        seconds += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not s:
        raise ListenerError(f"invalid duration {_show(text)}: empty; expected {_EXAMPLES}")
    # Compared as seconds first: a huge number would overflow timedelta itself.
    if seconds > MAX_DURATION.total_seconds():
        return check_duration(MAX_DURATION + timedelta(seconds=1), text)
    return check_duration(timedelta(seconds=seconds), text)


def format_duration(d: timedelta) -> str:
    """The shortest ``parse_duration`` text for ``d`` (``90s`` -> ``"90s"``, ``1h`` -> ``"1h"``)."""
    ms = round(d.total_seconds() * 1000)
    for unit in ("d", "h", "m", "s"):
        size = round(_UNITS[unit] * 1000)
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"
