"""listeners.snapshots: a listener suspended while its include-current-state snapshot is
being announced (its output topic refused a notification: listeners.runtime.refused) ends
there. Its chunk stops, writes no progress, and the chunks of its other partitions are
skipped; other listeners' snapshots go on. (Before, the chunk wrote its progress back and
reopened the snapshot, and the next partition's chunk raised KeyError.)"""

from __future__ import annotations

from typing import Any

from listeners.model import ListenerSpec
from listeners.snapshots import Snapshots
from services.worker.state import Row


def _rows(partition: int, after: bytes | None) -> Any:
    for i in range(5):
        key = f"reservation/R{partition}-{i}".encode()
        if after is None or key > after:
            yield key, Row(1, False, "F1", b"v")


def test_a_listener_suspended_mid_chunk_ends_its_snapshot_and_the_others_go_on() -> None:
    snaps = Snapshots("registry", batch=1000)
    for name in ("bad", "good"):
        spec = ListenerSpec(name=name, filter="true", include_current_state=True)
        for p in (0, 1):
            snaps.begin(spec, p)
    produced: list[tuple[str, Any]] = []
    announced: list[tuple[str, int, bytes]] = []

    def produce(topic: str, value: Any, key: bytes, partition: int) -> None:
        produced.append((key.decode(), value))

    def announce(name: str, p: int, ekey: bytes, row: Row) -> bool:
        if name == "bad" and ekey.endswith(b"-2"):  # refused: the runtime suspends it
            snaps.end("bad", {0, 1}, forget=False, produce=produce)
            return False
        announced.append((name, p, ekey))
        return True

    snaps.chunks({0, 1}, _rows, lambda name: None, announce, produce)
    assert sorted({n for n, _p, _k in announced}) == ["bad", "good"]
    assert [k for n, p, k in announced if n == "bad"] == [b"reservation/R0-0", b"reservation/R0-1"]
    assert len([1 for n, _p, _k in announced if n == "good"]) == 10
    assert snaps.pending == []  # good: done on both partitions; bad: ended
    assert sorted(key for key, _v in produced) == ["good/snapshot/0", "good/snapshot/1"]
    snaps.rollback()  # an abort of that transaction does not bring bad's snapshot back
    assert snaps.pending == [("good", 0), ("good", 1)]
