"""The records a history is made of: what was produced and what was observed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Effect", "History", "Notification", "ProducedEvent", "TableEntry"]


@dataclass(frozen=True, slots=True)
class ProducedEvent:
    """One input event as the test produced it.

    ``seq`` numbers the events of one ``group`` in production order (0, 1, 2, ...).
    ``key`` is the entity key as on the state topic (``reservation/R-1``). ``acked`` is
    False for an indeterminate produce (the client reported a failure: the record may or
    may not have been written), so its effect is allowed but not required.
    """

    group: str
    seq: int
    key: str
    version: int
    op: Literal["upsert", "delete"] = "upsert"
    value: Mapping[str, Any] | None = None
    acked: bool = True


@dataclass(frozen=True, slots=True)
class Effect:
    """One committed handler call, as its effect record shows it.

    ``start``/``end`` are wall-clock seconds (``time.time()`` on one machine);
    ``partition``/``offset`` locate the effect record (-1 if unknown).
    """

    group: str
    seq: int
    worker: str = ""
    start: float = 0.0
    end: float = 0.0
    partition: int = -1
    offset: int = -1


@dataclass(frozen=True, slots=True)
class TableEntry:
    """The committed state of one entity: its version, and its value (None = deleted)."""

    version: int
    value: Mapping[str, Any] | None

    @property
    def present(self) -> bool:
        return self.value is not None


@dataclass(frozen=True, slots=True)
class Notification:
    """One listener notification as a consumer read it (in read order per stream)."""

    listener: str
    partition: int  # the source partition the seq is scoped to
    seq: int
    key: str
    kind: str
    version: int
    value: Any = None
    offset: int = -1
    registration: str | None = None

    def payload(self) -> tuple[str, str, int, str]:
        """What a true duplicate repeats exactly."""
        return (self.key, self.kind, self.version, repr(self.value))


@dataclass(slots=True)
class History:
    """Everything a check needs; ``table``/``notifications`` are optional (None = not checked).

    ``effects`` are in read order (per group: effect-log order). ``compare_values``
    makes the table check compare record contents, not only versions and presence.
    """

    produced: Sequence[ProducedEvent]
    effects: Sequence[Effect] | None = None
    table: Mapping[str, TableEntry] | None = None
    notifications: Sequence[Notification] | None = None
    compare_values: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
