"""Reading a listener's notifications: :class:`ListenerClient` and :class:`MaterializedView`.

The client reads the listener's output topic (``read_committed``), keeps the notifications of
its listener (header ``fifolane.listener``), drops duplicates (same source partition and a
sequence number not above the last one seen) and records the gaps it can prove
(:class:`listeners.seq.SeqTracker`). While it runs it renews the listener's lease, if it has
one, every third of the lease.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, TopicPartition

from fifolane.config import Settings
from fifolane.errors import ListenerError
from fifolane.notifications import ViewState
from fifolane.query import json_object
from listeners.model import ListenerSpec
from listeners.notify import HEADER_LISTENER
from listeners.registry import get_listener, renew
from listeners.seq import Gap, SeqTracker

__all__ = ["ListenerClient", "MaterializedView"]

log = logging.getLogger(__name__)


class ListenerClient:
    """Iterate the notifications of listener ``name`` (dicts as in docs/formats.md).

    ``from_beginning``: read the output topic from its start (else only new notifications).
    ``timeout``: stop iterating after this many seconds without a notification (None: never).
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, settings: Settings, name: str, *, from_beginning: bool = False,
                 timeout: float | None = None, spec: ListenerSpec | None = None) -> None:  # fmt: skip
        self.settings = settings
        self.name = name
        self.spec = spec or get_listener(settings, name)
        self.topic = self.spec.topic(settings)
        self.timeout = timeout
        self.tracker = SeqTracker()
        self.skipped = 0  # records of the output topic that were not notifications
        self._header = name.encode()
        self._consumer = Consumer(settings.kafka_config(**{
            "group.id": f"fifolane-listen-{name}-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
        }))  # fmt: skip
        md = self._consumer.list_topics(self.topic, timeout=30).topics.get(self.topic)
        if md is None or md.error is not None:
            raise ListenerError(f"output topic {self.topic!r} of listener {name!r} does not exist")
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        self._consumer.assign([TopicPartition(self.topic, p, start) for p in md.partitions])
        self._next_renewal = self._renewal_due()

    @property
    def gaps(self) -> list[Gap]:
        """Gaps proven so far (missing notifications)."""
        return self.tracker.gaps

    @property
    def duplicates(self) -> int:
        """Duplicates dropped so far."""
        return self.tracker.duplicates

    def _renewal_due(self) -> float | None:
        lease = self.spec.lease
        return None if lease is None else time.monotonic() + lease.total_seconds() / 3

    def renew(self) -> None:
        """Restart the lease now (not once the listener was removed or replaced: warned)."""
        renewed = renew(self.settings, self.spec)
        if renewed is None:
            log.warning("listener %r was removed or replaced since this started: its lease is no "
                        "longer renewed from here", self.name)
            self._next_renewal = None
            return
        self.spec = renewed
        self._next_renewal = self._renewal_due()

    def poll(self, timeout: float = 0.2) -> list[dict[str, Any]]:
        """The new notifications that arrived within ``timeout`` (may be empty)."""
        if self._next_renewal is not None and time.monotonic() >= self._next_renewal:
            self.renew()
        out = []
        for msg in self._consumer.consume(500, timeout=timeout):
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise ListenerError(f"reading {self.topic!r}: {err}")
                continue
            headers = dict(msg.headers() or ())
            if headers.get(HEADER_LISTENER, self._header) != self._header:
                continue
            note = json_object(msg.value() or b"null")
            if note is None or note.get("listener") != self.name:
                self._skip(msg, "not a notification (a JSON object) of this listener")
                continue
            why = _malformed(note)
            if why is not None:
                self._skip(msg, why)
                continue
            if self.tracker.accept(self.name, note["partition"], note["seq"]):
                out.append(note)
        return out

    def _skip(self, msg: Any, why: str) -> None:
        """A record in the output topic that is not a notification: anyone who may write the
        topic may write anything to it, and one such record must not stop every reader."""
        self.skipped += 1
        if self.skipped == 1 or self.skipped % 1000 == 0:
            log.warning("%s[%s] at offset %s skipped: %s (%d skipped so far)", self.topic, msg.partition(),
                        msg.offset(), why, self.skipped)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        idle_since = time.monotonic()
        while True:
            notes = self.poll()
            if notes:
                idle_since = time.monotonic()
                yield from notes
            elif self.timeout is not None and time.monotonic() - idle_since >= self.timeout:
                return

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> ListenerClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_KINDS = frozenset({"created", "modified", "removed"})


def _malformed(note: dict[str, Any]) -> str | None:
    """What makes ``note`` no notification (docs/formats.md); None: it has the shape of one.
    A forged sequence number past what a worker writes would make every real one look like a
    duplicate: partition and seq are checked for range too."""
    partition, seq = note.get("partition"), note.get("seq")
    if type(partition) is not int or not 0 <= partition < 1 << 31:
        return "a notification needs a partition (an int from 0)"
    if type(seq) is not int or not 0 <= seq < 1 << 63:
        return "a notification needs a seq (a signed 64-bit int from 0)"
    if note.get("kind") not in _KINDS or not isinstance(note.get("type"), str) or not isinstance(note.get("key"), str):
        return "a notification needs a kind (created, modified, removed), a type and a key (strings)"
    return None


class MaterializedView:
    """A dict ``"<type>/<key>" -> projection`` kept from notifications: ``created``/``modified``
    set the entry, ``removed`` deletes it, in order per source partition; across partitions
    (an entity that changed group) the higher version wins, and a new registration of the
    listener starts the view again (:class:`fifolane.notifications.ViewState`)."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.applied = 0
        self.updated_at: datetime | None = None
        self._state = ViewState()

    def apply(self, note: dict[str, Any]) -> None:
        """Apply one notification."""
        k = f"{note['type']}/{note['key']}"
        verdict = self._state.accept(k, note["kind"], int(note["version"]), int(note["partition"]),
                                     note.get("registration"))
        if verdict is False:
            return
        if verdict is None:  # a new registration: a new stream
            self.data.clear()
        if note["kind"] == "removed":
            self.data.pop(k, None)
        else:
            self.data[k] = note["value"]
        self.applied += 1

    def follow(self, client: ListenerClient, timeout: float = 0.2) -> int:
        """Apply what ``client`` has now (one poll); return how many were applied."""
        notes = client.poll(timeout)
        for note in notes:
            self.apply(note)
        return len(notes)
