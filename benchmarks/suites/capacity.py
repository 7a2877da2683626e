"""Suite ``capacity``: the measured costs of the capacity model (:mod:`fifolane.capacity`).

Writes ``capacity.json`` with a top-level ``costs`` table, the data ``fifolane plan`` and
``docs/capacity.md`` use. Everything is CPU time (user + system, all threads, from /proc)
of the process concerned over the timed part of a run (first commit to the commit covering
the last event), so the other load on this shared machine disturbs it much less than wall
time; the load average is noted with every run.

- **worker** (one exactly-once worker, 6 partitions, concurrency 16) over the same
  pre-produced events (1,000 flights, entities n/2), in interleaved rounds (median):
  the table handler with no listener; with 1 and 1,000 indexed equality listeners (0.1% and
  100% of the events notify one); 100 CEL filters; 100 prefix (``startsWith``) filters that
  match nothing; the same 100 CEL filters with a converter; and the flights app
  (``examples.flights:app``) over the demo's booking stream. Per-kind costs are differences
  to the table run, per listener or per notification (notifications counted on the topic);
- **brokers**: CPU of the local broker processes in the same intervals, and the bytes per
  record of the input, state, notifications and directory topics of the 1,000-listener run
  (log segments on disk) and of the DLQ of a run with 2% undecodable events;
- **restore**: one worker restoring E entities from a state topic (its own log's times);
- **Spark**: ``benchmarks/spark_views.py`` with ``--master local[1]`` (one executor core):
  state-topic rows per second of the warm views build.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import psutil

from benchmarks.booking import APP, avro_items, stream
from benchmarks.cpu_runs import run_workers
from benchmarks.events import events, produce_avro, produce_raw, produce_state
from benchmarks.harness import Bench, Metric
from benchmarks.meters import (
    Brokers,
    cpu_seconds,
    find_brokers,
    loadavg,
    read_records,
    restore_span,
    restored_from_log,
)
from benchmarks.procs import child_env, log_tail, running, worker_cmd
from benchmarks.registrations import converter_specs, equality_specs, general_specs, prefix_specs
from fifolane.config import PROJECT_ROOT, Settings
from fifolane.serde import SchemaCatalog, make_codec

__all__ = ["CASES", "derive_costs", "run"]

PARTITIONS = 6
#: Listeners per filter kind (the equality case: one per flight, every event notifies one).
FILTERS, EQUALITY = 100, 1000
#: case -> (registrations, app)
CASES: dict[str, tuple[Callable[[], list[tuple[str, bytes]]], str | None]] = {
    "table": (lambda: [], None),
    "1 equality": (lambda: equality_specs(1), None),
    f"{EQUALITY} equality": (lambda: equality_specs(EQUALITY), None),
    f"{FILTERS} CEL filters": (lambda: general_specs(FILTERS), None),
    f"{FILTERS} prefix filters": (lambda: prefix_specs(FILTERS), None),
    f"{FILTERS} CEL filters + converter": (lambda: converter_specs(FILTERS), None),
    "app": (lambda: [], APP),
}
DLQ_EVERY = 50  # every 50th event of the dead-letter run is undecodable


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median worker CPU per event, with every run's value beside it."""
    ordered = sorted(runs, key=lambda r: r["worker_us_per_event"])
    mid = dict(ordered[len(ordered) // 2])
    mid["reps_worker_us"] = [round(r["worker_us_per_event"], 2) for r in runs]
    return mid


def derive_costs(cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per-kind costs from the median runs: differences to the table run (clamped at 0)."""
    def us(label: str) -> float:
        return float(cases[label]["worker_us_per_event"])

    def npe(label: str) -> float:
        return float(cases[label]["notifications"]) / float(cases[label]["total"])

    table = us("table")
    eq1, eqn = "1 equality", f"{EQUALITY} equality"
    flt, pre, conv = f"{FILTERS} CEL filters", f"{FILTERS} prefix filters", f"{FILTERS} CEL filters + converter"
    notif = max(0.0, (us(eqn) - us(eq1)) / max(npe(eqn) - npe(eq1), 1e-9))
    return {
        "worker_us": {"table": table, "app": us("app")},
        "listener_us": {
            "equality_fixed": max(0.0, us(eq1) - table - npe(eq1) * notif),
            "filter_per_listener": max(0.0, (us(flt) - table - npe(flt) * notif) / FILTERS),
            "prefix_per_listener": max(0.0, (us(pre) - table - npe(pre) * notif) / FILTERS),
        },
        "notification_us": notif,
        "converter_us": max(0.0, (us(conv) - us(flt)) / max(npe(conv), 1e-9)),
        "broker_us": cases["table"].get("broker_us_per_event"),
    }


def _bytes(bench: Bench, brokers: Brokers | None, run: dict[str, Any], input_topic: str) -> dict[str, Any]:
    """Records and bytes of the run's topics (the input read as written: read_uncommitted)."""
    boot = bench.bootstrap
    return {"input": read_records(boot, input_topic, brokers, committed=False).to_dict(),
            "state": read_records(boot, run["state_topic"], brokers).to_dict(),
            "notification": read_records(boot, run["notifications_topic"], brokers).to_dict(),
            "directory_claim": read_records(boot, run["directory_topic"], brokers).to_dict()}


def _dead_letters(bench: Bench, brokers: Brokers | None, m: int) -> dict[str, Any]:
    """A run with every DLQ_EVERY-th event truncated (undecodable): bytes per dead letter."""
    base = bench.topic_set("capacity-dlq", PARTITIONS)
    codec = make_codec(base, SchemaCatalog.load(base.schemas_dir))
    items = [(g.encode(), codec.encode("reservation", rec)[: 12 if i % DLQ_EVERY == 0 else None], None)
             for i, (g, _k, _v, rec) in enumerate(events(m))]
    bench.step(f"capacity: pre-producing {m:,} events, every {DLQ_EVERY}th undecodable", m)
    produce_raw(base, base.input_topic, iter(items), on_progress=bench.advance)
    run = run_workers(bench, base, m, label="capacity-dlq", brokers=brokers, timed=False)
    dlq = read_records(bench.bootstrap, run.settings.dlq_topic, brokers)
    return {**dlq.to_dict(), "expected": len(range(0, m, DLQ_EVERY)), "loadavg": run.loadavg}


def _restore(bench: Bench, brokers: Brokers | None, e: int) -> dict[str, Any]:
    """One worker restoring ``e`` entities: entities/s (its log) and worker CPU per entity."""
    settings = bench.topic_set("capacity-restore", PARTITIONS)
    bench.step(f"capacity: writing {e:,} entities to a state topic", e)
    produce_state(settings, events(e, entities=e), PARTITIONS, on_progress=bench.advance)
    wid = f"bench-restore-{uuid.uuid4().hex[:6]}"
    log = settings.home / f"{wid}.log"
    bench.step("capacity: worker restoring", e)
    with running(worker_cmd(settings, wid, f"bench-{wid}", guarantee="exactly-once"), log,
                 env=child_env(settings)) as proc:
        deadline = time.monotonic() + 120 + e / 2000
        while len(restored_from_log(log)) < PARTITIONS:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"restore of {e:,} entities not done; log {log}:\n{log_tail(log)}")
            time.sleep(0.1)  # polling the worker's log under a deadline
        cpu = cpu_seconds([proc.pid])
    parts = restored_from_log(log)
    records, seconds = sum(c for c, _ in parts.values()), restore_span(log) or 0.0
    return {"entities": records, "seconds": seconds, "entities_per_s": records / seconds if seconds else None,
            "worker_cpu_s_total": cpu, "loadavg": loadavg(), "by_partition": parts,
            "note": "worker CPU includes its start-up (Python imports, Kafka clients)"}


def _spark(bench: Bench, entities: int) -> dict[str, Any]:
    """``benchmarks/spark_views.py --master local[1]`` on our Kafka: rows/s of the warm build."""
    out = bench.results_dir / "raw" / "capacity_spark.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.spark_views", "--entities", str(entities), "--runs", "2",
           "--master", "local[1]", "--bootstrap", bench.bootstrap, "--result", str(out)]
    bench.step(f"capacity: Spark views build, local[1], {entities:,} entities")
    proc = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=1800, check=False)
    try:
        raw: dict[str, Any] = json.loads(out.read_text())
    except (OSError, ValueError):
        return {"error": f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}"}
    rows = raw["written"]["records"]
    raw["rows_per_core_s"] = rows / raw["spark_build_warm_s"]
    raw["loadavg"] = loadavg()
    return raw


def run(bench: Bench) -> None:
    """Worker rounds over every case, bytes, dead letters, restore, Spark; then the costs."""
    started = time.monotonic()
    n = bench.size(100_000, 120_000)  # quick: a fast table worker drained 20,000, then 60,000, within its first commit
    reps = bench.size(3, 1)
    brokers = find_brokers(bench.bootstrap)
    base = bench.topic_set("capacity", PARTITIONS)
    bench.step(f"capacity: pre-producing {n:,} events", n)
    produce_avro(base, events(n), on_progress=bench.advance)
    booking = stream(n)
    app_base = bench.topic_set("capacity-app", PARTITIONS)
    bench.step(f"capacity: pre-producing {len(booking):,} booking events", len(booking))
    produce_raw(app_base, app_base.input_topic, avro_items(app_base, booking), on_progress=bench.advance)
    specs = {label: make() for label, (make, _app) in CASES.items()}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in CASES}
    last: dict[str, Any] = {}
    for _r in range(reps):
        for label, (_make, app) in CASES.items():
            src: Settings = app_base if app else base
            total = len(booking) if app else n
            one = run_workers(bench, src, total, label=f"capacity-{label.replace(' ', '-').replace('+', 'c')}",
                              brokers=brokers, listeners=specs[label] or None, app=app)
            result = {**one.to_dict(), "total": total, "listeners": len(specs[label])}
            result["notifications"] = (read_records(bench.bootstrap, one.settings.listener_output_topic,
                                                    None).records if specs[label] else 0)
            runs[label].append(result)
            last[label] = result
    cases = {label: _median(v) for label, v in runs.items()}
    raw: dict[str, Any] = {"cases": cases, "brokers": None if brokers is None else
                           {"pids": brokers.pids, "data_dirs": [str(d) for d in brokers.data_dirs]}}
    bench.step("capacity: sizing the topics")
    raw["bytes"] = _bytes(bench, brokers, last[f"{EQUALITY} equality"], base.input_topic)
    raw["bytes"]["dead_letter"] = _dead_letters(bench, brokers, bench.size(10_000, 5_000))
    raw["restore"] = _restore(bench, brokers, bench.size(300_000, 50_000))
    raw["spark"] = _spark(bench, bench.size(100_000, 20_000))
    costs = derive_costs(cases)
    costs["bytes"] = {k: _per_record(v) for k, v in raw["bytes"].items()}
    costs["restore_entities_per_s"] = raw["restore"]["entities_per_s"]
    costs["spark_rows_per_core_s"] = raw["spark"].get("rows_per_core_s")
    costs["measured"] = {"machine": bench.machine, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         "quick": bench.quick, "events": n, "rounds": reps,
                         "loadavg": {label: c["loadavg"] for label, c in cases.items()},
                         "kafka": bench.kafka, "bytes_from": "disk" if brokers else "records"}
    notes = [
        "CPU = user + system seconds of the process (all threads) from the first commit to the "
        "commit covering the last event; median of the interleaved rounds, every round in "
        "raw/cases/*/reps_worker_us; load averages in raw/cases/*/loadavg.",
        f"Listener costs are differences to the table run: equality (fixed per event) from 1 "
        f"listener; per notification from {EQUALITY} equality listeners (one notification per event) "
        f"minus 1; per CEL / prefix filter from {FILTERS} filters; converter per notification from "
        "the converter run minus the same filters without.",
        "Bytes per record: the topic's log segments on the broker (batches, headers and "
        "transaction markers included) over the records read back.",
        "Restore: one worker's own restore (its log), from the first partition's start to the last "
        "one's end (partitions restore at the same time).",
        "Spark: benchmarks/spark_views.py --master local[1] (one executor core), rows = state "
        "records written, time = the warm (second) build.",
    ]
    if brokers is None:
        notes.append("the brokers are not processes of this machine: no broker CPU, bytes from records")
    path = bench.write_result("capacity", _metrics(costs, cases, raw), started=started, raw=raw, notes=notes,
                              settings={"events": n, "partitions": PARTITIONS, "rounds": reps,
                                        "guarantee": "exactly-once", "concurrency": 16,
                                        "cases": list(CASES), "cpus": psutil.cpu_count()})
    data = json.loads(path.read_text())
    data["costs"] = costs
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")


def _per_record(sizes: dict[str, Any]) -> float | None:
    records = sizes.get("records") or 0
    if not records:
        return None
    disk = sizes.get("disk_bytes")
    return float((disk if disk is not None else sizes["record_bytes"]) / records)


def _metrics(costs: dict[str, Any], cases: dict[str, Any], raw: dict[str, Any]) -> list[Metric]:
    def per_core(us: float | None) -> float | None:
        return None if not us else 1e6 / us

    def load(label: str) -> str:
        return f"load {cases[label]['loadavg'][0]:.1f}"

    w, lis = costs["worker_us"], costs["listener_us"]
    m = [
        Metric("capacity", "table handler, events/s per worker core", per_core(w["table"]), "events/s",
               note=f"{w['table']:.1f} us/event; {load('table')}"),
        Metric("capacity", "flights app, events/s per worker core", per_core(w["app"]), "events/s",
               note=f"{w['app']:.1f} us/event; {load('app')}"),
        Metric("capacity", "indexed equality listeners, fixed", lis["equality_fixed"], "us/event",
               note=load("1 equality")),
        Metric("capacity", "CEL filter, per listener", lis["filter_per_listener"], "us/event",
               note=load(f"{FILTERS} CEL filters")),
        Metric("capacity", "prefix filter, per listener", lis["prefix_per_listener"], "us/event",
               note=load(f"{FILTERS} prefix filters")),
        Metric("capacity", "notification", costs["notification_us"], "us/notification",
               note=load(f"{EQUALITY} equality")),
        Metric("capacity", "converter", costs["converter_us"], "us/notification",
               note=load(f"{FILTERS} CEL filters + converter")),
        Metric("capacity", "broker CPU (1 broker)", costs["broker_us"], "us/event", note=load("table")),
        Metric("capacity", "restore, one worker", costs["restore_entities_per_s"], "entities/s",
               note=f"load {raw['restore']['loadavg'][0]:.1f}"),
        Metric("capacity", "Spark views build, per executor core", costs["spark_rows_per_core_s"], "rows/s",
               note=raw["spark"].get("error", f"load {raw['spark'].get('loadavg', [0])[0]:.1f}")[:200]),
    ]
    for kind, value in costs["bytes"].items():
        m.append(Metric("capacity", f"broker bytes per {kind.replace('_', ' ')} record", value, "bytes"))
    return m

