"""How large a record Kafka takes, per topic: checked before a record is produced.

A record over the producer's ``message.max.bytes`` is refused by ``produce()`` itself; one over
its topic's ``max.message.bytes`` is refused by the broker later, and fails the whole
transaction. Either would fail again on every replay. So everything the worker derives from
an input record (state record, dead-letter copy, notification, handler output) is measured
first, against the smaller of the two limits (:meth:`Limits.room`), with room for Kafka's
own framing.

The limits are read once per topic and kept. An operator may change a topic's
``max.message.bytes`` while the worker runs: a record the kept limit lets through is then
refused by the broker and its transaction aborts. After such a refusal the worker reads the
limits again (:meth:`Limits.refresh`), so the replay and every later record are measured
against the topic's limit as it is now (a lowered one dead-letters them as ``too-large``, a
raised one takes them), without a broker round trip per record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from fifolane.errors import WorkerError

__all__ = ["FRAMING", "TOO_LARGE_CODES", "Limits", "TopicConfigs", "buffer_limit", "record_size"]

log = logging.getLogger(__name__)

#: Bytes a record needs beyond its key, value and headers: the record batch header (61),
#: the record's own varints and attributes, and a margin for librdkafka's estimate.
FRAMING = 512
_DEFAULT_TOPIC_MAX = 1_048_588  # Kafka's default max.message.bytes
#: Error codes (names) of a record or batch Kafka refused for its size: the limits may have changed
TOO_LARGE_CODES = frozenset({"MSG_SIZE_TOO_LARGE", "RECORD_LIST_TOO_LARGE", "INVALID_MSG_SIZE"})


def record_size(key: bytes | str | None, value: bytes | str | None,
                headers: Iterable[tuple[str, bytes | str | None]] | None = None) -> int:
    """The bytes of a record's key, value and headers (without framing)."""
    size = _size(key) + _size(value)
    if headers:
        for name, data in headers:
            size += len(name) + _size(data) + 2
    return size


def _size(data: bytes | str | None) -> int:
    if data is None:
        return 0
    return len(data.encode()) if isinstance(data, str) else len(data)


class Limits:
    """The largest record (key + value + headers) each topic takes.

    ``client_max``: the producer's ``message.max.bytes``; ``topic_max(topic)``: the topic's
    ``max.message.bytes`` (None if it cannot be read now: Kafka's default is assumed and
    asked again later); ``reread(topics)``: read these topics' configs from the broker again
    (:meth:`refresh`), so that ``topic_max`` answers with what they are now.
    """

    def __init__(self, client_max: int, topic_max: Callable[[str], int | None] | None = None,
                 state_headers: bool = False, reread: Callable[[list[str]], None] | None = None) -> None:
        self.client_max = client_max
        self._topic_max = topic_max
        self._reread = reread
        self._room: dict[str, int] = {}
        #: state records carry their type, group and version as headers (Settings.state_headers)
        self.state_headers = state_headers

    def room(self, topic: str) -> int:
        """Bytes of key, value and headers a record of ``topic`` may have."""
        room = self._room.get(topic)
        if room is None:
            found = self._topic_max(topic) if self._topic_max is not None else None
            limit = min(self.client_max, found if found is not None else _DEFAULT_TOPIC_MAX)
            room = limit - FRAMING
            if found is not None:
                self._room[topic] = room
        return room

    def refresh(self) -> dict[str, tuple[int, int]]:
        """Read the limits of the topics measured so far again (Kafka refused a record as too
        large: a topic's ``max.message.bytes`` may have changed since it was read). Returns the
        topics whose room changed: topic -> (room before, room now)."""
        before = dict(self._room)
        if self._reread is not None and before:
            self._reread(sorted(before))
        self._room.clear()
        changed: dict[str, tuple[int, int]] = {}
        for topic, old in before.items():
            now = self.room(topic)
            if now != old:
                changed[topic] = (old, now)
        if changed:
            log.warning("topic limits changed: %s", ", ".join(
                f"{t} takes {new} bytes (was {old})" for t, (old, new) in sorted(changed.items())))
        return changed

    def fits(self, topic: str, size: int) -> bool:
        return size <= self.room(topic)

    def too_large(self, topic: str, size: int, what: str) -> str | None:
        """Why a record of ``size`` bytes cannot go to ``topic`` (None if it can)."""
        room = self.room(topic)
        if size <= room:
            return None
        return (f"{what} for topic {topic} is {size} bytes, over the {room} bytes Kafka takes there "
                f"(the producer's message.max.bytes and the topic's max.message.bytes, less "
                f"{FRAMING} for framing)")


class TopicConfigs:
    """The configs of the topics a worker writes to, asked of the broker once per topic
    (``lookup``: names -> configs, :class:`WorkerError` if one is missing)."""

    def __init__(self, lookup: Callable[[list[str]], dict[str, dict[str, str]]]) -> None:
        self._lookup = lookup
        self.known: dict[str, dict[str, str]] = {}

    def load(self, names: list[str]) -> None:
        """Read these topics' configs (raises :class:`WorkerError` if one is missing)."""
        self.known.update(self._lookup(names))

    def reread(self, names: list[str]) -> None:
        """Read these topics' configs again (their limits may have changed). What cannot be read
        now (a topic gone, no answer) keeps the configs read before."""
        try:
            found = self._lookup(names)
        except WorkerError as exc:
            log.warning("configs of %s not read again now: %s", ", ".join(names), exc)
            return
        for name, configs in found.items():
            if configs:  # (empty: the broker did not answer in time)
                self.known[name] = configs

    def exists(self, topic: str) -> bool:
        if topic not in self.known:
            try:
                self.load([topic])
            except WorkerError:
                return False
        return True

    def max_bytes(self, topic: str) -> int | None:
        """The topic's max.message.bytes (None: not known now; asked again next time)."""
        if topic not in self.known:
            try:
                self.load([topic])
            except WorkerError as exc:  # a topic not there yet: Kafka's default for now
                log.info("max.message.bytes of %s not known now: %s", topic, exc)
                return None
        value = self.known[topic].get("max.message.bytes")
        return int(value) if value else None


def buffer_limit(opts: Any, avg_call: float) -> int:
    """How many events may wait in group queues (the worker's poll loop).

    A checkpoint drains them all, so they must be handled within about one commit
    interval (and well within the transaction timeout): with slow handlers the bound
    shrinks to what ``concurrency`` handlers get through in that time (``avg_call``: the
    average handler call in seconds, 0 if not known yet).
    """
    limit: int = opts.max_buffered
    if avg_call > 0:
        c = opts.concurrency
        limit = min(limit, max(4 * c, int(c * opts.commit_interval / avg_call)))
    return limit
