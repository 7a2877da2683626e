"""The systems under test, one run each: start, drain pre-produced input, then ``after``.

Every runner starts its system as a subprocess over ``total`` pre-produced events, times
the drain by the system's committed offsets (:func:`benchmarks.procs.watch_committed`),
and, while the system still runs, calls ``after(result, outputs, input_topic)`` (a latency
probe, say) whose keys are added to the result. ``outputs`` names the system's output
topics and how to find a probe event in each (see :mod:`benchmarks.latency`).

- :func:`run_worker`: the fifolane worker (table handler or an ``--app``), its state topic
  and, with listeners, its notifications topic;
- :func:`run_quix`: a Quix Streams app from ``benchmarks/.venv-quix`` (JSON in and out);
- :func:`run_kstreams`: the Kafka Streams app (``benchmarks/kstreams``), JVM warmed first;
- :func:`measure_ceiling`: the plain consume -> produce loop (``benchmarks/passthrough.py``),
  over a suite's input repeated :data:`CEILING_REPEAT` times (:func:`repeated_input`).

:func:`median_run` picks the median of a suite's interleaved rounds. The suites share these
helpers through this module and never import one another (an import-linter contract).
"""

from __future__ import annotations

import json
import math
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import latency
from benchmarks.events import events, produce_raw
from benchmarks.harness import COMMIT_INTERVAL, Bench
from benchmarks.kafka_streams import KafkaStreamsError, app_cmd, ensure_app
from benchmarks.procs import (
    Commits,
    child_env,
    log_tail,
    pinned_args,
    running,
    watch_committed,
    worker_cmd,
)
from benchmarks.registrations import register
from fifolane.config import Settings
from fifolane.readers import read_to_end
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.topics import create_topic

__all__ = ["CEILING_REPEAT", "GUARANTEES", "PROBE_CUSTOMER", "SHORT", "After", "Outputs", "fixed_probe",
           "key_ident", "kstreams_build", "measure_ceiling", "median_run", "probe_records", "quix_ident",
           "repeated_input", "run_kstreams", "run_quix", "run_worker"]

#: The plain loop drains a suite's input repeated this many times. It runs about four times
#: as fast as the fastest system, so over the suite's input alone its timed window (first
#: commit to the commit covering the last event) was one or two commit intervals, and its
#: rate moved with where those commits fell: 422,004-939,371 events/s across one suite's
#: rounds (benchmarks/README.md, "The plain loop's window").
CEILING_REPEAT = 5

GUARANTEES = ("at-least-once", "exactly-once")
SHORT = {"at-least-once": "ALO", "exactly-once": "EOS"}
#: Output name -> (topic, ident).
Outputs = dict[str, tuple[str, latency.Ident]]
#: (result so far, outputs, input topic) -> more result entries; runs while the system runs.
After = Callable[[dict[str, Any], Outputs, str], dict[str, Any]]


#: The customer of every probe event: a listener can select them with one indexed equality.
PROBE_CUSTOMER = "probe"


def probe_records(settings: Settings, tag: str, n: int, fmt: str,
                  probe: Callable[[int], bool] | None = None) -> list[latency.Record]:
    """``n`` new reservations (version 1) as probe events: Avro (fifolane, Kafka Streams) or
    JSON (Quix Streams). The customer is :data:`PROBE_CUSTOMER` for those whose index
    ``probe`` accepts (all without it); the others keep the generator's customers, like the
    drained events, which no probe listener selects."""
    codec = make_codec(settings, SchemaCatalog.load(settings.schemas_dir))
    out = []
    for i, (group, rid, _v, rec) in enumerate(events(n, entities=n, prefix=f"L{tag}-")):
        if probe is None or probe(i):
            rec["customer_id"] = PROBE_CUSTOMER
        value = codec.encode("reservation", rec) if fmt == "avro" else json.dumps(rec).encode()
        out.append((rid, group.encode(), value))
    return out


def key_ident(msg: Any) -> str | None:
    """The reservation id of a ``reservation/<id>`` keyed record (state topic, notification,
    Kafka Streams output, Quix flights output)."""
    key = msg.key() or b""
    return key.decode().split("/", 1)[1] if key.startswith(b"reservation/") else None


def quix_ident(msg: Any) -> str | None:
    """The reservation id in a Quix stateful-app output value (``{"rid": ...}``)."""
    try:
        return str(json.loads(msg.value())["rid"])
    except (TypeError, ValueError, KeyError):
        return None


def fixed_probe(settings: Settings, fmt: str, count: int, rate: float, *, tag: str) -> After:
    """The stateful suite's probe: ``count`` events at ``rate``/s on the first output."""
    def after(_result: dict[str, Any], outputs: Outputs, input_topic: str) -> dict[str, Any]:
        topic, ident = next(iter(outputs.values()))
        recs = probe_records(settings, tag, count, fmt)
        return {"latency_ms": latency.measure_latency(settings.resolved_bootstrap(), input_topic, topic,
                                                      settings.partitions, recs, ident, rate=rate)}
    return after


def run_worker(bench: Bench, base: Settings, total: int, guarantee: str, *, label: str,
               listeners: list[tuple[str, bytes]] | None = None, concurrency: int = 16,
               app: str | None = None, after: After | None = None,
               python: list[str] | None = None, extra: list[str] | None = None) -> dict[str, Any]:
    """One fifolane worker over ``base``'s input (``python``: e.g. a profiler's command;
    ``extra``: more worker arguments)."""
    settings = bench.run_on(base, label)
    if listeners:
        register(settings, listeners)
    wid = f"bench-{uuid.uuid4().hex[:6]}"
    group = f"bench-fifolane-{wid}"
    cmd = worker_cmd(settings, wid, group, guarantee=guarantee, concurrency=concurrency,
                     commit_interval=COMMIT_INTERVAL, app=app, listeners=bool(listeners), python=python,
                     extra=extra)
    log = settings.home / f"{wid}.log"
    bench.step(f"{label}: fifolane {guarantee}", total)
    with running(cmd, log, env=child_env(settings)) as proc:
        try:
            commits = watch_committed(bench.bootstrap, group, settings.input_topic, settings.partitions,
                                      total, timeout=120 + total / 1000, alive=lambda: proc.poll() is None,
                                      on_progress=bench.advance)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}\nworker log {log}:\n{log_tail(log)}") from exc
        result: dict[str, Any] = {"throughput": commits.to_dict(), "listeners": len(listeners or ()),
                                  "state_topic": settings.state_topic,
                                  "notifications_topic": settings.listener_output_topic,
                                  "dlq_topic": settings.dlq_topic}
        outputs: Outputs = {"state": (settings.state_topic, key_ident)}
        if listeners:
            outputs["notifications"] = (settings.listener_output_topic, key_ident)
        if after is not None:
            bench.step(f"{label}: fifolane {guarantee} latency")
            result.update(after(result, outputs, settings.input_topic))
    return result


def run_quix(bench: Bench, python: str, base: Settings, json_topic: str, total: int, guarantee: str, *,
             label: str, script: str = "benchmarks/quix_app.py", ident: latency.Ident = quix_ident,
             after: After | None = None) -> dict[str, Any]:
    """One Quix Streams app (``script``, run by the Quix venv's ``python``) over ``json_topic``."""
    tag = f"quix-{SHORT[guarantee].lower()}-{uuid.uuid4().hex[:6]}"
    out = f"bench.quix-out.{tag}"
    create_topic(base, out, base.partitions)
    group = f"bench-{tag}"
    cmd = [python, script, "--bootstrap", bench.bootstrap, "--input", json_topic,
           "--output", out, "--group", group, "--guarantee", guarantee,
           "--commit-interval", str(COMMIT_INTERVAL), "--state-dir", str(bench.work / tag),
           *pinned_args()]
    log = bench.work / f"{tag}.log"
    bench.step(f"{label}: Quix Streams {guarantee}", total)
    with running(cmd, log) as proc:
        try:
            commits = watch_committed(bench.bootstrap, group, json_topic, base.partitions, total,
                                      timeout=180 + total / 500, alive=lambda: proc.poll() is None,
                                      on_progress=bench.advance)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}\nquix log {log}:\n{log_tail(log)}") from exc
        result: dict[str, Any] = {"throughput": commits.to_dict(), "output_topic": out}
        if after is not None:
            bench.step(f"{label}: Quix Streams {guarantee} latency")
            result.update(after(result, {"output": (out, ident)}, json_topic))
    return result


def run_kstreams(bench: Bench, build: Path, base: Settings, total: int, guarantee: str, variant: str,
                 *, warmup: tuple[str, int], label: str, after: After | None = None) -> dict[str, Any]:
    """One Kafka Streams run over ``base``'s Avro input.

    ``warmup`` = (output topic of the warm-up pass, events): the JVM first runs the same
    topology under its own application id over that many events of the input.
    """
    tag = f"ks-{variant}-{SHORT[guarantee].lower()}-{uuid.uuid4().hex[:6]}"
    out = f"bench.ks-out.{tag}"
    create_topic(base, out, base.partitions, {"cleanup.policy": "compact"})
    app_id = f"bench-{tag}"
    cmd = app_cmd(build, bootstrap=bench.bootstrap, input_topic=base.input_topic, output_topic=out,
                  app_id=app_id, state_dir=bench.work / tag, guarantee=guarantee, variant=variant,
                  commit_interval=COMMIT_INTERVAL, warmup=(base.input_topic, warmup[0], warmup[1]))
    log = bench.work / f"{tag}.log"
    bench.step(f"{label}: Kafka Streams {variant} {guarantee}", total)
    with running(cmd, log) as proc:
        try:
            # The JVM start and the warm-up pass come before the first commit: not timed.
            commits = watch_committed(bench.bootstrap, app_id, base.input_topic, base.partitions, total,
                                      timeout=240 + total / 1000, alive=lambda: proc.poll() is None,
                                      on_progress=bench.advance, first_commit_timeout=240)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}\nKafka Streams log {log}:\n{log_tail(log)}") from exc
        result: dict[str, Any] = {"throughput": commits.to_dict(), "variant": variant, "output_topic": out}
        if after is not None:
            bench.step(f"{label}: Kafka Streams {variant} {guarantee} latency")
            result.update(after(result, {"output": (out, key_ident)}, base.input_topic))
    return result


def kstreams_build(bench: Bench) -> tuple[Any, str | None]:
    """The built Kafka Streams app (built now if needed, with progress), or why not."""
    bench.step("Kafka Streams app: checking the build (mvn package on first use)")
    try:
        return ensure_app(on_progress=bench.log), None
    except KafkaStreamsError as exc:
        return None, str(exc)


def repeated_input(bench: Bench, base: Settings, total: int, times: int = CEILING_REPEAT) -> Settings:
    """A new topic set whose input holds the ``total`` records of ``base``'s input ``times``
    over (the same keys, values and partitions, in the same order per partition)."""
    rep = bench.topic_set(f"ceiling-x{times}", base.partitions)
    bench.step(f"copying {total:,} input records x{times} for the plain loop", total * times)
    records = [(m.key() or b"", m.value(), (m.partition(), None))
               for m in read_to_end(base, base.input_topic, timeout=120)]
    if len(records) != total:
        raise RuntimeError(f"{base.input_topic} holds {len(records):,} records, not {total:,}")
    produce_raw(rep, rep.input_topic, (r for _ in range(times) for r in records), on_progress=bench.advance)
    return rep


def measure_ceiling(bench: Bench, settings: Settings, total: int) -> Commits:
    """Run the passthrough loop over ``settings.input_topic`` (``total`` events) into a new topic."""
    out = f"{settings.input_topic}.passthrough.{uuid.uuid4().hex[:6]}"
    create_topic(settings, out, settings.partitions)
    group = f"bench-ceiling-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "benchmarks.passthrough", "ceiling", "--bootstrap", bench.bootstrap,
           "--input", settings.input_topic, "--output", out, "--group", group,
           "--commit-interval", str(COMMIT_INTERVAL)]
    bench.step("ceiling: passthrough loop", total)
    with running(cmd, bench.work / f"{group}.log") as proc:
        return watch_committed(bench.bootstrap, group, settings.input_topic, settings.partitions, total,
                               timeout=120 + total / 5000, alive=lambda: proc.poll() is None,
                               on_progress=bench.advance)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median rate (of an odd number of runs), with every rate beside it."""
    def rate(r: dict[str, Any]) -> float:  # NaN when a run landed in one commit (no interval)
        value = float(r["throughput"]["events_per_s"])
        return value if math.isfinite(value) else -math.inf

    ordered = sorted(runs, key=rate)
    mid = dict(ordered[len(ordered) // 2])
    mid["reps_events_per_s"] = [round(rate(r)) if math.isfinite(rate(r)) else None for r in runs]
    return mid
