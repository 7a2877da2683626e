"""Listener notification streams: gaps, duplicates and order of sequence numbers.

Per listener and source partition (docs/formats.md, notifications), seqs are consecutive within a
stable run; after a failover they jump by at least :data:`FAILOVER_DELTA`. A duplicate
is allowed only as an exact repeat (same seq, same payload), which a consumer drops.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from fifolane.notifications import ViewState
from fifolane.testing.model import Notification
from fifolane.testing.report import Report

__all__ = ["FAILOVER_DELTA", "check_notifications", "materialize"]

#: The seq jump that marks a failover (a new run), D of docs/formats.md: ``listeners.seq.DELTA``.
#: A new run starts at ``epoch_ms * D``, so two runs one second apart differ by about
#: 1000 * D; a larger D here (it was 2**32 = 1024 * D) reported quick hand-overs as gaps.
FAILOVER_DELTA = 1 << 22


def check_notifications(report: Report, notifications: Sequence[Notification],
                        delta: int = FAILOVER_DELTA) -> None:
    """Add ``listener_gap``, ``listener_duplicate`` and ``listener_order`` violations."""
    streams: dict[tuple[str, int], list[Notification]] = defaultdict(list)
    for n in notifications:
        streams[(n.listener, n.partition)].append(n)
    for (listener, partition), stream in sorted(streams.items()):
        subject = f"{listener}[{partition}]"
        by_seq: dict[int, Notification] = {}
        by_change: dict[tuple[str | None, str, str, int], Notification] = {}
        prev: Notification | None = None
        for n in stream:
            first = by_seq.get(n.seq)
            if first is not None:
                if first.payload() != n.payload():
                    report.add("listener_duplicate", subject,
                               f"seq {n.seq} reused for a different change: {first.payload()[:3]} "
                               f"then {n.payload()[:3]}", n.offset)
                continue  # an exact repeat: the consumer drops it
            # A new registration of the listener is a new stream: it announces the current
            # state again (include-current-state), so the same change may come once per
            # registration.
            change = (n.registration, n.key, n.kind, n.version)
            earlier = by_change.get(change)
            if earlier is not None:
                report.add("listener_duplicate", subject,
                           f"{n.kind} {n.key} v{n.version} delivered twice with seqs {earlier.seq} and "
                           f"{n.seq}: not droppable by seq", n.offset)
            else:
                by_change[change] = n
            by_seq[n.seq] = n
            if prev is not None:
                step = n.seq - prev.seq
                if step < 0:
                    report.add("listener_order", subject,
                               f"seq {n.seq} after seq {prev.seq} (offsets {prev.offset} then {n.offset})",
                               n.offset)
                elif 1 < step < delta:
                    missing = f"{prev.seq + 1}" if step == 2 else f"{prev.seq + 1}..{n.seq - 1}"
                    report.add("listener_gap", subject,
                               f"seq {missing} missing ({step - 1} notification(s)) between offsets "
                               f"{prev.offset} and {n.offset}", n.offset)
            if prev is None or n.seq > prev.seq:
                prev = n


def materialize(notifications: Iterable[Notification], listener: str) -> dict[str, Any]:
    """Apply ``listener``'s notifications in read order (exact repeats dropped) as a client
    does (:class:`fifolane.notifications.ViewState`): key -> value."""
    view: dict[str, Any] = {}
    seen: set[tuple[int, int]] = set()
    state = ViewState()
    for n in notifications:
        if n.listener != listener or (n.partition, n.seq) in seen:
            continue
        seen.add((n.partition, n.seq))
        verdict = state.accept(n.key, n.kind, n.version, n.partition, n.registration)
        if verdict is False:
            continue
        if verdict is None:
            view.clear()
        if n.kind == "removed":
            view.pop(n.key, None)
        else:
            view[n.key] = n.value
    return view
