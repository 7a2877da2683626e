"""Input records to events: decode, and check what the resequencer needs.

A record that cannot become an event gets a dead-letter reason instead (see dlq.REASONS).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from fifolane.errors import SerializationError, UnknownSchemaError
from fifolane.serde import Decoded
from services.worker.app import Event

__all__ = ["Rejected", "to_event"]


class Rejected(NamedTuple):
    """Why a record is not an event: a dead-letter reason and a message saying what to fix."""

    reason: str
    error: str


def to_event(msg: Any, codec: Any, decoded: Decoded | None = None) -> Event | Rejected:
    """The event of an input record (a confluent-kafka Message), or why there is none.

    ``decoded``: the record's value, if the caller decoded it already.
    """
    value = msg.value()
    if value is None:
        return Rejected("undecodable", "null value: input records must carry an encoded event")
    if decoded is None:
        try:
            decoded = codec.decode(value)
        except UnknownSchemaError as exc:
            return Rejected("unknown-schema", str(exc))
        except SerializationError as exc:
            return Rejected("undecodable", str(exc))
    et = decoded.type
    record = decoded.record
    if decoded.is_delete:
        key, group, version = record["key"], record["group"], record["version"]
        value_rec, op = None, "delete"
    else:
        key, group, version = et.key_of(record), et.group_of(record), et.version_of(record)
        value_rec, op = record, "upsert"
    if group is None or group == "":
        return Rejected("missing-group", "the event has no FIFO-group value")
    group = str(group)
    mkey = msg.key()
    if mkey is None:
        return Rejected("missing-group", "record has no key: input records must be keyed by their FIFO-group value")
    if mkey != group.encode():
        return Rejected("missing-group", f"record key {mkey!r} differs from the event's FIFO group {group!r}")
    if key is None or key == "":
        return Rejected("missing-key", "the event has no entity key")
    if version is None:
        return Rejected("missing-version", "the event has no version")
    return Event(et.name, str(key), group, int(version), op, value_rec,  # type: ignore[arg-type]
                 msg.partition(), msg.offset(), msg.timestamp()[1], value, msg.headers() or [])
