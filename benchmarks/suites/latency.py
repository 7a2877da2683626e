"""Suite ``latency``: produce -> visible to a read_committed consumer, under paced load.

For each system (fifolane, Quix Streams, Kafka Streams; exactly-once and at-least-once):
a fresh input of N pre-produced events is drained first, which measures the system's
maximum rate in this run; then, in the same process, new entities are sent at 10% and at
50% of that rate, and a read_committed consumer notes when each is visible on every
output: fifolane's state topic and its listener notifications (one listener registered,
matching the timed events), Quix Streams' and Kafka Streams' output topics. The fifolane
worker runs with that listener for the whole run (its maximum rate includes the listener).

The probe warms its producer and the system's path first (:mod:`benchmarks.latency`), starts
the paced load, and after a lead-in of :data:`LEAD_IN_S` (its events are timed on their own:
the onset) times every ``k``-th event (k chosen for about 4,000 timed events per load; every
``k``-th of the lead-in too). Only the timed events match the listener: the others are new
entities like the drained ones, which match none, so the load is the fraction of the
maximum rate it says it is (with every event notifying, fifolane's "50% load" was twice what
its worker could take: benchmarks/README.md, "Fillers between the timed events"). The CDFs
go to ``latency.png`` (one panel per system).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from benchmarks import latency
from benchmarks.events import events, produce_avro, produce_json
from benchmarks.harness import Bench, Metric
from benchmarks.quix import quix_python
from benchmarks.systems import (
    GUARANTEES,
    PROBE_CUSTOMER,
    SHORT,
    After,
    Outputs,
    kstreams_build,
    probe_records,
    run_kstreams,
    run_quix,
    run_worker,
)
from fifolane.config import Settings
from fifolane.topics import create_topic

__all__ = ["LOADS", "LISTENER_FILTER", "run"]

PARTITIONS = 6
#: Offered load as a fraction of the system's maximum rate measured in the same run.
LOADS = (0.1, 0.5)
#: The one listener registered on fifolane: the timed probe events and nothing else. An indexed
#: equality: a CEL filter's evaluations are timed against a 50 ms wall-clock budget, and on
#: this shared 2-core machine a descheduled evaluation got the listener suspended.
LISTENER_FILTER = f'value.customer_id == "{PROBE_CUSTOMER}"'
#: Probe events are pre-encoded; above this many per load the duration is shortened.
MAX_PROBE_EVENTS = 300_000
TIMED_PER_LOAD = 4000
#: Seconds of paced load before the steady-state clock starts (benchmarks/latency.py: the
#: onset is timed and reported on its own).
LEAD_IN_S = 1.0
#: Probe events sent and awaited on every output before the paced load (not timed).
WARM = 20
#: Targets of issue #16 at 10% load (ms): (guarantee, percentile) -> limit.
TARGETS = {("EOS", "p50"): 40.0, ("EOS", "p99"): 150.0, ("ALO", "p99"): 60.0}
SYSTEM_LABEL = {"fifolane": "fifolane", "quix": "Quix Streams", "kstreams": "Kafka Streams"}


def load_label(load: float) -> str:
    return f"{load * 100:.0f}%"


def probes(lead_in: int, every: int) -> Callable[[int], bool]:
    """Which of the probe's records (warm-up first) match the listener: the warm-up and the
    timed ones (:func:`benchmarks.latency.timed`). The rest are fillers like the drained
    events, so the paced load has the mix the maximum rate was measured on."""
    def probe(i: int) -> bool:
        return i < WARM or latency.timed(i - WARM, lead_in=lead_in, sample_every=every)
    return probe


def _load_probe(settings: Settings, fmt: str, duration: float, tag: str) -> After:
    """After the drain: probe at each of :data:`LOADS` times the drain's rate."""
    def after(result: dict[str, Any], outputs: Outputs, input_topic: str) -> dict[str, Any]:
        max_rate = float(result["throughput"]["events_per_s"])
        if not math.isfinite(max_rate) or max_rate <= 0:
            raise RuntimeError(f"{tag}: no maximum rate measured (the drain fit in one commit)")
        loads: dict[str, Any] = {}
        for load in LOADS:
            rate = max(20.0, load * max_rate)
            count = int(min(rate * duration, MAX_PROBE_EVENTS))
            lead = int(rate * LEAD_IN_S)
            every = max(1, count // TIMED_PER_LOAD)
            recs = probe_records(settings, f"{tag}-{load * 100:.0f}", WARM + lead + count, fmt,
                                 probes(lead, every))
            loads[load_label(load)] = latency.measure_outputs(
                settings.resolved_bootstrap(), input_topic, outputs, recs, rate=rate, warm=WARM,
                lead_in=lead, sample_every=every)
            time.sleep(1.0)  # let the system go idle between the loads
        return {"max_rate": max_rate, "loads": loads}
    return after


def run(bench: Bench) -> None:
    """Each system in turn: fresh input, drain (max rate), probes at 10% and 50% of it."""
    from listeners.model import ListenerSpec

    started = time.monotonic()
    # Quick: 100,000, not fewer: an at-least-once worker commits on the interval, and a
    # 40,000-event drain could end within its first commit (no maximum rate: failed in CI).
    n = bench.size(150_000, 100_000)
    duration = float(bench.size(10, 3))
    env = quix_python()
    ks_build, ks_error = (None, "not in a quick run") if bench.quick else kstreams_build(bench)
    notes = [f"Each system drained {n:,} fresh pre-produced events (its maximum rate in this run), "
             f"then got new entities at {', '.join(load_label(x) for x in LOADS)} of that rate for "
             f"about {duration:.0f} s each (at most {MAX_PROBE_EVENTS:,} events), every k-th event "
             f"timed (about {TIMED_PER_LOAD:,} per load). Only the timed events match fifolane's "
             "listener; the others are fillers like the drained events (which match none), so "
             "the load has the mix the maximum rate was measured on.",
             "Latency = producer timestamp -> visible to a read_committed consumer (same process, "
             "one clock). The probe's producer and the system's path are warmed with 20 events "
             "first (a new idempotent producer waits ~500 ms for its producer id: that was the "
             "old 492 ms p99 floor).",
             f"The percentiles are of the steady state: the clock starts after {LEAD_IN_S:g} s of the "
             "paced load. A system idle until then sometimes took a few hundred ms to settle in its "
             "first second, which set the p99 of some runs and not of others; the events of that "
             "lead-in are timed too and reported as the onset (p99 and max).",
             f"fifolane runs with one listener ({LISTENER_FILTER}): the timed events' notifications "
             "are timed too, and its maximum rate includes the listener. Quix Streams and Kafka Streams have one output.",
             "The load generator and reader share the 2 cores with the system and the broker: at "
             "50% load they take a noticeable part of the CPU."]
    if env.python is None and not bench.quick:
        notes.append(f"Quix Streams not measured: {env.error}")
    if ks_build is None and not bench.quick:
        notes.append(f"Kafka Streams not measured: {ks_error}")
    spec = [("latency", ListenerSpec(name="latency", type="reservation", filter=LISTENER_FILTER).to_json())]
    raw: dict[str, Any] = {}
    # Quick (a smoke run): fifolane only, where the targets are.
    systems = ["fifolane"] if bench.quick else list(SYSTEM_LABEL)
    if bench.quick:
        notes.append("Quick run: fifolane only.")
    for system in systems:
        for g in reversed(GUARANTEES):  # exactly-once first: the headline
            key = f"{system}_{SHORT[g]}"
            if (system == "quix" and env.python is None) or (system == "kstreams" and ks_build is None):
                continue
            base = bench.topic_set(f"latency-{key}", PARTITIONS)
            fmt = "json" if system == "quix" else "avro"
            bench.step(f"latency: pre-producing {n:,} events for {key}", n)
            if fmt == "json":
                produce_json(base, events(n), base.input_topic, on_progress=bench.advance)
            else:
                produce_avro(base, events(n), on_progress=bench.advance)
            after = _load_probe(base, fmt, duration, f"lat-{key}")
            try:
                if system == "fifolane":
                    raw[key] = run_worker(bench, base, n, g, label=f"latency-{key}", listeners=spec, after=after)
                elif system == "quix":
                    raw[key] = run_quix(bench, str(env.python), base, base.input_topic, n, g,
                                        label=f"latency-{key}", after=after)
                else:
                    assert ks_build is not None
                    warm_out = f"{base.input_topic}.ks-warmup"
                    create_topic(base, warm_out, PARTITIONS)
                    raw[key] = run_kstreams(bench, ks_build, base, n, g, "changelog",
                                            warmup=(warm_out, min(n, 50_000)), label=f"latency-{key}",
                                            after=after)
            except RuntimeError as exc:
                raw[key] = {"error": str(exc)[-3000:]}
                notes.append(f"{key}: failed: {str(exc).splitlines()[0]}")
    bench.write_result("latency", _metrics(raw), started=started, raw=raw, notes=notes, settings={
        "events": n, "partitions": PARTITIONS, "loads": list(LOADS), "seconds_per_load": duration,
        "timed_per_load": TIMED_PER_LOAD, "listener_filter": LISTENER_FILTER,
        "kstreams_variant": "changelog",
    })


def _metrics(raw: dict[str, Any]) -> list[Metric]:
    m: list[Metric] = []
    for key, data in raw.items():
        if "loads" not in data:
            continue
        system, short = key.rsplit("_", 1)
        ks = raw.get(f"kstreams_{short}", {}).get("loads", {})
        for load, outs in data["loads"].items():
            for out, lat in outs.items():
                for p in ("p50", "p99"):
                    target = TARGETS.get((short, p)) if system == "fifolane" and load == "10%" else None
                    ks_lat = ks.get(load, {}).get("output") if system == "fifolane" else None
                    m.append(Metric(
                        "latency", f"{SYSTEM_LABEL[system]} {short} {out} {p} at {load} load", lat[p], "ms",
                        f"Kafka Streams {short} {p}" if ks_lat else "", ks_lat[p] if ks_lat else None,
                        f"<= {target:.0f} ms" if target else "",
                        None if target is None else bool(lat[p] <= target),
                        note=f"{lat['rate']:,.0f} events/s of max {data['max_rate']:,.0f}; "
                             f"{lat['seen']}/{lat['sent']} seen"))
                onset = lat.get("onset")
                if onset and onset.get("sent"):
                    m.append(Metric("latency", f"{SYSTEM_LABEL[system]} {short} {out} onset p99 at {load} load",
                                    onset["p99"], "ms",
                                    note=f"the first {LEAD_IN_S:g} s of the load: max {onset['max']:,.0f} ms; "
                                         f"{onset['seen']}/{onset['sent']} seen"))
    return m
