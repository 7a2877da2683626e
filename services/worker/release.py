"""Parked groups on the general path (``--on-failure park``): park, hold, release, replay.

A group whose handler failed is parked (:mod:`services.worker.parking` keeps its held
records, restored with the partition); its later events are held behind it. A release
control record replays the held records one at a time in the group's lane: each one's
completion, whose effects are in the same transaction as the tombstone of its held record,
lets the next one go. A release a previous owner left half done goes on once the partition
is active here (:meth:`Releases.resume`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container
from typing import Any

from services.worker.app import Event
from services.worker.ingest import Rejected, to_event
from services.worker.metrics import Stats
from services.worker.parking import Held, Parking

__all__ = ["Releases"]

log = logging.getLogger(__name__)


class Releases:
    """Parks, holds and replays the events of parked groups (see the module docstring).
    ``submit`` queues a replayed event in its lane (staged types go to their stage's);
    ``dead_letter`` sends a held record away with a reason (the worker's dead-letter call)."""

    def __init__(self, parking: Parking, *, input_topic: str, codec: Any, stats: Stats,
                 submit: Callable[[Event], None], dead_letter: Callable[..., None]) -> None:
        self.parking = parking
        self._input = input_topic
        self._decode = codec.decoder()
        self._stats = stats
        self._submit = submit
        self._dead_letter = dead_letter
        self._replaying: set[str] = set()  # groups with a held record being replayed

    def parked(self, group: str) -> bool:
        return group in self.parking.groups

    def park(self, event: Event, error: str) -> None:
        """The handler failed on ``event``: its group parks with it as the head."""
        self.parking.park(event.group, event.partition, "handler-error", error, _held(event))
        self._stats.held += 1
        self._stats.parks += 1

    def hold(self, event: Event) -> None:
        """An event of a parked group waits behind the head."""
        self.parking.hold(event.group, _held(event))
        self._stats.held += 1

    def release(self, event: Event) -> None:
        """A release control record: replay the group's held records (the head dead-lettered
        first when the record says ``skip_head``)."""
        assert event.value is not None
        parked = self.parking.release(event.group)
        if parked is None:
            log.info("release of group %r: it is not parked", event.group)
            return
        if event.value.get("skip_head") and parked.held:
            head = parked.held[0]
            self._dead_letter(head.key, head.value, head.headers, self._input, head.partition,
                              head.offset, "handler-error", f"skipped on release: {parked.error}")
            self.parking.replayed(event.group)
            self._stats.held -= 1
        self._replay_next(event.group)

    def completed(self, event: Event) -> None:
        """A replayed event is done: its held record goes, the next one is replayed."""
        self._replaying.discard(event.group)
        parked = self.parking.groups.get(event.group)
        if parked is not None and parked.releasing:
            self.parking.replayed(event.group)  # its effects are in this transaction
            self._replay_next(event.group)

    def resume(self, partitions: Container[int]) -> None:
        """Go on with the releases a previous owner of these partitions left half done."""
        for group, parked in list(self.parking.groups.items()):
            if parked.releasing and group not in self._replaying and parked.partition in partitions:
                self._replay_next(group)

    def forget(self) -> None:
        """After an abort: the replays under way are forgotten (the parking rolls back)."""
        self._replaying.clear()

    def _replay_next(self, group: str) -> None:
        while (held := self.parking.next_held(group)) is not None:
            self._stats.held -= 1
            self._stats.replayed += 1
            event = to_event(held.record(self._input), self._decode)
            if isinstance(event, Rejected):  # held as an event, so not expected
                self._dead_letter(held.key, held.value, held.headers, self._input, held.partition,
                                  held.offset, event.reason, event.error)
                self.parking.replayed(group)
                continue
            event.replay = True
            self._replaying.add(group)
            self._submit(event)  # in its lane: its completion replays the next one
            return


def _held(event: Event) -> Held:
    """An event as the held record of a parked group (its input record as it came)."""
    return Held(0, event.group.encode(), event.raw, list(event.headers), event.partition, event.offset,
                event.timestamp)
