"""Suite ``listeners``: worker throughput with registered listeners vs without.

1, 100 and 10,000 equality listeners on *distinct* values (listener ``eq<i>`` filters
``value.flight_number == "F<i>"``) and 100 distinct general filters, each registered on the
run's registry topic before the worker starts. The events spread over 1,000 flights
``F0..F999``, so with 10,000 listeners every event matches exactly one listener (one
notification per event; ``F1000..F9999`` match nothing), with 100 listeners 10% of the events
match one, with 1 listener 0.1%. Runs only when the listener runtime (``listeners.runtime``)
exists; otherwise the result says it was skipped.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.events import events, produce_avro
from benchmarks.harness import COMMIT_INTERVAL, Bench, Metric
from benchmarks.registrations import equality_specs, general_specs, runtime_present
from benchmarks.systems import run_worker

__all__ = ["run"]

PARTITIONS = 6
SKIPPED = "skipped: listeners runtime not present"


def run(bench: Bench) -> None:
    """Throughput without listeners, then with each listener population."""
    started = time.monotonic()
    if not runtime_present():
        bench.write_result("listeners", [Metric("listeners", "listener throughput", None, "events/s",
                                                note=SKIPPED)],
                           started=started, settings={}, raw={"skipped": SKIPPED}, notes=[SKIPPED])
        return
    n = bench.size(100_000, 20_000)
    base = bench.topic_set("listeners", PARTITIONS)
    bench.step(f"listeners: pre-producing {n:,} events", n)
    produce_avro(base, events(n), on_progress=bench.advance)
    cases: dict[str, list[tuple[str, bytes]]] = {
        "none": [], "1 equality": equality_specs(1), "100 equality": equality_specs(100),
        "10000 equality": equality_specs(bench.size(10_000, 10_000)), "100 general": general_specs(100),
    }
    raw: dict[str, Any] = {}
    notes: list[str] = [
        "Equality listeners filter distinct flights (eq<i>: value.flight_number == \"F<i>\"); the "
        "events use 1,000 flights, so with 10,000 listeners every event matches exactly one "
        "listener (one notification per event), with 100 listeners 10% of the events match, "
        "with 1 listener 0.1%.",
        "100 general filters: value.amount > 900+i && value.seats != i%7 (not indexable: every "
        "filter is evaluated per change, on the old and on the new state; filters that differ "
        "only in literals share the reads of value.amount and value.seats).",
    ]
    for label, specs in cases.items():
        try:
            raw[label] = run_worker(bench, base, n, "exactly-once",
                                    label=f"listeners-{label.replace(' ', '-')}", listeners=specs or None)
        except RuntimeError as exc:
            raw[label] = {"error": str(exc)[-3000:]}
            notes.append(f"{label}: failed: {str(exc).splitlines()[0]}")
            if specs:
                notes.append("remaining listener cases not run (same runtime)")
                break
    rate: dict[str, float | None] = {k: None for k in cases}
    rate.update({k: float(v["throughput"]["events_per_s"]) for k, v in raw.items() if "throughput" in v})
    one = rate["1 equality"]

    def ratio_met(value: float | None, floor: float) -> bool | None:
        return None if value is None or not one else value / one >= floor

    metrics = [
        Metric("listeners", "1 equality listener", one, "events/s", "no listeners", rate["none"]),
        Metric("listeners", "100 equality listeners", rate["100 equality"], "events/s", "1 listener", one),
        Metric("listeners", "10,000 equality listeners", rate["10000 equality"], "events/s", "1 listener",
               one, ">= 0.5x", ratio_met(rate["10000 equality"], 0.5)),
        Metric("listeners", "100 general filters", rate["100 general"], "events/s", "1 listener", one,
               ">= 0.25x", ratio_met(rate["100 general"], 0.25)),
    ]
    bench.write_result("listeners", metrics, started=started, raw=raw, settings={
        "events": n, "partitions": PARTITIONS, "guarantee": "exactly-once",
        "commit_interval_s": COMMIT_INTERVAL, "cases": list(cases),
    }, notes=notes)
