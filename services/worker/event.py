"""One input event, as a handler gets it (re-exported by services.worker.app and
services.worker).

A module of its own so that it is compiled with the general path (fifolane.compiled): an
event is made for every input record, and a compiled ``__init__`` makes it ~3x faster.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

__all__ = ["Event", "Op"]

Op = Literal["upsert", "delete", "move-out", "release"]


# init=False and an __init__ of its own: compiled with mypyc, a dataclass's generated
# __init__ runs interpreted; this one is native. Still a dataclass: fields(), replace(),
# ==, repr.
@dataclass(slots=True, init=False)
class Event:
    """One input event, decoded. ``value`` is None for deletes."""

    type: str
    key: str
    group: str
    version: int
    op: Op
    value: dict[str, Any] | None
    partition: int
    offset: int
    timestamp: int
    raw: bytes = b""
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    #: The scheduling lane: the group, or ``<group>\x00<stage>`` for a stage handler's event
    #: (one event per lane in flight, arrival order within a lane).
    lane: str = ""
    #: The pipeline stage this event is handled in (None: no stage handler).
    stage: str | None = None
    #: Stages this entity version already passed (an event made by an earlier stage).
    passed: frozenset[str] = frozenset()
    #: A held event of a parked group, replayed on its release.
    replay: bool = False

    def __init__(self, type: str, key: str, group: str, version: int, op: Op,
                 value: dict[str, Any] | None, partition: int, offset: int, timestamp: int,
                 raw: bytes = b"", headers: list[tuple[str, bytes]] | None = None, lane: str = "",
                 stage: str | None = None, passed: frozenset[str] = frozenset(),
                 replay: bool = False) -> None:
        self.type = type
        self.key = key
        self.group = group
        self.version = version
        self.op = op
        self.value = value
        self.partition = partition
        self.offset = offset
        self.timestamp = timestamp
        self.raw = raw
        self.headers = [] if headers is None else headers
        self.lane = lane or group
        self.stage = stage
        self.passed = passed
        self.replay = replay

    @property
    def entity_key(self) -> bytes:
        return f"{self.type}/{self.key}".encode()

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle: a compiled class is made through its __init__
        return type(self), tuple(getattr(self, f.name) for f in fields(self))
