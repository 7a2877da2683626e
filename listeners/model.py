"""The listener registration model, as stored (JSON) on the compacted registry topic.

Registry record: key = listener name, value = :meth:`ListenerSpec.to_json`, tombstone = removed
(docs/formats.md). A spec validates itself on construction: the name, the kinds, the lease,
and both expressions (compiled, so an invalid one is refused with its position).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from fifolane.config import Settings
from fifolane.errors import ListenerError
from listeners.durations import format_duration, parse_duration
from listeners.expr import compile_converter, compile_filter

__all__ = ["ALL_KINDS", "FORMAT_VERSION", "ListenerSpec"]

ALL_KINDS: tuple[str, ...] = ("created", "modified", "removed")
FORMAT_VERSION = 1
_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")


def _now() -> datetime:
    return datetime.now(UTC)


def _kinds(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    kinds = {str(k).strip().lower() for k in items if str(k).strip()}
    bad = sorted(kinds - set(ALL_KINDS))
    if bad or not kinds:
        raise ListenerError(
            f"invalid kinds {bad or sorted(kinds)}: choose one or more of {', '.join(ALL_KINDS)}"
        )
    return tuple(k for k in ALL_KINDS if k in kinds)  # canonical order


def _time(value: Any, what: str) -> datetime:
    if isinstance(value, datetime):
        dt = value
    else:
        try:
            dt = datetime.fromisoformat(str(value))
        except ValueError as exc:
            raise ListenerError(
                f"invalid {what} {value!r}: expected an ISO-8601 timestamp"
            ) from exc
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """A listener registration.

    ``lease`` accepts a ``timedelta`` or text such as ``"30s"``; without one the listener lives
    until removed. ``output_topic`` None means the configured default
    (:meth:`topic`). ``type`` restricts the listener to one entity type.
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

    def __post_init__(self) -> None:
        # Normalise in place (frozen: via object.__setattr__) so equal specs compare equal.
        set_ = object.__setattr__
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ListenerError(
                f"invalid listener name {self.name!r}: use 1-128 characters of A-Z a-z 0-9 . _ -"
            )
        set_(self, "kinds", _kinds(self.kinds))
        if isinstance(self.lease, str):
            set_(self, "lease", parse_duration(self.lease))
        elif self.lease is not None and (
            not isinstance(self.lease, timedelta) or self.lease <= timedelta(0)
        ):
            raise ListenerError(
                f"invalid lease {self.lease!r}: give a positive duration like '30s'"
            )
        set_(self, "created_at", _time(self.created_at, "created_at"))
        if self.renewed_at is not None:
            set_(self, "renewed_at", _time(self.renewed_at, "renewed_at"))
        for attr in ("output_topic", "type", "convert"):
            v = getattr(self, attr)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise ListenerError(
                    f"invalid {attr} {v!r}: give a non-empty string or leave it out"
                )
        if not isinstance(self.include_current_state, bool):
            raise ListenerError("include_current_state must be true or false")
        # Expressions last: ExpressionError (with position) propagates as is.
        compile_filter(self.filter)
        if self.convert is not None:
            compile_converter(self.convert)

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
        }

    def to_json(self) -> bytes:
        """UTF-8 JSON bytes for the registry record value."""
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ListenerSpec:
        """Build from :meth:`to_dict` output. Unknown keys (from newer writers) are ignored."""
        if not isinstance(data, dict) or "name" not in data:
            raise ListenerError("a listener registration must be a JSON object with a name")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known and v is not None}
        return cls(**kwargs)

    @classmethod
    def from_json(cls, raw: bytes | str) -> ListenerSpec:
        """Parse a registry record value; raise ``ListenerError``/``ExpressionError`` if invalid."""
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ListenerError(f"listener registration is not valid JSON: {exc}") from exc
        return cls.from_dict(data)
