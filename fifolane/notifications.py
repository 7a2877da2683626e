"""How a consumer applies a listener's notifications to a view (docs/formats.md).

A listener's notifications come per source partition in the order of the table's updates.
An entity that changes group changes partition: it is ``removed`` from its old partition
(``moved_to``) with the version that moved it, and ``created`` in the new one with that same
version, in either order. So across partitions the version decides (a live entry wins a tie
with a removal), while within a partition each notification applies in order. A new
registration of the listener is a new stream: the view starts again from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ViewState"]


@dataclass
class ViewState:
    """Per key, the version, partition and liveness of the entry a view holds (also for
    removed keys, so an older entry arriving later from another partition is ignored)."""

    registration: str | None = None
    entries: dict[str, tuple[int, int, bool]] = field(default_factory=dict)

    def accept(self, key: str, kind: str, version: int, partition: int,
               registration: str | None = None) -> bool | None:
        """Whether to apply a notification of ``key``: True to apply it, False to ignore it,
        None when it starts a new registration (the caller clears its view, then applies it)."""
        fresh = False
        if registration is not None and registration != self.registration:
            if self.registration is not None and registration < self.registration:
                return False  # a notification of an earlier registration
            self.registration = registration
            self.entries.clear()
            fresh = True
        live = kind != "removed"
        cur = self.entries.get(key)
        if cur is not None and cur[1] != partition and (version, live) < (cur[0], cur[2]):
            return False
        self.entries[key] = (version, partition, live)
        return None if fresh else True
