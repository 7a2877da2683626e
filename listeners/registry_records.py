"""The registry's bookkeeping records (docs/formats.md, "Listener registry"), by key:

- ``<name>/snapshot/<partition>``: :class:`Progress` of an include-current-state snapshot.
- ``<name>/status/<worker>``: :class:`ListenerStatus`, what one worker did with a listener
  (``suspended``: it stopped evaluating it, with the reason; ``failing``: its evaluations
  fail there, with the count and the last error); a tombstone clears it.

Listener names cannot contain ``/``, so these keys never clash with registrations (``<name>``).
Both records may come from any writer: ``from_json`` raises only :class:`RegistryRecordError`
for malformed input, and readers ignore such a record with a warning.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fifolane.errors import ListenerError

__all__ = [
    "STATUS_STATES",
    "ListenerStatus",
    "Progress",
    "RegistryRecordError",
    "parse_progress_key",
    "parse_status_key",
    "progress_key",
    "status_key",
]

_SNAPSHOT = "/snapshot/"
_STATUS = "/status/"
#: The states a status record may report (``failing`` is the newest: older readers ignore such
#: a record with a warning, as they do any status record they cannot read).
STATUS_STATES = ("suspended", "invalid", "failing")


class RegistryRecordError(ListenerError, ValueError):
    """A snapshot-progress or status record that is not in the documented format.

    Also a ``ValueError``, so readers written against the older ``from_json`` (which let
    ``ValueError`` escape) keep ignoring such records.
    """


def progress_key(name: str, partition: int) -> str:
    """Registry key of the snapshot progress of ``name`` on ``partition``."""
    return f"{name}{_SNAPSHOT}{partition}"


def parse_progress_key(key: str) -> tuple[str, int] | None:
    """``(name, partition)`` of a progress key; None for any other key."""
    name, sep, part = key.partition(_SNAPSHOT)
    if not sep or "/" in name or not part.isdigit() or not part.isascii():
        return None
    return name, int(part)


def status_key(name: str, worker: str) -> str:
    """Registry key of the status of listener ``name`` on worker ``worker``."""
    return f"{name}{_STATUS}{worker}"


def parse_status_key(key: str) -> tuple[str, str] | None:
    """``(name, worker)`` of a status key; None for any other key."""
    name, sep, worker = key.partition(_STATUS)
    if not sep or not name or "/" in name or not worker:
        return None
    return name, worker


def _load(raw: Any, what: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except RecursionError:
        raise RegistryRecordError(f"{what} record is not valid JSON: nested too deeply") from None
    except (ValueError, TypeError) as exc:  # includes UnicodeDecodeError
        raise RegistryRecordError(f"{what} record is not valid JSON: {str(exc)[:80]}") from None
    if not isinstance(data, dict):
        raise RegistryRecordError(f"{what} record must be a JSON object, not {type(data).__name__}")
    return data


def _field(data: dict[str, Any], name: str, kind: type, what: str, default: Any = ...) -> Any:
    value = data.get(name, default)
    if value is ...:
        raise RegistryRecordError(f"{what} record has no {name!r}")
    # bool is an int subclass: an int field must not take true/false
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RegistryRecordError(f"{what} record: {name!r} must be {kind.__name__}, not {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class Progress:
    """Include-current-state progress of one listener instance on one source partition.

    ``cursor`` is the last entity key (state-topic key bytes) already announced; keys sort
    bytewise, as in RocksDB. ``instance`` is the registration's ``created_at``: a listener
    removed and registered again under the same name gets a new snapshot.
    """

    listener: str
    partition: int
    instance: str
    cursor: bytes | None = None
    done: bool = False
    sent: int = 0

    def to_json(self) -> bytes:
        """The registry record value."""
        return json.dumps({
            "listener": self.listener, "partition": self.partition, "instance": self.instance,
            "cursor": None if self.cursor is None else self.cursor.hex(), "done": self.done,
            "sent": self.sent,
        }, separators=(",", ":")).encode()  # fmt: skip

    @classmethod
    def from_json(cls, raw: bytes | str) -> Progress:
        """Parse a record value; :class:`RegistryRecordError` (only) if it is malformed."""
        d = _load(raw, "snapshot progress")
        what = "snapshot progress"
        cursor = d.get("cursor")
        if cursor is not None and not isinstance(cursor, str):
            raise RegistryRecordError(f"{what} record: 'cursor' must be a hex string or null")
        partition = _field(d, "partition", int, what)
        sent = _field(d, "sent", int, what, 0)
        if partition < 0 or sent < 0:
            raise RegistryRecordError(f"{what} record: 'partition' and 'sent' must not be negative")
        try:
            cursor_bytes = None if cursor is None else bytes.fromhex(cursor)
        except ValueError:
            raise RegistryRecordError(f"{what} record: 'cursor' must be hex") from None
        return cls(_field(d, "listener", str, what), partition, _field(d, "instance", str, what),
                   cursor_bytes, bool(_field(d, "done", bool, what, False)), sent)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ListenerStatus:
    """What one worker did with one listener instance, e.g. suspended it (and why).

    ``instance`` is the registration's ``created_at`` (ISO): a status of an earlier instance
    of the same name is stale. ``at`` is when the worker wrote it. ``errors`` (optional, of
    ``failing``): the evaluation errors of this instance on that worker since it started
    evaluating it; ``reason`` is then the last error.
    """

    listener: str
    worker: str
    state: str
    reason: str
    instance: str
    at: datetime
    errors: int | None = None

    def to_json(self) -> bytes:
        """The registry record value."""
        d: dict[str, Any] = {
            "listener": self.listener, "worker": self.worker, "state": self.state,
            "reason": self.reason, "instance": self.instance, "at": self.at.isoformat(),
        }  # fmt: skip
        if self.errors is not None:
            d["errors"] = self.errors
        return json.dumps(d, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> ListenerStatus:
        """Parse a record value; :class:`RegistryRecordError` (only) if it is malformed."""
        what = "listener status"
        d = _load(raw, what)
        state = _field(d, "state", str, what)
        if state not in STATUS_STATES:
            raise RegistryRecordError(f"{what} record: unknown state {state[:40]!r} "
                                      f"(known: {', '.join(STATUS_STATES)})")  # fmt: skip
        at_text = _field(d, "at", str, what)
        try:
            at = datetime.fromisoformat(at_text) if len(at_text) <= 64 else None
        except ValueError:
            at = None
        if at is None:
            raise RegistryRecordError(f"{what} record: 'at' must be an ISO-8601 timestamp")
        errors = d.get("errors")
        if errors is not None and (not isinstance(errors, int) or isinstance(errors, bool) or errors < 0):
            raise RegistryRecordError(f"{what} record: 'errors' must be a count (an int, not negative)")
        return cls(_field(d, "listener", str, what), _field(d, "worker", str, what), state,
                   _field(d, "reason", str, what), _field(d, "instance", str, what),
                   at if at.tzinfo else at.replace(tzinfo=UTC), errors)  # fmt: skip

    def is_for(self, created_at: datetime) -> bool:
        """True if this status is about the registration instance created at ``created_at``."""
        try:
            instance = datetime.fromisoformat(self.instance) if len(self.instance) <= 64 else None
        except ValueError:
            return False
        if instance is None:
            return False
        instance = instance if instance.tzinfo else instance.replace(tzinfo=UTC)
        try:
            return instance == created_at
        except OverflowError:
            return False
