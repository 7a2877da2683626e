"""``python -m benchmarks compare --before PATH --direct [--rounds N]``: the fifolane worker of
another checkout against this one's, head to head.

The suites' own ratios (``compare`` without ``--direct``) divide by baselines measured
minutes apart, and on this shared 2-core machine two rounds of one side differ by 20%: too
much to tell a 5% change. Here each case runs on one pre-produced input, the two workers
alternating run by run (before, after, before, after, ...), so both meet the same machine
within seconds; the change is the ratio of the medians, and the geometric mean of the
round-by-round ratios with its 95% confidence interval (:func:`paired`). Every run's output is read back:
a run whose state or notification count differs from the other side's is reported (a
faster run that skipped work is no result).

The input is encoded with the older checkout's schemas, which both sides read. This
checkout's fast path takes only values of the current schema version (others are decoded and
resolved: slower), so to compare fast paths give the older checkout the current schema files
(``cp -r schemas/* OLD/schemas/``); the results in benchmarks/results/compare/ were made so.

Each round also runs this checkout with ``--no-directory``: the entity directory (group
changes across partitions) is a guarantee the older worker did not have, and costs a claim
record per new entity; that run separates its cost from the rest of the change.

Cases: the table handler exactly-once and at-least-once; exactly-once with 1 and with
10,000 equality listeners and with 100 general filters (the listeners suite's
populations); the flights app exactly-once (``--app examples.flights:app`` on the app
suite's booking stream, its own input of ``n`` booking events); ``--cases`` picks some. Results: ``<results>/compare/direct.json`` and
``direct.md`` (``direct-<cases>.*`` for a pick).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.booking import APP, avro_items, stream
from benchmarks.events import events, produce_avro, produce_raw
from benchmarks.harness import Bench
from benchmarks.meters import read_records
from benchmarks.procs import WORKER_CODE_ENV
from benchmarks.registrations import equality_specs, general_specs
from benchmarks.systems import run_worker

__all__ = ["direct", "paired", "prepare", "write_comparison"]

PARTITIONS = 6
SIDES = ("before", "after")
#: A third run per round: this checkout without the entity directory (``--no-directory``),
#: which the older worker did not have; it separates the directory's cost from the rest.
NO_DIRECTORY = "after, --no-directory"
#: The app case: the flights app on the booking stream (an input of its own).
APP_CASE = "flights app EOS"


def _cases(bench: Bench) -> dict[str, tuple[str, list[tuple[str, bytes]]]]:
    return {
        "table EOS": ("exactly-once", []),
        "table ALO": ("at-least-once", []),
        "1 equality listener": ("exactly-once", equality_specs(1)),
        "10,000 equality listeners": ("exactly-once", equality_specs(bench.size(10_000, 10_000))),
        "100 general filters": ("exactly-once", general_specs(100)),
    }


#: Two-sided 95% quantiles of Student's t by degrees of freedom (1.96 beyond the table).
_T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23,
        11: 2.20, 12: 2.18, 13: 2.16, 14: 2.14, 15: 2.13, 16: 2.12, 17: 2.11, 18: 2.10, 19: 2.09,
        20: 2.09, 25: 2.06, 30: 2.04, 40: 2.02, 60: 2.00}


def paired(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """The geometric mean of the round-by-round ratios ``after[i] / before[i]`` and its 95%
    confidence interval (Student's t on the log ratios). Runs of one round meet the same
    machine within seconds, so pairing removes the drift between rounds that spreads each
    side's own runs (here 11.8-17.1 CPU-seconds for one worker's same 300,000 events)."""
    logs = [math.log(a / b) for b, a in zip(before, after, strict=True)]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.nan, math.nan
    df = len(logs) - 1
    t = next((v for k, v in sorted(_T95.items()) if k >= df), 1.96)
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def _paired_text(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> str:
    g, lo, hi = paired([x["events_per_s"] for x in before], [x["events_per_s"] for x in after])
    return f"{g:.3f}x" if math.isnan(lo) else f"{g:.3f}x [{lo:.3f}-{hi:.3f}]"


def prepare(bench: Bench, before: Path, name: str, n: int, cases: list[str] | None
            ) -> tuple[Any, dict[str, tuple[str, list[tuple[str, bytes]]]]]:
    """The comparison's input (``n`` events on topic set ``name``) and its chosen cases
    (all if ``cases`` is empty; SystemExit naming the choices for an unknown one)."""
    chosen = {k: v for k, v in _cases(bench).items() if not cases or k in cases}
    if cases and len(chosen) != len(cases):
        raise SystemExit(f"unknown case(s) {sorted(set(cases) - set(chosen))}; choose from "
                         f"{[*_cases(bench), APP_CASE]}")
    # Encoded with the older checkout's schemas: this one reads those (schemas/history),
    # while an older worker dead-letters values of a schema version it never saw.
    base = bench.topic_set(name, PARTITIONS).with_overrides(schemas_dir=before.resolve() / "schemas")
    bench.step(f"pre-producing {n:,} events", n)
    produce_avro(base, events(n), on_progress=bench.advance)
    return base, chosen


def prepare_app(bench: Bench, before: Path, n: int) -> tuple[Any, int]:
    """The app case's input: the booking stream of ``n`` reservation events (after its
    flights), encoded with the older checkout's schemas; and its event count."""
    base = bench.topic_set("ab-app", PARTITIONS).with_overrides(schemas_dir=before.resolve() / "schemas")
    evs = stream(n)
    bench.step(f"pre-producing {len(evs):,} booking events", len(evs))
    produce_raw(base, base.input_topic, avro_items(base, evs), on_progress=bench.advance)
    return base, len(evs)


def _one(bench: Bench, base: Any, n: int, guarantee: str, specs: list[tuple[str, bytes]],
         label: str, extra: list[str] | None = None, app: str | None = None) -> dict[str, Any]:
    r = run_worker(bench, base, n, guarantee, label=label, listeners=specs or None, extra=extra, app=app)
    out = {"events_per_s": float(r["throughput"]["events_per_s"]),
           "state": read_records(bench.bootstrap, r["state_topic"], None).records,
           "dead_letters": read_records(bench.bootstrap, r["dlq_topic"], None).records}
    if specs:
        out["notifications"] = read_records(bench.bootstrap, r["notifications_topic"], None).records
    return out


def direct(before: Path, results_dir: Path, quick: bool, rounds: int, cases: list[str] | None = None,
           events_n: int | None = None, with_directory: bool = True) -> int:
    """Run every case (or those named in ``cases``) ``rounds`` times per side, alternating;
    write and print the table. ``events_n``: input size (default 200,000); longer runs
    spread less. ``with_directory=False``: leave out this checkout's run with the entity
    directory (a third of the time), comparing only the workers without it."""
    out = results_dir / "compare"
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    t0 = time.monotonic()
    with Bench(quick=quick, results_dir=out) as bench:
        n = events_n or bench.size(200_000, 30_000)
        table_cases = [c for c in cases or () if c != APP_CASE]
        inputs: dict[str, tuple[Any, int, str | None]] = {}  # case -> (input, events, app)
        chosen: dict[str, tuple[str, list[tuple[str, bytes]]]] = {}
        if not cases or table_cases:
            base, chosen = prepare(bench, before, "ab", n, table_cases or None)
            inputs = {case: (base, n, None) for case in chosen}
        if not cases or APP_CASE in cases:
            app_base, app_n = prepare_app(bench, before, n)
            chosen[APP_CASE] = ("exactly-once", [])
            inputs[APP_CASE] = (app_base, app_n, APP)
        for case, (guarantee, specs) in chosen.items():
            case_base, case_n, app = inputs[case]
            for r in range(rounds):
                order = (*SIDES, NO_DIRECTORY) if with_directory else ("before", NO_DIRECTORY)
                # ABBA: every other round in reverse, so a drift of the machine during the
                # run (the broker's log cleaner catching up, say) favours neither side.
                for side in order if r % 2 == 0 else order[::-1]:
                    if side == "before":
                        os.environ[WORKER_CODE_ENV] = str(before.resolve())
                    else:
                        os.environ.pop(WORKER_CODE_ENV, None)
                    tag = "nodir" if side == NO_DIRECTORY else side
                    label = f"ab-{tag}-{case.replace(' ', '-').replace(',', '')}-{r}"
                    runs.setdefault(case, {}).setdefault(side, []).append(
                        _one(bench, case_base, case_n, guarantee, specs, label,
                             ["--no-directory"] if side == NO_DIRECTORY else None, app))
        os.environ.pop(WORKER_CODE_ENV, None)
        machine = bench.machine
    took = time.monotonic() - t0
    lines = [f"# Head to head: the worker of {before} (before) vs this checkout's (after)", "",
             f"{machine.get('cpu_count', '?')} CPUs, {machine['kafka']}; {n:,} events ({APP_CASE}: "
             f"{n:,} booking events after the flights, an input of its own), {PARTITIONS} "
             f"partitions, one input for every run; {rounds} run(s) per side and case, alternating (every "
             f"other round in reverse order); "
             f"{took:.0f} s. Outputs: state records / notifications read back (read_committed) per run, dead letters if any.", "",
             "Ratios: of the medians, and paired: the geometric mean of the round-by-round ratios "
             "with its 95% confidence interval.", "",
             "| case | before events/s (runs) | after events/s (runs) | after / before (medians) "
             "| paired [95% CI] | after --no-directory events/s (runs) | its / before (medians) "
             "| paired [95% CI] | outputs before | outputs after |",
             "|---|---|---|---:|---:|---|---:|---:|---|---|"]
    mismatched = []
    for case, sides in runs.items():
        med = {s: statistics.median(x["events_per_s"] for x in sides[s]) for s in sides}

        def outs(side: str, sides: dict[str, list[dict[str, Any]]] = sides) -> str:
            seen = sorted({(x["state"], x.get("notifications"), x["dead_letters"]) for x in sides[side]}, key=str)
            return ", ".join(f"{s:,}" + (f" / {k:,}" if k is not None else "") + (f" ({d:,} dead letters)" if d else "")
                             for s, k, d in seen)

        if len({outs(s) for s in sides}) > 1:
            mismatched.append(case)
        rates = {s: ", ".join(f"{x['events_per_s']:,.0f}" for x in sides[s]) for s in sides}
        after = f"{med['after'] / med['before']:.3f}x" if "after" in sides else "not run"
        after_paired = _paired_text(sides["before"], sides["after"]) if "after" in sides else "not run"
        lines.append(f"| {case} | {rates['before']} | {rates.get('after', 'not run')} | "
                     f"{after} | {after_paired} | {rates[NO_DIRECTORY]} | "
                     f"{med[NO_DIRECTORY] / med['before']:.3f}x | "
                     f"{_paired_text(sides['before'], sides[NO_DIRECTORY])} | {outs('before')} | "
                     f"{outs('after' if 'after' in sides else NO_DIRECTORY)} |")
    return write_comparison(out, "direct", cases, lines, mismatched, {
        "before": str(before), "events": n, "rounds": rounds, "runs": runs, "machine": machine})


def write_comparison(out: Path, prefix: str, cases: list[str] | None, lines: list[str],
                     mismatched: list[str], raw: dict[str, Any]) -> int:
    """Write ``<prefix>[-<cases>].md`` (``lines``, plus a note on cases whose outputs differ)
    and ``.json`` (``raw``) under ``out``, print the table; 1 if any outputs differ."""
    if mismatched:
        lines = [*lines, "", "Outputs differ between the sides (not comparable): " + "; ".join(mismatched)]
    name = prefix if not cases else f"{prefix}-" + "-".join(
        c.lower().replace(" ", "_").replace(",", "") for c in cases)
    (out / f"{name}.json").write_text(json.dumps(raw, indent=1))
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print((out / f"{name}.md").read_text())
    return 1 if mismatched else 0
