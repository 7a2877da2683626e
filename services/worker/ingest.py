"""Input records to events: decode, and check what the resequencer needs.

A record that cannot become an event gets a dead-letter reason instead (see dlq.REASONS).
Control records (header ``fifolane.control``) are the worker's own: a move-out of the entity
directory (services/worker/directory.py) becomes an event of op ``move-out``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from fifolane.errors import SerializationError, UnknownSchemaError
from fifolane.serde import Decoded
from services.worker.app import Event
from services.worker.directory import CONTROL_HEADER, MOVE_OUT, parse_move_out
from services.worker.state import MAX_GROUP_BYTES, MAX_VERSION, MIN_VERSION

__all__ = ["RELEASE", "Rejected", "check_group", "check_version", "to_event"]


class Rejected(NamedTuple):
    """Why a record is not an event: a dead-letter reason and a message saying what to fix."""

    reason: str
    error: str


def check_group(gbytes: bytes) -> Rejected | None:
    """A FIFO-group value fifolane can keep, given as UTF-8 (its length is packed in 16 bits)."""
    size = len(gbytes)
    if size > MAX_GROUP_BYTES:
        return Rejected("group-too-long", f"the FIFO-group value is {size} bytes of UTF-8, over the "
                                          f"{MAX_GROUP_BYTES} a group may have")
    return None


def check_version(version: Any) -> Rejected | None:
    """A version fifolane can keep: a signed 64-bit integer (an Avro long)."""
    if type(version) is not int or not MIN_VERSION <= version <= MAX_VERSION:
        reserved = " (-2^63 is reserved)" if version == MIN_VERSION - 1 and type(version) is int else ""
        return Rejected("bad-version", f"version {version!r} is outside the versions fifolane keeps{reserved}: "
                                       f"an integer from {MIN_VERSION} to {MAX_VERSION}")
    return None


def to_event(msg: Any, decode: Callable[[bytes], Decoded], decoded: Decoded | None = None) -> Event | Rejected:
    """The event of an input record (a confluent-kafka Message), or why there is none.

    ``decode``: a codec's decoder(); ``decoded``: the record's value, if the caller decoded it
    already.
    """
    value = msg.value()
    headers = msg.headers()
    if headers and decoded is None:
        control = _control(headers)
        if control is not None:
            return _control_event(msg, control, value, headers)
    if value is None:
        return Rejected("undecodable", "null value: input records must carry an encoded event")
    if decoded is None:
        try:
            decoded = decode(value)
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
    gbytes = group.encode()
    bad = check_group(gbytes)
    if bad is not None:
        return bad
    if mkey != gbytes:
        return Rejected("missing-group", f"record key {mkey[:200]!r} differs from the event's FIFO group {group[:200]!r}")
    if key is None or key == "":
        return Rejected("missing-key", "the event has no entity key")
    if version is None:
        return Rejected("missing-version", "the event has no version")
    bad = check_version(version)
    if bad is not None:
        return bad
    return Event(et.name, str(key), group, version, op, value_rec,  # type: ignore[arg-type]
                 msg.partition(), msg.offset(), msg.timestamp()[1], value, headers or [], group)


# Header values may be null (Kafka allows it): Any, since compiled code checks declared types.
def _control(headers: Sequence[tuple[str, Any]]) -> bytes | None:
    for name, data in headers:
        if name == CONTROL_HEADER:
            return data or b""
    return None


#: A control record releasing a parked group (services/worker/parking.py).
RELEASE = b"release"


def _control_event(msg: Any, control: bytes, value: bytes | None,
                   headers: Any) -> Event | Rejected:
    mkey = msg.key()
    if control not in (MOVE_OUT, RELEASE) or not mkey:
        return Rejected("undecodable", f"unknown control record {control[:40]!r} (header {CONTROL_HEADER})")
    try:
        group = mkey.decode()
    except UnicodeDecodeError:
        return Rejected("missing-group", "control record key is not UTF-8")
    if control == RELEASE:
        try:
            body = json.loads(value or b"{}")
            skip = bool(body.get("skip_head", False)) if isinstance(body, dict) else False
        except ValueError:
            return Rejected("undecodable", "malformed release record: expected JSON {\"skip_head\": bool}")
        return Event("", "", group, 0, "release", {"skip_head": skip}, msg.partition(), msg.offset(),
                     msg.timestamp()[1], value or b"", headers, group)
    move = parse_move_out(group, value)
    if isinstance(move, str):
        return Rejected("undecodable", move)
    type_name, _, key = move.key.decode().partition("/")
    return Event(type_name, key, group, move.version, "move-out",
                 {"to": move.to_group, "to_deleted": move.to_deleted, "copy": move.copy},
                 msg.partition(), msg.offset(), msg.timestamp()[1], value or b"", headers, group)
