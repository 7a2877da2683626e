"""benchmarks/app_cpu.py, the in-process CPU-per-event diagnostic of the general path: it
drives a real worker and the flights app over the fake clients, and accounts for every event."""

from __future__ import annotations

from benchmarks.app_cpu import measure


def test_every_booking_event_is_processed_or_superseded() -> None:
    r = measure(2_000)
    assert r["events"] == r["consumed"] == 2_300  # 300 flights, then the reservations
    assert r["processed"] + r["superseded"] == r["events"] and r["dead_lettered"] == 0
    assert r["superseded"] > 0  # the stream has stale versions: the stale check ran
    assert r["state_writes"] >= r["processed"]
    # a flight's load, written once per reservation, leaves once per batch
    assert 0 < r["state_coalesced"] < r["state_writes"]
    assert r["produced"] >= r["state_writes"] - r["state_coalesced"]
    assert r["cpu_us_per_event"] > 0
