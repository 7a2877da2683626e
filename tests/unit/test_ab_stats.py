"""The head-to-head comparison's paired statistics (benchmarks/ab.py)."""

from __future__ import annotations

import math

import pytest

from benchmarks.ab import paired


def test_paired_is_the_geometric_mean_of_round_ratios_with_a_t_interval() -> None:
    g, lo, hi = paired([100.0, 200.0, 100.0], [50.0, 200.0, 200.0])
    assert g == pytest.approx(1.0)  # ratios 0.5, 1, 2: their logs cancel
    logs = [math.log(0.5), 0.0, math.log(2.0)]
    half = 4.30 * math.sqrt(sum(x * x for x in logs) / 2) / math.sqrt(3)  # t(0.975, df 2)
    assert (lo, hi) == pytest.approx((math.exp(-half), math.exp(half)))


def test_pairing_removes_drift_that_spreads_each_side() -> None:
    # The machine slows down round by round; after is 10% slower within every round.
    before = [100.0, 80.0, 60.0, 40.0]
    g, lo, hi = paired(before, [b * 0.9 for b in before])
    assert (g, lo, hi) == pytest.approx((0.9, 0.9, 0.9))


def test_one_round_has_no_interval_and_unpaired_lists_are_refused() -> None:
    g, lo, hi = paired([100.0], [95.0])
    assert g == pytest.approx(0.95) and math.isnan(lo) and math.isnan(hi)
    with pytest.raises(ValueError):
        paired([1.0, 2.0], [1.0])
