"""services.worker.pacing: when a low-rate transaction sends its records early, and when the
worker is caught up with its input (then it commits without waiting for the interval)."""

from __future__ import annotations

from typing import Any

import pytest

from fifolane.errors import KafkaRetriableError
from services.worker.metrics import Stats, update_lag
from services.worker.pacing import EarlySend, caught_up


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_full_speed_never_sends_early() -> None:
    clock = Clock()
    early = EarlySend(every=0.002, clock=clock)
    assert not early.after_batch(10, 1000)  # no commit yet: not known to be a low rate
    early.committed(idle=False)  # commits from the interval: the input never went quiet
    for _ in range(5):
        clock.now += 1.0
        assert not early.after_batch(10, 1000)


def test_a_low_rate_sends_partial_batches_at_most_every_interval() -> None:
    clock = Clock()
    early = EarlySend(every=0.002, clock=clock)
    early.committed(idle=True)
    assert not early.after_batch(1000, 1000)  # a full batch: more is fetched, keep batching
    assert not early.after_batch(0, 1000)  # nothing taken, nothing to send
    assert early.after_batch(7, 1000)
    clock.now += 0.001
    assert not early.after_batch(7, 1000)  # within 2 ms of the last early send
    clock.now += 0.0015
    assert early.after_batch(3, 1000)
    early.committed(idle=False)  # load rose: the interval committed, back to batching
    clock.now += 1.0
    assert not early.after_batch(3, 1000)


class Ends:
    """A WorkerConsumer's cached end offsets and positions, per partition of ``in``."""

    def __init__(self, ends: dict[int, int], positions: dict[int, int]) -> None:
        self.ends, self.positions = ends, positions
        self.calls = 0

    def watermarks(self, tp: Any, timeout: float | None = None, cached: bool = False) -> tuple[int, int]:
        assert cached  # from the last fetch, never a round trip
        self.calls += 1
        if self.ends.get(tp.partition) == "error":
            raise KafkaRetriableError("no leader", code="LEADER_NOT_AVAILABLE", retriable=True)
        return 0, self.ends[tp.partition]

    def position(self, tp: Any) -> int:
        return self.positions[tp.partition]


def test_caught_up_compares_the_position_with_the_end_of_the_last_fetch() -> None:
    consumer = Ends({0: 100, 1: 50}, {0: 100, 1: 50})
    assert caught_up(consumer, "in", [0, 1])
    consumer.positions[1] = 49  # a transaction marker ends the partition: still caught up
    assert caught_up(consumer, "in", [0, 1])
    consumer.positions[1] = 40  # ten fetched records not handed out yet
    assert not caught_up(consumer, "in", [0, 1])
    assert caught_up(consumer, "in", [0, 1], allowed=9)  # no more than the transaction holds
    assert not caught_up(consumer, "in", [0, 1], allowed=8)


def test_caught_up_sums_the_partitions_and_stops_at_the_first_backlog() -> None:
    consumer = Ends({p: 1000 for p in range(6)}, {p: 995 for p in range(6)})  # 4 behind each
    assert caught_up(consumer, "in", range(6), allowed=24)
    assert not caught_up(consumer, "in", range(6), allowed=23)
    consumer.positions = {0: 0, **{p: 1000 for p in range(1, 6)}}  # a backlog on the first
    consumer.calls = 0
    assert not caught_up(consumer, "in", range(6), allowed=100)
    assert consumer.calls == 1


@pytest.mark.parametrize("end", [-1001, "error"])
def test_unknown_ends_count_as_behind(end: Any) -> None:
    """Before the first fetch the client knows no end offset (-1001); a client error: the
    worker keeps to its interval rather than commit on a guess."""
    assert not caught_up(Ends({0: end}, {0: 10}), "in", [0])
    assert caught_up(Ends({0: 10}, {0: 10}), "in", [])  # no partitions: nothing behind


def test_a_partition_that_handed_out_nothing_is_where_it_resumes() -> None:
    """The client has no position for a partition until it hands out a record of it (-1001):
    a quiet partition, or any partition just after a restart. Its committed offset is where
    it resumes; with nothing committed, the start of the log (the worker reads from the
    earliest). Without this, one quiet partition kept the check false for good."""
    low = Ends({0: 118, 1: 135}, {0: -1001, 1: 135})
    low.watermarks = lambda tp, timeout=None, cached=False: (100, low.ends[tp.partition])  # type: ignore[method-assign]
    assert caught_up(low, "in", [0, 1], starts={0: 118})  # committed at the end: quiet
    assert caught_up(low, "in", [0, 1], starts={0: 117})  # one left: the marker's slack
    assert not caught_up(low, "in", [0, 1], starts={0: 110})  # 8 fetched records wait
    assert not caught_up(low, "in", [0, 1], starts={0: None})  # from the log start (100)
    low.ends[0] = 100
    assert caught_up(low, "in", [0, 1], starts={0: None})  # an empty partition


def test_the_lag_metric_counts_a_quiet_partition_from_its_committed_offset() -> None:
    """The worker's lag metric reads the same way as the caught-up check: a partition that
    has handed out nothing since a restart is behind by what lies past its committed offset,
    not by its whole log."""
    consumer = Ends({0: 118, 1: 135}, {0: -1001, 1: 130})
    stats = Stats(worker_id="w")
    update_lag(stats, consumer, "in", [0, 1], {0: 118, 1: 100})
    assert stats.lag == {0: 0, 1: 5}
