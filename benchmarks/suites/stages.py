"""Suite ``stages``: a three-stage pipeline (NEW -> CONFIRMED -> TICKETED, handlers of 0-5 ms
per stage) against the same work with the stages run one after another per group.

Few, hot groups (20 flights, 1 partition) at concurrency 100: with one lane per group, each
group runs one event at a time through both stages, so at most 20 handlers run at once; with
a lane per group and stage, a group's CONFIRMED stage works on one event while its NEW stage
takes the next, so up to 40 run at once and the ideal speed-up is 2x. Both runs end with
every reservation TICKETED (checked on the committed state topic). Warm start as in
``slow`` (:mod:`benchmarks.warm`).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from benchmarks.harness import COMMIT_INTERVAL, Bench, Metric
from benchmarks.plots import bar_plot
from benchmarks.procs import child_env, worker_cmd
from benchmarks.stages_app import stage_sleep
from benchmarks.warm import timed_burst
from fifolane.readers import read_to_end
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.testing.records import table_from

__all__ = ["run"]

GROUPS = 20
CONCURRENCY = 100
TARGET = 1.5  # the handler time alone allows 2x: the two stages overlap for most of the run


def _reservation(i: int) -> tuple[str, str, dict[str, Any]]:
    rid = f"R{i}"
    flight = f"F{i % GROUPS}"
    return flight, rid, {"reservation_id": rid, "flight_number": flight, "customer_id": f"c{i % 977}",
                         "seats": 1 + i % 4, "amount": float(50 + i % 900), "state": "NEW", "version": 1}


def run(bench: Bench) -> None:
    """The per-group serial run, then the staged one, each on its own topics."""
    started = time.monotonic()
    n = bench.size(3_000, 600)
    proto = bench.settings("stages", 1)
    codec = make_codec(proto, SchemaCatalog.load(proto.schemas_dir))
    items = [_reservation(i) for i in range(n)]
    values = [(g.encode(), codec.encode("reservation", rec)) for g, _k, rec in items]
    per_group: dict[str, float] = {}
    for g, k, _rec in items:
        per_group[g] = per_group.get(g, 0.0) + stage_sleep(k, 1, "NEW") + stage_sleep(k, 1, "CONFIRMED")
    sleep_total = sum(per_group.values())
    raw: dict[str, Any] = {"sleep_total_s": sleep_total, "busiest_group_sleep_s": max(per_group.values())}
    notes = ["Warm start: each worker joined its group on an empty topic before the events were "
             "produced; time = first produce -> commit covering the last event.",
             f"Stage sleeps are deterministic: {sleep_total:.2f} s in total, the busiest group "
             f"{max(per_group.values()):.2f} s (the serial run's floor)."]
    for name, app in (("serial", "benchmarks.stages_app:serial"), ("staged", "benchmarks.stages_app:staged")):
        s = bench.topic_set(f"stages-{name}", 1)
        wid = f"bench-stages-{name}-{uuid.uuid4().hex[:6]}"
        group = f"bench-{wid}"
        cmd = worker_cmd(s, wid, group, guarantee="exactly-once", concurrency=CONCURRENCY,
                         commit_interval=COMMIT_INTERVAL, app=app)
        raw[name] = timed_burst(bench, s, cmd, group, values, child_env(s),
                                f"{name} ({'lane per group' if name == 'serial' else 'lane per group and stage'})",
                                "stages")
        table = table_from(read_to_end(s, s.state_topic), codec)
        ticketed = sum(1 for e in table.values() if e.value is not None and e.value.get("state") == "TICKETED")
        raw[name]["ticketed"] = ticketed
        if ticketed != n:
            notes.append(f"{name}: only {ticketed} of {n} reservations TICKETED on the state topic")
    serial, staged = raw["serial"]["seconds"], raw["staged"]["seconds"]
    ok = raw["serial"]["ticketed"] == n and raw["staged"]["ticketed"] == n
    metrics = [Metric("stages", "three-stage pipeline speed-up", serial / staged, "x per-group serial",
                      "stages one after another per group", 1.0, f">= {TARGET}x (ideal 2x)",
                      ok and serial / staged >= TARGET,
                      note=f"{staged:.2f} s vs {serial:.2f} s; {n:,} events, {GROUPS} groups")]
    bar_plot(bench.results_dir / "stages.png", "Three-stage pipeline, 0-5 ms per stage, 20 groups",
             {"stages one after another": serial, "lane per stage": staged}, "seconds for all events")
    bench.write_result("stages", metrics, started=started, raw=raw, settings={
        "events": n, "groups": GROUPS, "partitions": 1, "stage_sleep_ms": "0-5 (per entity and stage)",
        "guarantee": "exactly-once", "commit_interval_s": COMMIT_INTERVAL, "concurrency": CONCURRENCY,
    }, notes=notes)
