"""``python -m benchmarks compare --before PATH [--only stateful,listeners] [--rounds N]``:
the same suites with the fifolane workers of another checkout (``PATH``, e.g. a
``git worktree`` of an older commit) and of this one, alternating, in one benchmark run on
one broker. Every suite measures its own baselines each time, so the two sides are
compared by their ratios to baselines of the same moment (issue 13: "each ratio within 5%").

Results: ``<results>/compare/{before,after}/<suite>.json`` (the last round of each) and
``<results>/compare/compare.md`` (per metric: the ratio of each round and side, the median
of each side, and the change).
"""

from __future__ import annotations

import json
import os
import statistics
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.harness import Bench
from benchmarks.procs import WORKER_CODE_ENV
from benchmarks.suites import load

__all__ = ["compare"]


def _ratios(path: Path) -> dict[str, float]:
    data = json.loads(path.read_text())
    return {m["name"]: m["ratio"] for m in data["metrics"] if m.get("ratio") is not None}


def compare(before: Path, suites: list[str], results_dir: Path, quick: bool, rounds: int) -> int:
    """Run ``suites`` ``rounds`` times per side (before, after, before, after, ...)."""
    out = results_dir / "compare"
    seen: dict[tuple[str, str], dict[str, list[float]]] = {}
    failed: list[str] = []
    t0 = time.monotonic()
    with Bench(quick=quick, results_dir=out) as bench:
        for r in range(rounds):
            for side in ("before", "after"):
                if side == "before":
                    os.environ[WORKER_CODE_ENV] = str(before.resolve())
                else:
                    os.environ.pop(WORKER_CODE_ENV, None)
                bench.results_dir = out / side
                bench.results_dir.mkdir(parents=True, exist_ok=True)
                for name in suites:
                    bench.log(f"[bold]round {r + 1}: {name} ({side})[/bold]")
                    try:
                        load(name)(bench)
                    except Exception:  # noqa: BLE001 - report it, keep the other runs
                        failed.append(f"{name} ({side}, round {r + 1})")
                        bench.log(f"[red]{name} failed:[/red]\n{traceback.format_exc()}")
                        continue
                    for metric, ratio in _ratios(bench.results_dir / f"{name}.json").items():
                        seen.setdefault((name, metric), {}).setdefault(side, []).append(ratio)
        os.environ.pop(WORKER_CODE_ENV, None)
        machine = bench.machine
    lines = [f"# Before/after: {before} vs this checkout", "",
             f"{machine.get('cpu_count', '?')} CPUs, {machine['kafka']}; {rounds} round(s) per side, "
             f"alternating; {'quick' if quick else 'full'} sizes; {time.monotonic() - t0:.0f} s. "
             "Ratios are to baselines measured by the suite in the same round.", "",
             "| suite | measurement | before (rounds) | after (rounds) | before median | after median | change |",
             "|---|---|---|---|---:|---:|---:|"]
    for (suite, metric), sides in seen.items():
        b, a = sides.get("before", []), sides.get("after", [])
        mb = statistics.median(b) if b else None
        ma = statistics.median(a) if a else None
        change = f"{(ma / mb - 1) * 100:+.1f}%" if mb and ma else ""
        lines.append(f"| {suite} | {metric} | {', '.join(f'{x:.2f}' for x in b)} | "
                     f"{', '.join(f'{x:.2f}' for x in a)} | {_fmt(mb)} | {_fmt(ma)} | {change} |")
    if failed:
        lines += ["", "Failed: " + "; ".join(failed)]
    (out / "compare.md").write_text("\n".join(lines) + "\n")
    print((out / "compare.md").read_text())
    return 1 if failed else 0


def _fmt(x: Any) -> str:
    return "" if x is None else f"{x:.2f}x"
