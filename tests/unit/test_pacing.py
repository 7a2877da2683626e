"""services.worker.pacing.EarlySend: when a low-rate transaction sends its records early."""

from __future__ import annotations

from services.worker.pacing import EarlySend


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
