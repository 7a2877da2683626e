"""``python -m benchmarks run [--quick] [--only NAME,...] [--results-dir DIR]``,
``python -m benchmarks compare --before PATH [--only ...] [--rounds N] [--direct [--together]]`` (benchmarks/compare.py,
benchmarks/ab.py)
and ``python -m benchmarks profile [--events N] [--app M:A] [--py-spy]`` (a worker's profile)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

from benchmarks.harness import RESULTS_DIR, Bench
from benchmarks.suites import SUITES, load

__all__ = ["main"]


def _run(args: argparse.Namespace) -> int:
    names = list(SUITES) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)}", file=sys.stderr)
        return 2
    from benchmarks.plots import plots_from_results
    from benchmarks.report import write_markdown

    results_dir = Path(args.results_dir)
    failed: list[str] = []
    t0 = time.monotonic()
    with Bench(quick=args.quick, results_dir=results_dir) as bench:
        for name in names:
            bench.log(f"[bold]suite {name}[/bold]")
            try:
                load(name)(bench)
            except Exception:  # noqa: BLE001 - one failing suite must not lose the others
                failed.append(name)
                bench.log(f"[red]suite {name} failed:[/red]\n{traceback.format_exc()}")
        # The table covers every suite with a result here: an --only run updates its rows.
        results = {}
        for name in SUITES:
            path = results_dir / f"{name}.json"
            if name not in failed and path.exists():
                results[name] = json.loads(path.read_text())
        plots_from_results(results_dir, results)
        write_markdown(results_dir / "latest.md", results, bench.machine, args.quick)
        machine = bench.machine
    print((results_dir / "latest.md").read_text())
    print(f"{len(names) - len(failed)}/{len(names)} suites done in {time.monotonic() - t0:.0f}s "
          f"on {machine['kafka']}; results in {results_dir}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the benchmark suites")
    run.add_argument("--quick", action="store_true", help="small sizes (a smoke run of a few minutes)")
    run.add_argument("--only", default="", help=f"comma-separated suites: {','.join(SUITES)}")
    run.add_argument("--results-dir", default=str(RESULTS_DIR), help="where results are written")
    cmp = sub.add_parser("compare", help="the suites with another checkout's workers, then this one's")
    cmp.add_argument("--before", required=True, help="the other checkout (e.g. a git worktree of an older commit)")
    cmp.add_argument("--only", default="stateful,listeners", help="comma-separated suites")
    cmp.add_argument("--rounds", type=int, default=1, help="runs per side, alternating")
    cmp.add_argument("--quick", action="store_true")
    cmp.add_argument("--direct", action="store_true",
                     help="the two workers head to head on one input, run by run (benchmarks/ab.py)")
    cmp.add_argument("--cases", default="", help="with --direct: only these cases, separated by ';' "
                     "(e.g. 'table ALO;100 general filters')")
    cmp.add_argument("--events", type=int, default=None,
                     help="with --direct: input size (default 200,000; longer runs spread less)")
    cmp.add_argument("--without-directory-only", action="store_true",
                     help="with --direct: skip this checkout's run with the entity directory")
    cmp.add_argument("--together", action="store_true",
                     help="with --direct: run both workers at the same time and compare their CPU per "
                          "event (steadier on a shared machine; benchmarks/ab_together.py)")
    cmp.add_argument("--with-directory", action="store_true",
                     help="with --together: this checkout's worker keeps its entity directory (default: "
                          "--no-directory, as the older worker had none)")
    cmp.add_argument("--results-dir", default=str(RESULTS_DIR))
    prof = sub.add_parser("profile", help="cProfile a fifolane worker over pre-produced events")
    prof.add_argument("--events", type=int, default=100_000)
    prof.add_argument("--guarantee", default="exactly-once", choices=["exactly-once", "at-least-once"])
    prof.add_argument("--top", type=int, default=25)
    prof.add_argument("--app", default=None, help="profile an app (module:attr), e.g. examples.flights:app")
    prof.add_argument("--py-spy", dest="spy", action="store_true",
                      help="sample with py-spy (low overhead) instead of cProfile")
    args = parser.parse_args(argv)
    if args.command == "profile":
        from benchmarks.profiling import profile_worker

        return profile_worker(args.events, args.guarantee, args.top, app=args.app, spy=args.spy)
    if args.command == "compare" and args.direct:
        from benchmarks.ab import direct
        from benchmarks.ab_together import together

        cases = [c.strip() for c in args.cases.split(";") if c.strip()] if args.cases else None
        if args.together:
            return together(Path(args.before), Path(args.results_dir), args.quick, args.rounds, cases, args.events,
                            args.with_directory)
        return direct(Path(args.before), Path(args.results_dir), args.quick, args.rounds, cases,
                      args.events, not args.without_directory_only)
    if args.command == "compare":
        from benchmarks.compare import compare

        names = [n.strip() for n in args.only.split(",") if n.strip()]
        return compare(Path(args.before), names, Path(args.results_dir), args.quick, args.rounds)
    return _run(args)


if __name__ == "__main__":
    sys.exit(main())
