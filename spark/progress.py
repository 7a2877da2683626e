"""Live progress of a Spark build: the current step, the running stages and their tasks.

:class:`SparkProgress` polls pyspark's ``StatusTracker`` from a thread and renders it with
rich: one row for the build step (``step(text)``, the ``Step`` of :mod:`spark.job`), one
bar per running stage (tasks done of the stage's tasks), and a summary row (executors, jobs,
stages, tasks done). It works the same on ``local[*]`` and on a cluster. On a console that
is not a terminal it shows nothing (logs and CI output stay clean).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from types import TracebackType

from py4j.protocol import Py4JError
from pyspark import SparkContext
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

__all__ = ["SparkProgress", "StageRow", "StatusSnapshot", "StatusPoller"]


@dataclass(frozen=True)
class StageRow:
    """One running stage."""

    stage_id: int
    name: str
    tasks: int
    done: int
    running: int
    failed: int


@dataclass
class StatusSnapshot:
    """What the cluster is doing now, and what it has done since the poller started."""

    executors: int
    jobs: int = 0
    jobs_done: int = 0
    stages_done: int = 0
    tasks_done: int = 0
    active: list[StageRow] = field(default_factory=list)

    def summary(self) -> str:
        """One line, e.g. ``2 executors · jobs 9/9 · 14 stages · 31 tasks done``."""
        where = "local" if self.executors == 0 else _count(self.executors, "executor")
        return (f"{where} · jobs {self.jobs_done}/{self.jobs} · {_count(self.stages_done, 'stage')} · "
                f"{_count(self.tasks_done, 'task')} done")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


class StatusPoller:
    """Reads the StatusTracker; finished jobs are counted once and not asked again."""

    def __init__(self, context: SparkContext) -> None:
        self._context = context
        self._tracker = context.statusTracker()
        self._known = set(self._tracker.getJobIdsForGroup(None))  # jobs before we started
        self._finished: dict[int, tuple[int, int]] = {}  # job id -> (stages run, tasks done)

    def executors(self) -> int:
        """Executors registered with the driver (0 in local mode, where the driver runs tasks)."""
        infos = self._context._jsc.sc().statusTracker().getExecutorInfos()
        return max(len(infos) - 1, 0)  # the driver is listed too

    def poll(self) -> StatusSnapshot:
        """The current snapshot."""
        snap = StatusSnapshot(self.executors())
        tracker = self._tracker
        for job_id in tracker.getJobIdsForGroup(None):
            if job_id in self._known:
                continue
            snap.jobs += 1
            done = self._finished.get(job_id)
            if done is None:
                info = tracker.getJobInfo(job_id)
                if info is None:
                    continue
                stages = [s for s in (tracker.getStageInfo(i) for i in info.stageIds) if s is not None]
                ran = [s for s in stages if s.numCompletedTasks or s.numActiveTasks]
                done = (len([s for s in ran if s.numCompletedTasks >= s.numTasks]),
                        sum(s.numCompletedTasks for s in ran))
                if info.status in ("SUCCEEDED", "FAILED"):
                    self._finished[job_id] = done
            if job_id in self._finished:
                snap.jobs_done += 1
            snap.stages_done += done[0]
            snap.tasks_done += done[1]
        for stage_id in sorted(tracker.getActiveStageIds()):
            s = tracker.getStageInfo(stage_id)
            if s is not None:
                snap.active.append(StageRow(stage_id, s.name, s.numTasks, s.numCompletedTasks,
                                            s.numActiveTasks, s.numFailedTasks))
        return snap


class SparkProgress:
    """``with SparkProgress(sc, console) as p: build_views(..., step=p.step)``."""

    def __init__(self, context: SparkContext, console: Console, *, interval: float = 0.2) -> None:
        self.console = console
        self.interval = interval
        self.live = console.is_terminal
        self.poller = StatusPoller(context)
        self.last: StatusSnapshot | None = None
        self._progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=24),
            TextColumn("{task.fields[count]}"), TimeElapsedColumn(),
            console=console, refresh_per_second=5,
        )
        self._step: TaskID | None = None
        self._summary: TaskID | None = None
        self._stages: dict[int, TaskID] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-progress", daemon=True)

    def __enter__(self) -> SparkProgress:
        if self.live:
            self._step = self._progress.add_task("starting", total=None, count="")
            self._summary = self._progress.add_task("spark", total=None, count="")
            self._progress.start()
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if not self.live:
            return
        self._stop.set()
        self._thread.join()
        with suppress(Py4JError):  # the JVM may be gone after a failure
            self._update()  # the final totals stay on screen
        for task in (self._step, self._summary):
            if task is not None:
                self._progress.update(task, total=1, completed=1)
        if self._step is not None:
            self._progress.update(self._step, description="done" if kind is None else "failed")
        self._progress.stop()

    @contextmanager
    def step(self, text: str) -> Iterator[None]:
        """Show ``text`` as the current build step while the block runs."""
        if self._step is not None:
            self._progress.update(self._step, description=text)
        yield

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._update()
            except Py4JError:  # the JVM is going away: progress is best effort
                return

    def _update(self) -> None:
        snap = self.last = self.poller.poll()
        if self._summary is not None:
            self._progress.update(self._summary, description=f"spark: {snap.summary()}")
        running = {row.stage_id: row for row in snap.active}
        for stage_id in [s for s in self._stages if s not in running]:
            self._progress.remove_task(self._stages.pop(stage_id))
        for row in snap.active:
            count = (f"{row.done}/{row.tasks} tasks, {row.running} running"
                     + (f", {row.failed} failed" if row.failed else ""))
            if row.stage_id not in self._stages:
                label = f"  stage {row.stage_id}: {row.name.split(' at ')[0]}"
                self._stages[row.stage_id] = self._progress.add_task(label, total=row.tasks, count=count)
            self._progress.update(self._stages[row.stage_id], completed=row.done, total=row.tasks,
                                  count=count)
