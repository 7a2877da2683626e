"""``python -m benchmarks compare --before PATH --direct --together``: both workers at once.

Run one after the other (benchmarks/ab.py), two runs of the same worker here differ by up to
45% in CPU-seconds per event (11.8 against 17.1 for one worker's 300,000 events): the
shared machine speeds up and slows down over minutes, so even alternating rounds leave a
10% spread per pair. Here the older checkout's worker and this one's (``--no-directory``,
as in the sequential comparison) run *at the same time*, each its own consumer group on one
pre-produced input, each writing its own output topics. Whatever the machine does meanwhile
it does to both, so the ratio of their CPU-seconds per event (all threads of the worker
process, from its first commit to the commit covering the last event) is steady: a spread
of 1-4% per round where the sequential runs spread 10-15%.

The figure is the speed ratio ``before CPU per event / after CPU per event`` (above 1: this
checkout needs less CPU per event), per round, and their geometric mean with a 95% interval
(:func:`benchmarks.ab.paired`). Which worker starts first alternates by round. Every run's
outputs are read back and must be equal on both sides.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.ab import PARTITIONS, paired, prepare, write_comparison
from benchmarks.harness import COMMIT_INTERVAL, Bench
from benchmarks.meters import cpu_seconds, read_records
from benchmarks.procs import (
    WORKER_CODE_ENV,
    child_env,
    log_tail,
    running,
    watch_committed,
    worker_cmd,
)
from benchmarks.registrations import register

__all__ = ["together"]

SIDES = ("before", "after")


def _round(bench: Bench, base: Any, before: Path, n: int, guarantee: str, specs: list[tuple[str, bytes]],
           tag: str, first: str, after_args: list[str]) -> dict[str, dict[str, Any]]:
    """Both workers at once; per side: CPU-seconds per event, drain seconds, outputs."""
    runs: dict[str, tuple[Any, str]] = {}
    for side in SIDES:
        s = bench.run_on(base, f"tg-{side}-{tag}")
        if specs:
            register(s, specs)
        runs[side] = (s, f"tg-{side}-{uuid.uuid4().hex[:6]}")
    out: dict[str, dict[str, Any]] = {}
    failed: list[BaseException] = []
    with contextlib.ExitStack() as stack:
        procs = {}
        for side in (first, *[s for s in SIDES if s != first]):
            s, wid = runs[side]
            if side == "before":
                os.environ[WORKER_CODE_ENV] = str(before.resolve())
            else:
                os.environ.pop(WORKER_CODE_ENV, None)
            cmd = worker_cmd(s, wid, f"g-{wid}", guarantee=guarantee, commit_interval=COMMIT_INTERVAL,
                             listeners=bool(specs), extra=None if side == "before" else after_args)
            procs[side] = stack.enter_context(running(cmd, s.home / f"{wid}.log", env=child_env(s)))
        os.environ.pop(WORKER_CODE_ENV, None)

        def watch(side: str) -> None:
            s, wid = runs[side]
            proc = procs[side]
            start: dict[str, float] = {}

            def progress(done: int) -> None:
                if done > 0 and not start:  # the first commit: CPU until now is start-up
                    start["cpu"] = cpu_seconds([proc.pid])

            try:
                c = watch_committed(bench.bootstrap, f"g-{wid}", s.input_topic, s.partitions, n,
                                    timeout=300 + n / 500, alive=lambda: proc.poll() is None,
                                    on_progress=progress)
                t0, c0 = c.first
                if c0 >= n:
                    raise RuntimeError(f"{side}: all {n:,} events landed in the first commit; give more events")
                out[side] = {"cpu_us_per_event": (cpu_seconds([proc.pid]) - start["cpu"]) / (n - c0) * 1e6,
                             "drain_s": c.end - t0, "events_per_s": (n - c0) / (c.end - t0)}
            except BaseException as exc:  # noqa: BLE001 - reported by the caller
                failed.append(RuntimeError(f"{side}: {exc}\n{log_tail(s.home / f'{wid}.log')}"))

        threads = [threading.Thread(target=watch, args=(side,), daemon=True) for side in SIDES]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if failed:
        raise failed[0]
    for side in SIDES:
        s, _wid = runs[side]
        out[side]["state"] = read_records(bench.bootstrap, s.state_topic, None).records
        out[side]["dead_letters"] = read_records(bench.bootstrap, s.dlq_topic, None).records
        if specs:
            out[side]["notifications"] = read_records(bench.bootstrap, s.listener_output_topic, None).records
    return out


def together(before: Path, results_dir: Path, quick: bool, rounds: int, cases: list[str] | None = None,
             events_n: int | None = None, with_directory: bool = False) -> int:
    """Every case (or those in ``cases``) ``rounds`` times, both sides at once; write and print
    the table (``<results>/compare/together*.md`` and ``.json``). ``with_directory``: this
    checkout's worker keeps its entity directory, like the older one (to measure a change of
    the directory's own path), instead of running with ``--no-directory``."""
    after_args = [] if with_directory else ["--no-directory"]
    with_args = "" if with_directory else " with --no-directory"
    out = results_dir / "compare"
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {}
    t0 = time.monotonic()
    with Bench(quick=quick, results_dir=out) as bench:
        n = events_n or bench.size(300_000, 30_000)
        base, chosen = prepare(bench, before, "tg", n, cases)
        for case, (guarantee, specs) in chosen.items():
            for r in range(rounds):
                bench.step(f"{case}: round {r + 1}/{rounds}, both workers at once")
                tag = f"{case.replace(' ', '-').replace(',', '')}-{r}"
                runs.setdefault(case, []).append(
                    _round(bench, base, before, n, guarantee, specs, tag, SIDES[r % 2], after_args))
        machine = bench.machine
    took = time.monotonic() - t0
    lines = [f"# Side by side: the worker of {before} (before) and this checkout's{with_args} "
             "(after), at the same time", "",
             f"{machine.get('cpu_count', '?')} CPUs, {machine['kafka']}; {n:,} events, {PARTITIONS} partitions, "
             f"one input read by both; {rounds} round(s) per case, the first to start alternating; {took:.0f} s.",
             "Speed = 1 / (CPU-seconds per event of the worker process, first commit to last); the ratio is "
             "after over before per round, then the geometric mean with its 95% confidence interval. "
             "Outputs: state records / notifications read back (read_committed) per run.", "",
             "| case | before CPU µs/event (rounds) | after CPU µs/event (rounds) | speed after / before per round "
             "| geometric mean [95% CI] | outputs |",
             "|---|---|---|---|---:|---|"]
    mismatched = []
    for case, rs in runs.items():
        cpu = {side: [r[side]["cpu_us_per_event"] for r in rs] for side in SIDES}
        g, lo, hi = paired([1 / x for x in cpu["before"]], [1 / x for x in cpu["after"]])
        outs = {(r[side]["state"], r[side].get("notifications"), r[side]["dead_letters"]) for r in rs for side in SIDES}
        if len(outs) > 1:
            mismatched.append(case)
        shown = "; ".join(f"{s:,}" + (f" / {k:,}" if k is not None else "") + (f" ({d:,} dead letters)" if d else "")
                          for s, k, d in sorted(outs, key=str))
        interval = "" if lo != lo else f" [{lo:.3f}-{hi:.3f}]"  # noqa: PLR0124 - NaN: one round
        lines.append(f"| {case} | {', '.join(f'{x:.1f}' for x in cpu['before'])} | "
                     f"{', '.join(f'{x:.1f}' for x in cpu['after'])} | "
                     f"{', '.join(f'{b / a:.3f}' for b, a in zip(cpu['before'], cpu['after'], strict=True))} | "
                     f"{g:.3f}x{interval} | {shown} |")
    return write_comparison(out, "together", cases, lines, mismatched, {
        "before": str(before), "events": n, "rounds": rounds, "runs": runs, "machine": machine})
