"""``python -m benchmarks compare --before PATH --direct [--rounds N]``: the fifolane worker of
another checkout against this one's, head to head.

The suites' own ratios (``compare`` without ``--direct``) divide by baselines measured
minutes apart, and on this shared 2-core machine two rounds of one side differ by 20%: too
much to tell a 5% change. Here each case runs on one pre-produced input, the two workers
alternating run by run (before, after, before, after, ...), so both meet the same machine
within seconds; the change is the ratio of the medians. Every run's output is read back:
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
populations); ``--cases`` picks some. Results: ``<results>/compare/direct.json`` and
``direct.md`` (``direct-<cases>.*`` for a pick).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.events import events, produce_avro
from benchmarks.harness import Bench
from benchmarks.meters import read_records
from benchmarks.procs import WORKER_CODE_ENV
from benchmarks.registrations import equality_specs, general_specs
from benchmarks.systems import run_worker

__all__ = ["direct"]

PARTITIONS = 6
SIDES = ("before", "after")
#: A third run per round: this checkout without the entity directory (``--no-directory``),
#: which the older worker did not have; it separates the directory's cost from the rest.
NO_DIRECTORY = "after, --no-directory"


def _cases(bench: Bench) -> dict[str, tuple[str, list[tuple[str, bytes]]]]:
    return {
        "table EOS": ("exactly-once", []),
        "table ALO": ("at-least-once", []),
        "1 equality listener": ("exactly-once", equality_specs(1)),
        "10,000 equality listeners": ("exactly-once", equality_specs(bench.size(10_000, 10_000))),
        "100 general filters": ("exactly-once", general_specs(100)),
    }


def _one(bench: Bench, base: Any, n: int, guarantee: str, specs: list[tuple[str, bytes]],
         label: str, extra: list[str] | None = None) -> dict[str, Any]:
    r = run_worker(bench, base, n, guarantee, label=label, listeners=specs or None, extra=extra)
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
        # Encoded with the older checkout's schemas: this one reads those (schemas/history),
        # while an older worker dead-letters values of a schema version it never saw.
        base = bench.topic_set("ab", PARTITIONS).with_overrides(schemas_dir=before.resolve() / "schemas")
        bench.step(f"pre-producing {n:,} events", n)
        produce_avro(base, events(n), on_progress=bench.advance)
        chosen = {k: v for k, v in _cases(bench).items() if not cases or k in cases}
        if cases and len(chosen) != len(cases):
            raise SystemExit(f"unknown case(s) {sorted(set(cases) - set(chosen))}; choose from {list(_cases(bench))}")
        for case, (guarantee, specs) in chosen.items():
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
                        _one(bench, base, n, guarantee, specs, label,
                             ["--no-directory"] if side == NO_DIRECTORY else None))
        os.environ.pop(WORKER_CODE_ENV, None)
        machine = bench.machine
    took = time.monotonic() - t0
    lines = [f"# Head to head: the worker of {before} (before) vs this checkout's (after)", "",
             f"{machine.get('cpu_count', '?')} CPUs, {machine['kafka']}; {n:,} events, {PARTITIONS} "
             f"partitions, one input for every run; {rounds} run(s) per side and case, alternating (every "
             f"other round in reverse order); "
             f"{took:.0f} s. Outputs: state records / notifications read back (read_committed) per run, dead letters if any.", "",
             "| case | before events/s (runs) | after events/s (runs) | after / before (medians) "
             "| after --no-directory events/s (runs) | its / before | outputs before | outputs after |",
             "|---|---|---|---:|---|---:|---|---|"]
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
        lines.append(f"| {case} | {rates['before']} | {rates.get('after', 'not run')} | "
                     f"{after} | {rates[NO_DIRECTORY]} | "
                     f"{med[NO_DIRECTORY] / med['before']:.3f}x | {outs('before')} | "
                     f"{outs('after' if 'after' in sides else NO_DIRECTORY)} |")
    if mismatched:
        lines += ["", "Outputs differ between the sides (not comparable): " + "; ".join(mismatched)]
    name = "direct" if not cases else "direct-" + "-".join(
        c.lower().replace(" ", "_").replace(",", "") for c in cases)
    (out / f"{name}.json").write_text(json.dumps({"before": str(before), "events": n, "rounds": rounds,
                                                 "runs": runs, "machine": machine}, indent=1))
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print((out / f"{name}.md").read_text())
    return 1 if mismatched else 0
