"""What one handler call does: buffered entity writes and outputs, applied on success only."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple, Protocol

from fifolane.errors import AppError
from services.worker.app import Event, Output
from services.worker.limits import Limits, record_size
from services.worker.records import RecordCache
from services.worker.state import MAX_VERSION, MIN_VERSION, PartitionStore

__all__ = ["CallState", "Effects", "Refusal", "Write", "check_effects"]


class _Codec(Protocol):
    def encode(self, type_name: str, record: dict[str, Any]) -> bytes: ...


class _Catalog(Protocol):
    types: dict[str, Any]

    def entity(self, type_name: str) -> Any: ...


@dataclass(slots=True, init=False)  # its own __init__: native when compiled (services.worker.rows)
class Write:
    """One entity write: ``value``/``record`` are None for a delete."""

    type: str
    key: str
    group: str
    version: int
    value: bytes | None
    record: dict[str, Any] | None

    def __init__(self, type: str, key: str, group: str, version: int, value: bytes | None,
                 record: dict[str, Any] | None) -> None:
        self.type = type
        self.key = key
        self.group = group
        self.version = version
        self.value = value
        self.record = record

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle: a compiled class is made through its __init__
        return type(self), tuple(getattr(self, f.name) for f in fields(self))

    @property
    def entity_key(self) -> bytes:
        return f"{self.type}/{self.key}".encode()


@dataclass(slots=True, init=False)
class Effects:
    writes: dict[bytes, Write] = field(default_factory=dict)
    outputs: list[Output] = field(default_factory=list)

    def __init__(self, writes: dict[bytes, Write] | None = None, outputs: list[Output] | None = None) -> None:
        self.writes = {} if writes is None else writes
        self.outputs = [] if outputs is None else outputs


class CallState:
    """The ``GroupState`` a handler sees: the event's group, reads see its own writes."""

    __slots__ = ("event", "store", "codec", "catalog", "decode", "records", "effects", "_writes")

    def __init__(self, event: Event, store: PartitionStore, codec: _Codec, catalog: _Catalog,
                 records: RecordCache) -> None:
        self.event = event
        self.store = store
        self.codec = codec
        self.catalog = catalog
        self.records = records
        self.decode = records.read  # bytes -> the handler's own record dict
        self.effects = Effects()
        self._writes = self.effects.writes

    def get(self, type_name: str, key: str) -> dict[str, Any] | None:
        ekey = f"{type_name}/{key}".encode()
        w = self._writes.get(ekey)
        if w is not None:
            return w.record
        row = self.store.get(ekey)
        if row is None or row.deleted or row.group != self.event.group:
            return None
        assert row.value is not None
        record: dict[str, Any] = self.decode(row.value, ekey)
        return record

    def put(self, type_name: str, value: dict[str, Any]) -> None:
        et = self.catalog.types.get(type_name) or self.catalog.entity(type_name)  # entity(): the error
        key, group, version = et.key_of(value), et.group_of(value), et.version_of(value)
        if key is None or group is None or version is None:
            raise AppError(
                f"put({type_name!r}): the value needs its key ({et.key_path}), "
                f"group ({et.group_path}) and version ({et.version_field})"
            )
        if str(group) != self.event.group:
            raise AppError(
                f"put({type_name!r}): entity belongs to group {group!r} but the handler runs "
                f"for group {self.event.group!r}; a handler may only write its own group"
            )
        data = self.codec.encode(type_name, value)
        key = str(key)
        ekey = f"{type_name}/{key}".encode()  # Write.entity_key, without the call
        self.records.wrote(type_name, data, value, ekey)
        writes = self._writes
        if ekey in writes:
            del writes[ekey]  # keep write order = last write
        writes[ekey] = Write(type_name, key, str(group), int(version), data, value)

    def delete(self, type_name: str, key: str, version: int) -> None:
        self.catalog.entity(type_name)  # unknown type -> error
        w = Write(type_name, str(key), self.event.group, int(version), None, None)
        self.effects.writes.pop(w.entity_key, None)
        self.effects.writes[w.entity_key] = w

    def put_children(self, type_name: str, root_key: str, version: int,
                     children: Iterable[dict[str, Any]]) -> None:
        """Split records (SMILA's resequencer): make ``children`` the whole set of children of
        the root ``root_key``, at the root's ``version``.

        A child is an entity of ``type_name`` in this group whose key is
        ``<root_key>/<its own part>``; it carries the root's version (set here when the record
        has none). Children that an earlier version of the root produced and this one does not
        are deleted, and the children of a deleted root go with it
        (``put_children(type, key, delete_version, [])``). The root's version is kept as a
        marker, ``<type>/<root_key>/`` (a deleted entity, so a tombstone with that version on
        the state topic): a root not newer than the marker changes nothing, also one whose
        newer version had fewer children.
        """
        et = self.catalog.entity(type_name)
        prefix = f"{root_key}/"
        marker = self.effects.writes.get(f"{type_name}/{prefix}".encode())
        applied = marker.version if marker is not None else None
        if applied is None:
            row = self.store.get(f"{type_name}/{prefix}".encode())
            applied = row.version if row is not None else None
        if applied is not None and version <= applied:
            return  # an older (or the same) root: its children are stale
        keep: set[str] = set()
        for child in children:
            record = dict(child)
            if et.version_of(record) is None:
                record[et.version_field] = version
            key = et.key_of(record)
            if not isinstance(key, str) or not key.startswith(prefix) or len(key) == len(prefix):
                raise AppError(f"put_children({type_name!r}, {root_key!r}): a child's key must be "
                               f"'{prefix}<part>', got {key!r}")
            if et.version_of(record) != version:
                raise AppError(f"put_children({type_name!r}, {root_key!r}): child {key!r} has version "
                               f"{et.version_of(record)!r}, not the root's {version}")
            self.put(type_name, record)
            keep.add(key)
        existing = {ekey.decode().split("/", 1)[1]
                    for ekey, _row in self.store.scan_group(self.event.group, f"{type_name}/{prefix}".encode())}
        existing |= {w.key for w in self.effects.writes.values()
                     if w.type == type_name and w.key.startswith(prefix) and w.value is not None}
        for key in sorted(existing - keep):
            self.delete(type_name, key, version)
        self.delete(type_name, prefix, version)  # the marker

    def scan(self, type_name: str) -> list[dict[str, Any]]:
        prefix = f"{type_name}/".encode()
        out: dict[bytes, dict[str, Any]] = {}
        for ekey, row in self.store.scan_group(self.event.group, prefix):
            assert row.value is not None
            out[ekey] = self.decode(row.value, ekey)
        for ekey, w in self.effects.writes.items():
            if ekey.startswith(prefix):
                if w.record is None:
                    out.pop(ekey, None)
                else:
                    out[ekey] = w.record
        return list(out.values())

    def emit(self, topic: Any, key: Any, value: Any, headers: Any = ()) -> None:  # Any: checked here
        try:
            hdrs = tuple(tuple(h) if isinstance(h, list) else h for h in headers)  # confluent-kafka: tuples
        except TypeError:
            raise AppError(f"emit(): headers must be (str, bytes) pairs, not {type(headers).__name__}") from None
        bad = _bad_output(topic, key, value, hdrs, frozenset())
        if bad is not None:
            raise AppError(f"emit(): {bad}")
        self.effects.outputs.append(Output(topic, key, value, hdrs))


class Refusal(NamedTuple):
    """Why a handler result cannot be applied: a dead-letter reason and what to fix."""

    reason: str
    error: str


def check_effects(effects: Effects, limits: Limits, state_topic: str,
                  reserved: frozenset[str] = frozenset()) -> Refusal | None:
    """Why ``effects`` cannot be applied whole, or None. Checked before anything is
    applied, so a handler result is applied whole or dead-lettered whole: a version that
    does not fit a signed 64-bit integer, an output record that is not one (its topic name,
    or the types of its key, value or headers) or goes to one of the worker's own topics
    (``reserved``: the state topic's records are the worker's alone), or a record Kafka would
    refuse (over the producer's message.max.bytes or the topic's max.message.bytes)."""
    room = limits.room(state_topic) if effects.writes else 0
    too_large: Refusal | None = None
    headers = limits.state_headers
    for ekey, w in effects.writes.items():  # one pass (the hot path): a bad version first
        if type(w.version) is not int or not MIN_VERSION <= w.version <= MAX_VERSION:
            return Refusal("bad-version", f"{w.type} {w.key}: version {w.version!r} is not a signed "
                                          "64-bit integer")
        # (with state headers, its type and group are sent twice: in the key and the headers)
        extra = len(w.group.encode(errors="replace")) + len(w.type) if headers and w.value is not None else 0
        if too_large is None and len(ekey) + (len(w.value) if w.value is not None else 0) + extra > room:
            error = limits.too_large(state_topic, record_size(ekey, w.value) + extra, f"{w.type} {w.key}")
            assert error is not None
            too_large = Refusal("too-large", error)  # as an event the table handler writes
    if too_large is not None:
        return too_large
    for out in effects.outputs:
        o: Any = out  # its fields as they are (compiled code would check their declared types)
        bad = _bad_output(o.topic, o.key, o.value, o.headers, reserved)
        if bad is not None:
            return Refusal("handler-error", f"emit(): {bad}")
        error = limits.too_large(out.topic, record_size(out.key, out.value, out.headers), "an output record")
        if error is not None:
            return Refusal("handler-error", error + "; send less, or raise both limits")
    return None


_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")


def _bad_output(topic: Any, key: Any, value: Any, headers: Any, reserved: frozenset[str]) -> str | None:
    """What makes an output record one Kafka (or the worker) cannot take, or None. (Any: a
    handler may pass anything, also in an Output it returns.)"""
    if not isinstance(topic, str) or not _TOPIC_NAME.fullmatch(topic) or topic in (".", ".."):
        return f"{topic!r:.100} is not a Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -)"
    if topic in reserved:
        return f"{topic} is one of the worker's own topics; emit to a topic of your own"
    for what, data in (("key", key), ("value", value)):
        if data is not None and not isinstance(data, (bytes, str)):
            return f"the {what} must be bytes, str or None, not {type(data).__name__}"
        if isinstance(data, str) and not _utf8(data):
            return f"the {what} is a str that is not UTF-8 encodable (a lone surrogate?): {data!r:.100}"
    if not isinstance(headers, (tuple, list)):
        return f"headers must be (str, bytes) pairs, not {type(headers).__name__}"
    for header in headers:
        if (not isinstance(header, tuple) or len(header) != 2 or not isinstance(header[0], str)
                or (header[1] is not None and not isinstance(header[1], (bytes, str)))):
            return f"a header must be a (str, bytes) pair, not {header!r:.100}"
        if not _utf8(header[0]) or (isinstance(header[1], str) and not _utf8(header[1])):
            return f"a header is a str that is not UTF-8 encodable (a lone surrogate?): {header!r:.100}"
    return None


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
