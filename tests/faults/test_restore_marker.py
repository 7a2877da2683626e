"""A checkpoint must not touch stores that are still being restored.

Restores run on their own threads (services/worker/restore.py) and open their partition's
store in the worker's :class:`~services.worker.state.StoreManager`; meanwhile the poll
thread commits the other partitions and writes each commit's batches through the same
manager. Every 30 s (and at the first commit after start) that write also records, for
*every* open store, the changelog's current end as the store's restore start ("we are the
partition's only writer and all we wrote is committed"). For a store whose restore is
still running that is false: it holds only part of the changelog. If the worker then dies
(or loses the partition) before the restore ends, the next restore of that store starts
at the recorded end, skips the rest, and the worker runs with entities missing: older
versions are no longer recognised as stale, deletes are forgotten.

Both tests use real RocksDB stores (no Kafka needed: the restore's writes are made
directly, as its thread makes them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from services.worker.state import Row, StoreManager

pytestmark = pytest.mark.faults


def _rows(start: int, n: int) -> list[tuple[bytes, int, bool, str, bytes]]:
    return [(f"reservation/R{i}".encode(), 5, False, "F1", b"v") for i in range(start, start + n)]


def test_a_commit_does_not_mark_a_store_that_is_still_restoring(tmp_path: Path) -> None:
    ends = {0: 10, 1: 100}  # changelog ends: partition 0 is active, 1 is restoring
    stores = StoreManager(tmp_path, "g", group_index=False, marks=ends.get)
    active = stores.open(0)
    active.restore_batch(_rows(0, 10), 10)
    restoring = stores.open(1)  # the restore thread's open, then its first batch
    restoring.restore_batch(_rows(0, 20), 20)
    active.put(b"reservation/R0", Row(6, False, "F1", b"v6"), active.get(b"reservation/R0"))
    stores.apply(stores.prepare())  # partition 0's checkpoint commits
    # The worker dies here; the next restore of partition 1 starts from its marker.
    assert restoring.changelog_offset == 20, "a partly restored store was marked as complete"
    assert active.changelog_offset == 10


def test_a_commit_survives_a_restore_opening_a_store_meanwhile(tmp_path: Path) -> None:
    stores = StoreManager(tmp_path, "g", group_index=False)

    def mark(p: int) -> int:
        # What a restore thread can do between two steps of the poll thread's loop.
        stores.open(7)
        return 0

    stores.marks = mark
    stores.open(0).put(b"reservation/R0", Row(1, False, "F1", b"v"), None)
    stores.apply(stores.prepare())
    assert sorted(stores.stores) == [0, 7]
