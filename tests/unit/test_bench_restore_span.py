"""The restore suite's time: the span of the worker's per-partition restores, which overlap."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.meters import restore_span, restored_from_log


def test_overlapping_restores_take_their_span_not_their_sum(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text(
        "2026-11-24 02:16:24,884 INFO services.worker.runtime: worker w joined group g\n"
        "2026-11-24 02:16:26,670 INFO services.worker.restore: restored st[2]: 152051 records in 1.69s\n"
        "2026-11-24 02:16:26,751 INFO services.worker.restore: restoring st[1]: 10/20 records\n"
        "2026-11-24 02:16:26,955 INFO services.worker.restore: restored st[4]: 173435 records in 1.93s\n"
        "2026-11-24 02:16:28,000 INFO services.worker.restore: restored st[0]: 10 records in 0.50s\n"
    )
    assert restored_from_log(log) == {2: (152051, 1.69), 4: (173435, 1.93), 0: (10, 0.5)}
    # the first start is [2]: 26.670 - 1.69 = 24.980; the last end [0]: 28.000
    assert restore_span(log) == pytest.approx(3.02, abs=1e-3)


def test_no_restore_lines_no_span(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("2026-11-24 02:16:24,884 INFO services.worker.runtime: worker w joined group g\n")
    assert restore_span(log) is None
    assert restore_span(tmp_path / "missing.log") is None
