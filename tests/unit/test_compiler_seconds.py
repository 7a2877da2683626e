"""benchmarks.broker_warm.compiler_seconds: the JIT compiler threads' CPU time from /proc."""

from __future__ import annotations

import os

from benchmarks.broker_warm import compiler_seconds


def test_no_jvm_has_no_compiler_threads() -> None:
    assert compiler_seconds([]) is None
    assert compiler_seconds([os.getpid()]) is None  # a Python process has none
    assert compiler_seconds([2**22 + 7]) is None  # no such process

