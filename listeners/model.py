"""The listener registration model, as stored (JSON) on the compacted registry topic.

Registry record: key = listener name, value = :meth:`ListenerSpec.to_json`, tombstone = removed
(docs/formats.md). A spec validates itself on construction: the name, the kinds, the lease,
the timestamps and both expressions (compiled, so an invalid one is refused with its position).

Registry records may come from other clients, other fifolane versions or a text editor, so
construction and :meth:`ListenerSpec.from_json` raise only :class:`ListenerError` or
:class:`ExpressionError`, whatever the input (wrong JSON types, huge leases, timestamps at the
ends of time, bytes that are not UTF-8): readers turn those into an invalid registration.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from fifolane.config import Settings
from fifolane.errors import ExpressionError, ListenerError
from listeners.durations import check_duration, format_duration, parse_duration
from listeners.expr import CompiledExpr, compile_converter, compile_filter

__all__ = ["ALL_KINDS", "EARLIEST", "FORMAT_VERSION", "LATEST", "ListenerSpec"]

ALL_KINDS: tuple[str, ...] = ("created", "modified", "removed")
FORMAT_VERSION = 1
_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")  # what Kafka accepts as a topic name
#: Timestamps (``created_at``, ``renewed_at``) outside this range are refused: date arithmetic
#: on them (``+ lease``, comparisons in UTC) must not overflow in any reader.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def _now() -> datetime:
    return datetime.now(UTC)


def _show(value: Any) -> str:
    """A short repr for messages (a registry record may hold anything, of any size)."""
    try:
        text = repr(value)
    except ValueError:  # e.g. an int too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _kinds(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ListenerError(
            f"invalid kinds {_show(value)}: give a list (or comma-separated text) of "
            f"{', '.join(ALL_KINDS)}"
        )
    if not all(isinstance(k, str) for k in items):
        raise ListenerError(f"invalid kinds {_show(value)}: each kind must be a string, one of {', '.join(ALL_KINDS)}")
    kinds = {k.strip().lower() for k in items if k.strip()}
    bad = sorted(kinds - set(ALL_KINDS))
    if bad or not kinds:
        raise ListenerError(
            f"invalid kinds {_show(bad or sorted(kinds))}: choose one or more of {', '.join(ALL_KINDS)}"
        )
    return tuple(k for k in ALL_KINDS if k in kinds)  # canonical order


def _time(value: Any, what: str) -> datetime:
    """A timezone-aware timestamp within :data:`EARLIEST`..:data:`LATEST`, or ListenerError."""
    dt: datetime | None = value if isinstance(value, datetime) else None
    if isinstance(value, str) and len(value) <= 64:
        try:
            dt = datetime.fromisoformat(value)
        except ValueError:
            dt = None
    if dt is None:
        raise ListenerError(f"invalid {what} {_show(value)}: expected an ISO-8601 timestamp")
    dt = dt if dt.tzinfo else dt.replace(tzinfo=UTC)
    try:
        in_range = EARLIEST <= dt < LATEST  # compares in UTC: may overflow at the ends of time
    except OverflowError:
        in_range = False
    if not in_range:
        raise ListenerError(
            f"invalid {what} {_show(value)}: must lie between {EARLIEST.date()} and {LATEST.date()}"
        )
    return dt


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """A listener registration.

    ``lease`` accepts a ``timedelta`` or text such as ``"30s"``; without one the listener lives
    until removed. ``output_topic`` None means the configured default
    (:meth:`topic`). ``type`` restricts the listener to one entity type. ``principal`` is
    the Kafka principal that registered it (``User:<name>``; set by
    :func:`listeners.registry.register`, None without SASL): shown, not a permission.
    """

    name: str
    filter: str = "true"
    convert: str | None = None
    kinds: tuple[str, ...] = ALL_KINDS
    include_current_state: bool = False
    output_topic: str | None = None
    type: str | None = None
    lease: timedelta | None = None
    created_at: datetime = field(default_factory=_now)
    renewed_at: datetime | None = None
    principal: str | None = None
    #: The compiled filter and converter (made once here; the matcher's plans take them, so a
    #: registration is compiled once, whatever the number of listeners).
    compiled_filter: CompiledExpr | None = field(default=None, init=False, repr=False, compare=False)
    compiled_convert: CompiledExpr | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Normalise in place (frozen: via object.__setattr__) so equal specs compare equal.
        set_ = object.__setattr__
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ListenerError(
                f"invalid listener name {_show(self.name)}: use 1-128 characters of A-Z a-z 0-9 . _ -"
            )
        set_(self, "kinds", _kinds(self.kinds))
        if isinstance(self.lease, str):
            set_(self, "lease", parse_duration(self.lease))
        elif isinstance(self.lease, timedelta):
            check_duration(self.lease, format_duration(self.lease) if self.lease > timedelta(0) else None)
        elif self.lease is not None:
            raise ListenerError(f"invalid lease {_show(self.lease)}: give a positive duration like '30s'")
        set_(self, "created_at", _time(self.created_at, "created_at"))
        if self.renewed_at is not None:
            set_(self, "renewed_at", _time(self.renewed_at, "renewed_at"))
        for attr in ("output_topic", "type", "convert", "principal"):
            v = getattr(self, attr)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise ListenerError(
                    f"invalid {attr} {_show(v)}: give a non-empty string or leave it out"
                )
        if self.principal is not None and len(self.principal) > 256:
            raise ListenerError(f"invalid principal {_show(self.principal)}: at most 256 characters")
        if self.output_topic is not None and not _TOPIC.fullmatch(self.output_topic):
            raise ListenerError(
                f"invalid output_topic {_show(self.output_topic)}: a Kafka topic name has 1-249 "
                f"characters of A-Z a-z 0-9 . _ -"
            )
        if not isinstance(self.include_current_state, bool):
            raise ListenerError("include_current_state must be true or false")
        if not isinstance(self.filter, str):
            raise ListenerError(f"invalid filter {_show(self.filter)}: give a CEL expression as a string")
        # Expressions last: ExpressionError (with position) propagates as is.
        set_(self, "compiled_filter", compile_filter(self.filter))
        if self.convert is not None:
            set_(self, "compiled_convert", compile_converter(self.convert))

    # -- lease ------------------------------------------------------------------------------
    @property
    def expires_at(self) -> datetime | None:
        """When the lease runs out without renewal (None: never)."""
        if self.lease is None:
            return None
        return (self.renewed_at or self.created_at) + self.lease

    def is_expired(self, now: datetime | None = None) -> bool:
        """True once the lease ran out."""
        exp = self.expires_at
        return exp is not None and (now or _now()) >= exp

    def renewed(self, now: datetime | None = None) -> ListenerSpec:
        """A copy whose lease restarts at ``now``."""
        return replace(self, renewed_at=now or _now())

    def topic(self, settings: Settings) -> str:
        """The output topic: the explicit one, else ``settings.listener_output_topic``."""
        return self.output_topic or settings.listener_output_topic

    # -- JSON on the registry topic -----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form (also what the CLI shows)."""
        return {
            "format": FORMAT_VERSION,
            "name": self.name,
            "filter": self.filter,
            "convert": self.convert,
            "kinds": list(self.kinds),
            "include_current_state": self.include_current_state,
            "output_topic": self.output_topic,
            "type": self.type,
            "lease": format_duration(self.lease) if self.lease is not None else None,
            "created_at": self.created_at.isoformat(),
            "renewed_at": self.renewed_at.isoformat() if self.renewed_at else None,
            "expires_at": self.expires_at.isoformat() if self.expires_at else None,
            "principal": self.principal,
        }

    def to_json(self) -> bytes:
        """UTF-8 JSON bytes for the registry record value."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ListenerSpec:
        """Build from :meth:`to_dict` output. Unknown keys (from newer writers) are ignored.

        Raises only :class:`ListenerError` or :class:`ExpressionError`, whatever ``data`` holds.
        """
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise ListenerError(
                f"a listener registration must be a JSON object with a name (a string), not {_show(data)}"
            )
        known = {f.name for f in fields(cls) if f.init}
        kwargs = {k: v for k, v in data.items() if k in known and v is not None}
        try:
            spec = cls(**kwargs)
        except (ListenerError, ExpressionError):
            raise
        except RecursionError:
            raise ListenerError("listener registration is nested too deeply") from None
        except Exception as exc:  # a gap in the checks above must still not crash a reader
            raise ListenerError(
                f"invalid listener registration: {type(exc).__name__}: {_show(str(exc))}"
            ) from exc
        if "created_at" not in kwargs:  # else each reader would give it its own time, and its
            # notifications another registration (fifolane.notifications: a view starts again)
            raise ListenerError("a listener registration needs created_at (an ISO 8601 time with its zone, "
                                "as `fifolane listeners add` writes)")
        return spec

    @classmethod
    def from_json(cls, raw: bytes | str) -> ListenerSpec:
        """Parse a registry record value; raise ``ListenerError``/``ExpressionError`` if invalid
        (and nothing else, whatever the bytes are)."""
        try:
            data = json.loads(raw)
        except RecursionError:
            raise ListenerError("listener registration is not valid JSON: nested too deeply") from None
        except (ValueError, TypeError) as exc:  # includes UnicodeDecodeError
            raise ListenerError(f"listener registration is not valid JSON: {_show(str(exc))}") from None
        return cls.from_dict(data)
