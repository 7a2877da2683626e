"""Worker runs that count CPU seconds: the capacity and scaling suites' one runner.

:func:`run_workers` starts ``k`` fifolane workers in one consumer group over a settings'
input, drains ``total`` events and measures, from the first commit to the commit covering
the last event (as :func:`benchmarks.procs.watch_committed` times every system), the
events/s and the CPU seconds of the workers and of the local brokers. ``before_drain``
runs once every worker has joined and holds its partitions (a warm start: the scaling
suite produces its input then, so no rebalance falls inside the timed part), on a thread
beside the watch of the commits.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import COMMIT_INTERVAL, Bench
from benchmarks.meters import Brokers, cpu_seconds, loadavg
from benchmarks.procs import Commits, child_env, log_tail, running, watch_committed, worker_cmd
from benchmarks.registrations import register
from fifolane.config import Settings

__all__ = ["CpuRun", "run_workers"]


@dataclass
class CpuRun:
    """One timed drain: events, seconds and CPU seconds of the workers and brokers."""

    workers: int
    events: int  # timed events (after the first commit)
    seconds: float
    worker_cpu_s: float
    broker_cpu_s: float | None  # None: the brokers are not processes of this machine
    loadavg: list[float]
    commits: Commits
    settings: Settings

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("nan")

    @property
    def worker_us(self) -> float:
        """Worker CPU microseconds per event (nan when nothing was timed)."""
        return self.worker_cpu_s / self.events * 1e6 if self.events else float("nan")

    @property
    def broker_us(self) -> float | None:
        if self.broker_cpu_s is None or not self.events:
            return None
        return self.broker_cpu_s / self.events * 1e6

    def to_dict(self) -> dict[str, Any]:
        return {"workers": self.workers, "events": self.events, "seconds": round(self.seconds, 3),
                "events_per_s": self.rate, "worker_cpu_s": round(self.worker_cpu_s, 3),
                "broker_cpu_s": None if self.broker_cpu_s is None else round(self.broker_cpu_s, 3),
                "worker_us_per_event": self.worker_us, "broker_us_per_event": self.broker_us,
                "cores_used": (self.worker_cpu_s + (self.broker_cpu_s or 0)) / self.seconds
                if self.seconds > 0 else None,
                "loadavg": self.loadavg, "state_topic": self.settings.state_topic,
                "notifications_topic": self.settings.listener_output_topic,
                "dlq_topic": self.settings.dlq_topic, "directory_topic": self.settings.directory_topic,
                "commits": self.commits.to_dict()}


def _assigned(stats_files: list[Path]) -> int:
    """Partitions held by the workers, from their stats files (0 while one is missing)."""
    total = 0
    for path in stats_files:
        try:
            total += len(json.loads(path.read_text()).get("assigned", []))
        except (OSError, ValueError):
            return 0
    return total


def run_workers(bench: Bench, settings: Settings, total: int, *, label: str, workers: int = 1,
                brokers: Brokers | None, listeners: list[tuple[str, bytes]] | None = None,
                app: str | None = None, fresh_outputs: bool = True,
                before_drain: Callable[[], None] | None = None, timed: bool = True) -> CpuRun:
    """``workers`` exactly-once workers over ``settings``' input (fresh output topics unless
    ``fresh_outputs`` is False); see the module docstring. ``timed=False``: a run only for
    its outputs (the dead-letter run), which may drain in its first commit."""
    run = bench.run_on(settings, label) if fresh_outputs else settings
    if listeners:
        register(run, listeners)
    group = f"bench-{label}-{uuid.uuid4().hex[:6]}"
    wids = [f"{group}-w{i}" for i in range(workers)]
    broker_pids = brokers.pids if brokers is not None else []
    first: dict[str, float] = {}

    def progress(done: int) -> None:
        bench.advance(done)
        if done > 0 and not first:  # the first commit: CPU spent until now is start-up
            first.update(w=cpu_seconds(pids), b=cpu_seconds(broker_pids))

    with contextlib.ExitStack() as stack:
        procs = []
        for wid in wids:
            cmd = worker_cmd(run, wid, group, guarantee="exactly-once", commit_interval=COMMIT_INTERVAL,
                             app=app, listeners=bool(listeners))
            procs.append(stack.enter_context(running(cmd, run.home / f"{wid}.log", env=child_env(run))))
        pids = [p.pid for p in procs]
        logs = [run.home / f"{wid}.log" for wid in wids]

        def alive() -> bool:
            return all(p.poll() is None for p in procs)

        try:
            if before_drain is not None:
                bench.step(f"{label}: {workers} worker(s) joining", run.partitions)
                stats = [run.home / f"{wid}.stats.json" for wid in wids]
                deadline = time.monotonic() + 120
                while _assigned(stats) < run.partitions:
                    if not alive() or time.monotonic() > deadline:
                        raise RuntimeError(f"{label}: workers hold {_assigned(stats)}/{run.partitions} "
                                           "partitions (exited or too slow)")
                    time.sleep(0.1)  # polling the stats files under a deadline
                # Beside the watch: were the burst produced first, fast workers could apply all
                # of it before the watch saw a commit, and the run would have nothing to time.
                failed: list[BaseException] = []

                def produce(fn: Callable[[], None] = before_drain) -> None:
                    try:
                        fn()
                    except BaseException as exc:  # noqa: BLE001 - raised in the caller below
                        failed.append(exc)

                burst = threading.Thread(target=produce, name="burst", daemon=True)
                burst.start()
            bench.step(f"{label}: {workers} worker(s) draining", total)
            commits = watch_committed(run.resolved_bootstrap(), group, run.input_topic, run.partitions, total,
                                      timeout=180 + total / 1000, alive=alive, on_progress=progress)
            if before_drain is not None:
                burst.join(60)
                if failed:
                    raise RuntimeError(f"{label}: producing the input failed: {failed[0]}") from failed[0]
        except (RuntimeError, TimeoutError) as exc:
            tails = "\n".join(f"{log}:\n{log_tail(log, 15)}" for log in logs)
            raise RuntimeError(f"{exc}\n{tails}") from exc
        worker_cpu = cpu_seconds(pids) - first["w"]
        broker_cpu = cpu_seconds(broker_pids) - first["b"] if brokers is not None else None
    t0, c0 = commits.first
    if c0 >= total and timed:
        raise RuntimeError(f"{label}: all {total:,} events landed in the first commit: nothing to time; "
                           "give the run more events")
    return CpuRun(workers=workers, events=total - c0, seconds=commits.end - t0, worker_cpu_s=worker_cpu,
                  broker_cpu_s=broker_cpu, loadavg=loadavg(), commits=commits, settings=run)
