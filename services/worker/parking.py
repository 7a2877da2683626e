"""Parked groups (``--on-failure park``): a group whose event keeps failing waits, durably.

With the park policy, an event whose handler fails after its retries is not dead-lettered:
its group is *parked*. That event and every later event of the group are *held*; the other
groups go on. Held events live in the compacted *parked* topic (docs/formats.md, "Parked
groups"), in the partition of their group, written in the worker's transaction:

- key ``<group>``: what parked the group (reason, first error, origin), JSON;
- key ``<group>\\x00<seq>``: one held input record (key, value, headers, origin), JSON;
- a tombstone when the group is released, and for each held record once it is replayed.

So a parked group stays parked across restarts, partition moves and SIGKILL: the new owner
reads the parked topic before it processes the partition. ``fifolane groups release GROUP``
writes a release record to the group's input partition; the owner handles it in the group's
order: it dead-letters the head if asked (``--skip-head``), then replays the held records one
by one, in order, each through the normal path; events that arrive meanwhile are held behind
them. When none is left the group is unparked; if a replayed event fails again, the group is
parked again at that event.

:class:`Parking` keeps the parked groups of the worker's partitions in memory (few, by
nature) and journals its changes, so an aborted transaction takes them back.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

__all__ = ["Held", "HeldRecord", "Parked", "Parking", "held_key", "parse_parked"]

log = logging.getLogger(__name__)

Produce = Callable[..., None]


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: Any) -> bytes | None:
    return None if text is None else base64.b64decode(str(text))


@dataclass
class Held:
    """One held input record."""

    seq: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    partition: int
    offset: int
    timestamp: int

    def to_json(self) -> bytes:
        return json.dumps({"seq": self.seq, "key": _b64(self.key), "value": _b64(self.value),
                           "headers": [[k, _b64(v)] for k, v in self.headers],
                           "partition": self.partition, "offset": self.offset,
                           "timestamp": self.timestamp}, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Held:
        d = json.loads(raw)
        return cls(int(d["seq"]), _unb64(d["key"]), _unb64(d["value"]),
                   [(str(k), _unb64(v) or b"") for k, v in d.get("headers") or []],
                   int(d["partition"]), int(d["offset"]), int(d.get("timestamp", 0)))

    def record(self, topic: str) -> HeldRecord:
        """As a consumed record, for the worker's ingest."""
        return HeldRecord(self, topic)


class HeldRecord:
    """A held record read as a consumed one (services.worker.kafka.Record)."""

    __slots__ = ("_held", "_topic")

    def __init__(self, held: Held, topic: str) -> None:
        self._held, self._topic = held, topic

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._held.partition

    def offset(self) -> int:
        return self._held.offset

    def key(self) -> bytes | None:
        return self._held.key

    def value(self) -> bytes | None:
        return self._held.value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._held.headers

    def timestamp(self) -> tuple[int, int]:
        return (1, self._held.timestamp)


@dataclass
class Parked:
    """A parked group: why, and its held records in order."""

    group: str
    partition: int
    reason: str
    error: str
    first_offset: int
    parked_at: str
    next_seq: int = 0
    releasing: bool = False
    held: deque[Held] = field(default_factory=deque)

    def meta(self) -> bytes:
        return json.dumps({"group": self.group, "partition": self.partition, "reason": self.reason,
                           "error": self.error[:4000], "first_offset": self.first_offset,
                           "parked_at": self.parked_at, "next_seq": self.next_seq,
                           "releasing": self.releasing, "held": len(self.held)},
                          separators=(",", ":")).encode()


def held_key(group: str, seq: int) -> bytes:
    return group.encode() + b"\x00" + f"{seq:020d}".encode()


def parse_parked(records: Iterable[tuple[bytes, bytes | None]], partition: int) -> dict[str, Parked]:
    """The parked groups of one partition from its parked-topic records (last per key)."""
    latest: dict[bytes, bytes | None] = {}
    for key, value in records:
        latest[key] = value
    groups: dict[str, Parked] = {}
    held: dict[str, list[Held]] = {}
    for key, value in latest.items():
        if value is None:
            continue
        name, sep, _seq = key.partition(b"\x00")
        try:
            if sep:
                held.setdefault(name.decode(), []).append(Held.from_json(value))
            else:
                d = json.loads(value)
                groups[name.decode()] = Parked(
                    str(d["group"]), partition, str(d["reason"]), str(d["error"]), int(d["first_offset"]),
                    str(d["parked_at"]), int(d.get("next_seq", 0)), bool(d.get("releasing", False)))
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            log.warning("ignoring a bad parked-topic record %r: %s", key[:100], exc)
    for group, records_ in held.items():
        parked = groups.get(group)
        if parked is not None:
            parked.held = deque(sorted(records_, key=lambda h: h.seq))
            # The group's record is written when it parks or releases, not per held record:
            # its next_seq is behind the held records', which a new owner must not reuse (a
            # reused key replaces a held record in the compacted topic: an event lost).
            parked.next_seq = max(parked.next_seq, parked.held[-1].seq + 1)
    return groups


class Parking:
    """The parked groups of a worker's partitions (see the module docstring)."""

    def __init__(self, topic: str, produce: Produce) -> None:
        self.topic = topic
        self._produce = produce
        self.groups: dict[str, Parked] = {}
        self._before: dict[str, Parked] | None = None  # the committed state, while changed

    def __bool__(self) -> bool:
        return bool(self.groups)

    @property
    def held(self) -> int:
        return sum(len(p.held) for p in self.groups.values())

    # -- partitions ---------------------------------------------------------------------------
    def load(self, partition: int, groups: dict[str, Parked]) -> None:
        """The parked groups of a newly owned partition (read from the parked topic)."""
        self.groups.update(groups)
        if self._before is not None:
            self._before.update(copy.deepcopy(groups))
        if groups:
            log.info("partition %d: %d parked group(s) (%d held events)", partition, len(groups),
                     sum(len(p.held) for p in groups.values()))

    def drop(self, partitions: set[int]) -> None:
        """Partitions gone: their parked groups are their new owner's."""
        for name in [n for n, p in self.groups.items() if p.partition in partitions]:
            del self.groups[name]
            if self._before is not None:
                self._before.pop(name, None)

    # -- changes (in the open transaction) ------------------------------------------------------
    def _change(self) -> None:
        if self._before is None:
            self._before = copy.deepcopy(self.groups)

    def park(self, group: str, partition: int, reason: str, error: str, first: Held) -> None:
        """Park ``group`` with ``first`` as its head (also a group being released again,
        at the replayed record that failed: it goes back in front of the held ones)."""
        self._change()
        parked = self.groups.get(group)
        if parked is None:
            parked = self.groups[group] = Parked(group, partition, reason, error, first.offset,
                                                 datetime.now(UTC).isoformat())
        else:  # a replayed event failed again: parked at it, the rest stays held behind
            parked.reason, parked.error, parked.first_offset = reason, error, first.offset
            parked.releasing = False
        if not parked.held or parked.held[0].offset != first.offset:
            # a new head (a replayed record that failed again is still the head)
            first.seq = min([h.seq for h in parked.held] + [parked.next_seq]) - (1 if parked.held else 0)
            if not parked.held:
                parked.next_seq += 1
            parked.held.appendleft(first)
            self._produce(self.topic, first.to_json(), held_key(group, first.seq), partition)
        self._produce(self.topic, parked.meta(), group.encode(), partition)
        log.warning("group %r parked: %s", group, error)

    def hold(self, group: str, record: Held) -> None:
        """Hold one more record of a parked group, behind the others."""
        self._change()
        parked = self.groups[group]
        record.seq = parked.next_seq
        parked.next_seq += 1
        parked.held.append(record)
        self._produce(self.topic, record.to_json(), held_key(group, record.seq), parked.partition)

    def release(self, group: str) -> Parked | None:
        """Start releasing ``group`` (None: it is not parked)."""
        parked = self.groups.get(group)
        if parked is None:
            return None
        self._change()
        parked.releasing = True
        self._produce(self.topic, parked.meta(), group.encode(), parked.partition)
        return parked

    def next_held(self, group: str) -> Held | None:
        """The next held record of a releasing group, to replay (None: none left, and the
        group is unparked). It stays held until :meth:`replayed` (in the transaction that
        commits its effects), so a crash while it runs replays it again."""
        self._change()
        parked = self.groups[group]
        if parked.held:
            return parked.held[0]
        del self.groups[group]
        self._produce(self.topic, None, group.encode(), parked.partition)
        log.info("group %r released", group)
        return None

    def replayed(self, group: str) -> None:
        """The head of a releasing group is done (applied or dead-lettered)."""
        self._change()
        parked = self.groups[group]
        held = parked.held.popleft()
        self._produce(self.topic, None, held_key(group, held.seq), parked.partition)

    # -- the transaction ------------------------------------------------------------------------
    def commit(self) -> None:
        self._before = None

    def rollback(self) -> None:
        if self._before is not None:
            self.groups = self._before
            self._before = None


def load_parked(consumer: Any, topic: str, partition: int, timeout: float = 30.0) -> dict[str, Parked]:
    """Read one partition of the parked topic to its end (committed records only) and
    return its parked groups. ``consumer``: a fresh consumer (read_committed), closed here."""
    import time

    from confluent_kafka import TopicPartition

    try:
        tp = TopicPartition(topic, partition)
        low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
        if high <= low:
            return {}
        consumer.assign([TopicPartition(topic, partition, low)])
        records: list[tuple[bytes, bytes | None]] = []
        deadline = time.monotonic() + timeout
        pos = low
        while pos < high and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.2):
                if msg.error() is None:
                    records.append((msg.key() or b"", msg.value()))
                    pos = max(pos, msg.offset() + 1)
            if pos < high:
                got = consumer.position([tp])[0].offset
                pos = max(pos, got if got >= 0 else pos)
        return parse_parked(records, partition)
    finally:
        consumer.close()


def read_parked(kafka_conf: dict[str, Any], topic: str, timeout: float = 30.0) -> dict[str, Parked]:
    """Every parked group, from all partitions of the parked topic (for the CLI)."""
    import uuid

    from confluent_kafka import Consumer

    probe = Consumer({**kafka_conf, "group.id": f"fifolane-parked-{uuid.uuid4().hex[:8]}"})
    try:
        md = probe.list_topics(topic, timeout=timeout).topics.get(topic)
    finally:
        probe.close()
    if md is None or md.error is not None:
        return {}
    out: dict[str, Parked] = {}
    for p in sorted(md.partitions):
        consumer = Consumer({**kafka_conf, "group.id": f"fifolane-parked-{uuid.uuid4().hex[:8]}",
                             "enable.auto.commit": False, "isolation.level": "read_committed"})
        out.update(load_parked(consumer, topic, p, timeout))
    return out


def release_record(skip_head: bool) -> tuple[bytes, list[tuple[str, str | bytes | None]]]:
    """Value and headers of the input record that releases a parked group."""
    value = json.dumps({"skip_head": skip_head}, separators=(",", ":")).encode()
    return value, [("fifolane.control", b"release")]
