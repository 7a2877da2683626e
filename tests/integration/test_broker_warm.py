"""The benchmarks' broker warm-up (benchmarks/broker_warm.py) against the test broker: its
workload runs (produce, exactly-once and at-least-once relays, committed reads), it stops
within its bounds, and it leaves no topic behind."""

from __future__ import annotations

import os

import pytest
from confluent_kafka.admin import AdminClient
from kafka_fixtures import wait_until

from benchmarks.broker_warm import compiler_seconds, warm_broker

pytestmark = pytest.mark.integration


def _broker_pids() -> list[int]:
    """The local test broker's JVMs (found by their main class)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if b"kafka.Kafka" in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def test_warm_up_runs_its_workload_within_bounds_and_cleans_up(kafka_bootstrap: str) -> None:
    pids = _broker_pids()
    before = compiler_seconds(pids)
    ticks: list[float] = []
    result = warm_broker(kafka_bootstrap, pids, min_s=3.0, max_s=6.0, on_progress=ticks.append)
    assert 3.0 <= result["seconds"] <= 20.0
    assert ticks and ticks == sorted(ticks)
    # Every part of the workload moved records: the relays committed, the reader read.
    assert result["produced"] > 0 and result["read"] > 0
    assert result["relayed_eos"] > 0 and result["commits_eos"] > 0
    assert result["relayed_alo"] > 0 and result["commits_alo"] > 0
    assert result["observed"] > 0
    if before is not None:  # a local broker: its compiler threads were read, before and after
        assert result["compiler_cpu_s"] is not None and result["compiler_cpu_s"] >= before > 0
    # Deleted: the broker's metadata may list a deleted topic for a moment.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})

    def left() -> list[str]:
        return [t for t in admin.list_topics(timeout=10).topics if t.startswith("bench.warm.")]

    wait_until(lambda: not left(), timeout=10, message=lambda: f"warm-up topics left: {left()}")

