"""Sending notifications: number them, keep each within its topic's limit, produce them.

A notification goes to the listener's output topic, partition = the source partition (mod
the topic's partitions), key = the state-topic key, header ``fifolane.listener``, in the
worker's transaction, so live notifications commit exactly once with their change. One
whose JSON is larger than the topic takes (a projection of a huge entity; a string of
control characters takes six bytes each) is replaced by a small one with a null ``value``
and ``"error": "too-large"`` (:func:`listeners.notify.too_large`): the change still reaches
the listener, in order, and nothing stalls the worker. One that Kafka refuses at once (its
topic deleted, not writable) goes to ``refused(topic, error)``, which suspends the listeners
writing there (listeners.runtime); any other failure is the transaction's. JSON has no NaN
or Infinity: a converter's projection holding one is not sent and counts as an evaluation
error of its listener (``failed``); an entity sent as it is has such a double as null.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fifolane.errors import KafkaClientError
from listeners.journal import SeqJournal
from listeners.model import ListenerSpec
from listeners.notify import (
    HEADER_LISTENER,
    NonFiniteError,
    assemble,
    encode_finite,
    encode_value,
    listener_prefix,
    too_large,
)

if TYPE_CHECKING:
    from listeners.matcher import Notification
    from listeners.snapshots import Snapshots

__all__ = ["Active", "Notifier", "resize"]

Produce = Callable[..., None]
#: Kafka refused a notification to this topic for good: True if its listeners are suspended
Refused = Callable[[str | None, KafkaClientError], bool]
#: A listener's projection cannot be sent: ``failed(name, message)`` counts it as its error
Failed = Callable[[str, str], None]
_MISSING: Any = object()


@dataclass(slots=True)
class Active:
    """A listener this worker delivers to, with what its notifications need."""

    spec: ListenerSpec
    topic: str
    partitions: int  # of the output topic
    room: int  # bytes of key + value + headers a notification may have
    headers: list[tuple[str, bytes]]
    prefix: str  # the constant start of its notifications' JSON

    @classmethod
    def of(cls, spec: ListenerSpec, topic: str, partitions: int, room: int) -> Active:
        headers = [(HEADER_LISTENER, spec.name.encode())]
        act = cls(spec, topic, partitions, room, headers, listener_prefix(spec.name, spec.created_at.isoformat()))
        act.resize(room)
        return act

    def resize(self, room: int) -> None:
        """``room``: the bytes of key + value + headers the output topic takes."""
        self.room = room - sum(len(k) + len(v) + 2 for k, v in self.headers)


def resize(active: Iterable[Active], room: Callable[[str], int]) -> None:
    """Measure notifications against the output topics' rooms as they are now: the worker reads
    its topics' limits again after Kafka refused a record as too large (an operator may have
    changed one: services.worker.limits.Limits.refresh); cheap, as the rooms are kept."""
    for act in active:
        act.resize(room(act.topic))


class Notifier:
    """Numbers and produces notifications (see the module docstring)."""

    def __init__(self, journal: SeqJournal, produce: Produce, failed: Failed | None = None) -> None:
        self.journal = journal
        self._number = journal.number
        self.produce = produce
        self.failed = failed
        self.sent = 0
        self.too_large = 0

    def encode(self, act: Active, value: Mapping[str, Any] | None) -> str | None:
        """The JSON of a projection; None if a converter's projection holds a NaN or an
        infinite double (reported to ``failed``: an evaluation error of the listener)."""
        try:
            return encode_value(value)
        except NonFiniteError as exc:
            if act.spec.convert is None:
                return encode_finite(value)
            if self.failed is not None:
                self.failed(act.spec.name, f"converter {act.spec.convert!r} failed: {type(exc).__name__}: {exc}; "
                                           "the change is not notified")  # fmt: skip
            return None

    def send(self, act: Active, kind: str, partition: int, ekey: bytes, parts: tuple[str, str, str],
             value_json: str) -> None:
        """One notification (``parts``: :func:`listeners.notify.change_parts` of the change,
        ``value_json``: :func:`listeners.notify.encode_value` of its projection)."""
        seq = self._number(act.spec.name, partition)
        value = assemble(act.prefix, kind, parts, value_json, seq)
        if len(value) + len(ekey) > act.room:
            value = too_large(act.prefix, kind, parts, seq, len(value))
            self.too_large += 1
        self.produce(act.topic, value, ekey, partition % act.partitions, act.headers)
        self.sent += 1

    def send_checked(self, act: Active, kind: str, partition: int, ekey: bytes, parts: tuple[str, str, str],
                     value: Mapping[str, Any] | None, refused: Refused) -> bool:
        """:meth:`send` of projection ``value``; False if it cannot be encoded (:meth:`encode`)
        or Kafka refused it at once and ``refused`` took it."""
        value_json = self.encode(act, value)
        if value_json is None:
            return False
        try:
            self.send(act, kind, partition, ekey, parts, value_json)
        except KafkaClientError as exc:
            if not (exc.refused and refused(act.topic, exc)):
                raise
            return False
        return True

    def send_all(self, notes: Sequence[Notification], active: Mapping[str, Active], snaps: Snapshots | None,
                 partition: int, ekey: bytes, parts: tuple[str, str, str], refused: Refused) -> int:
        """The notifications of one change; how many were sent. ``snaps``: the snapshots in
        progress, which hold back keys their chunks will announce."""
        # Listeners without a converter share the projection (the new record): encoded once.
        last_value: Any = _MISSING
        value_json = ""
        sent = 0
        send = self.send
        for n in notes:
            act = active.get(n.listener)
            if act is None:
                continue  # suspended by this very change
            if snaps is not None and snaps.holds(n.listener, partition, ekey):
                continue  # its snapshot chunk will announce the then current state
            if n.value is not last_value:
                try:
                    value_json = encode_value(n.value)
                except NonFiniteError:
                    encoded = self.encode(act, n.value)
                    if encoded is None:
                        last_value = _MISSING
                        continue
                    value_json = encoded
                last_value = n.value
            try:  # (send_checked, inline: one call less per notification)
                send(act, n.kind, partition, ekey, parts, value_json)
            except KafkaClientError as exc:
                if not (exc.refused and refused(act.topic, exc)):
                    raise
                continue
            sent += 1
        return sent
