"""Per-group order and exclusivity, and concurrency beyond partitions (seed 000)."""

from __future__ import annotations

import random
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
from worker_support import WorkerThread, reservation, send_events, wait_accounted

from fifolane.config import Settings
from services.worker import App, Event, GroupState

pytestmark = pytest.mark.integration

GROUPS, PER_GROUP = 48, 15


def _recording_app(calls: list[tuple[str, int, int, float, float]], lock: threading.Lock) -> App:
    app = App("order-checker")

    @app.handler("reservation")
    def handle(event: Event, state: GroupState) -> None:
        start = time.monotonic()
        time.sleep(random.uniform(0, 0.004))  # a slow handler: 0-4 ms
        assert event.value is not None
        state.put("reservation", {**event.value, "state": "CONFIRMED"})
        with lock:
            calls.append((event.group, event.partition, int(event.value["seats"]), start, time.monotonic()))

    return app


def test_groups_in_order_never_concurrently_and_partitions_shared(settings: Settings, topics: Any) -> None:
    rng = random.Random(7)
    per_group = {f"G{g:03d}": 0 for g in range(GROUPS)}
    events = []
    for _ in range(GROUPS * PER_GROUP):  # interleave groups randomly, seq per group in order
        group = rng.choice([g for g, n in per_group.items() if n < PER_GROUP])
        seq = per_group[group]
        per_group[group] += 1
        events.append(("reservation", reservation(f"{group}-{seq}", group, 1, seats=seq + 1), "upsert"))
    n = send_events(settings, events)
    calls: list[tuple[str, int, int, float, float]] = []
    lock = threading.Lock()
    app = _recording_app(calls, lock)
    # 2 workers on 3 partitions, 8 groups in flight each: concurrency > partitions.
    with WorkerThread(settings, app, worker_id="a", concurrency=8) as w1, \
            WorkerThread(settings, app, worker_id="b", concurrency=8) as w2:
        wait_accounted([w1, w2], n, timeout=120)

    assert w1.stats.processed + w2.stats.processed == n
    assert w1.stats.dead_lettered + w2.stats.dead_lettered == 0
    aborts = w1.stats.aborts + w2.stats.aborts
    by_group: dict[str, list[tuple[str, int, int, float, float]]] = defaultdict(list)
    for call in calls:
        by_group[call[0]].append(call)
    assert len(by_group) == GROUPS
    for group, gcalls in by_group.items():
        gcalls.sort(key=lambda c: c[3])
        seqs = [c[2] for c in gcalls]
        if not aborts:  # arrival order, each event once
            assert seqs == list(range(1, PER_GROUP + 1)), group
        else:
            # An abort (a rebalance fences the open transaction: ILLEGAL_GENERATION) replays
            # a group from its last commit: its handler is called again, in order again.
            assert sorted(set(seqs)) == list(range(1, PER_GROUP + 1)) and seqs[-1] == PER_GROUP, (group, seqs)
            assert all(cur == prev + 1 or cur <= prev for prev, cur in zip(seqs, seqs[1:], strict=False)), (group, seqs)
        # exclusivity: each call starts after the previous one of its group ended
        for prev, cur in zip(gcalls, gcalls[1:], strict=False):
            assert cur[3] >= prev[4], f"overlap in group {group}: {prev} / {cur}"
    # concurrency within a partition: calls of different groups of one partition overlapped
    by_partition: dict[int, list[tuple[str, int, int, float, float]]] = defaultdict(list)
    for call in calls:
        by_partition[call[1]].append(call)
    overlapping_partitions = 0
    for pcalls in by_partition.values():
        pcalls.sort(key=lambda c: c[3])
        if any(b[3] < a[4] and a[0] != b[0] for a, b in zip(pcalls, pcalls[1:], strict=False)):
            overlapping_partitions += 1
    assert overlapping_partitions >= 1
    assert max(w1.stats.max_in_flight, w2.stats.max_in_flight) > 1
