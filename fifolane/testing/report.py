"""A check's outcome: violations by kind, counts and a readable summary."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["KINDS", "Report", "Violation"]

#: Every kind of violation the checker reports (counts always list all of them).
KINDS = (
    "lost",                # an event that had to be handled has no committed effect
    "duplicated",          # one event's effect committed more than once
    "unexpected",          # an effect for an event never produced, or one that was stale
    "order",               # a group's effects out of production order
    "overlap",             # two committed calls of one group ran at the same time
    "stale",               # the table differs from the reference (version, presence, content)
    "listener_gap",        # consecutive notification seqs missing within a run
    "listener_duplicate",  # a duplicate the consumer cannot drop (different seq or payload)
    "listener_order",      # a seq going backwards that is not a duplicate
)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken promise: its kind, the group or key it is about, and what was seen."""

    kind: str
    subject: str
    detail: str
    offset: int = -1

    def __str__(self) -> str:
        where = f" @offset {self.offset}" if self.offset >= 0 else ""
        return f"[{self.kind}] {self.subject}{where}: {self.detail}"


@dataclass(slots=True)
class Report:
    """Violations found plus what the history held (``stats``)."""

    violations: list[Violation] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    def add(self, kind: str, subject: str, detail: str, offset: int = -1) -> None:
        assert kind in KINDS, kind
        self.violations.append(Violation(kind, subject, detail, offset))

    @property
    def counts(self) -> dict[str, int]:
        """Violations per kind; every kind is listed, zeros included."""
        c = Counter(v.kind for v in self.violations)
        return {k: c.get(k, 0) for k in KINDS}

    @property
    def ok(self) -> bool:
        return not self.violations

    def of(self, kind: str) -> list[Violation]:
        return [v for v in self.violations if v.kind == kind]

    def summary(self, first: int = 5) -> str:
        """Stats, counts per kind, and the first ``first`` violations of each kind."""
        lines = ["history: " + ", ".join(f"{k}={v}" for k, v in self.stats.items())]
        lines.append("violations: " + ", ".join(f"{k}={n}" for k, n in self.counts.items()))
        for kind, n in self.counts.items():
            if not n:
                continue
            shown = self.of(kind)[:first]
            lines.append(f"first {len(shown)} of {n} {kind}:")
            lines.extend(f"  {v}" for v in shown)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()
