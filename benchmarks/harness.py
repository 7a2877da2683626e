"""The benchmark run: one Kafka, fresh topic sets, progress display and result files.

    with Bench(quick=True, results_dir=...) as bench:
        settings = bench.topic_set("stateful", partitions=6)
        ...
        bench.write_result("stateful", metrics, raw=..., settings=...)

Kafka: ``FIFOLANE_BOOTSTRAP_SERVERS`` if set (nothing is started or stopped), else a
one-broker :class:`fifolane.cluster.LocalCluster` in ``.fifolane/bench-kafka``, started
fresh and stopped when the run ends.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.topics import ensure_topics

__all__ = ["BENCH_HOME", "RESULTS_DIR", "Bench", "Metric", "machine_info"]

BENCH_HOME = PROJECT_ROOT / ".fifolane" / "bench-kafka"
RESULTS_DIR = PROJECT_ROOT / "benchmarks" / "results"
SHARED_LIBS = PROJECT_ROOT / ".fifolane" / "kafka" / "libs"
#: Checkpoint / commit interval used by every system in the throughput suites (fifolane's default).
COMMIT_INTERVAL = 0.25


@dataclass
class Metric:
    """One row of the results table: a measurement, its baseline and the issue's target."""

    suite: str
    name: str
    value: float | None
    unit: str
    baseline: str = ""
    baseline_value: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.baseline_value:
            return None
        return self.value / self.baseline_value

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001 - a missing package is just "not installed"
        return None


def _kafka_version(libs: Path) -> str | None:
    for jar in sorted(libs.glob("kafka-clients-*.jar")):
        return jar.stem.removeprefix("kafka-clients-")
    return None


def machine_info(kafka: str) -> dict[str, Any]:
    """CPU, memory and library versions: everything needed to compare two runs."""
    import confluent_kafka
    import psutil

    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "confluent_kafka": _version("confluent-kafka"),
        "librdkafka": confluent_kafka.libversion()[0],
        "fastavro": _version("fastavro"),
        "rocksdict": _version("rocksdict"),
        "kafka": kafka,
        "general_path": _general_path(),
    }


def _general_path() -> str:
    """Whether the worker runs the compiled general path (fifolane/compiled.py)."""
    from fifolane import compiled

    state = compiled.status()
    return "compiled with mypyc" if state == "current" else f"pure Python ({state})"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


@dataclass
class Bench:
    """A benchmark run: its Kafka, its scratch space, its progress display and its results."""

    quick: bool = False
    results_dir: Path = RESULTS_DIR
    console: Console = field(default_factory=Console)
    bootstrap: str = ""
    kafka: str = ""
    _cluster: Any = None
    _cluster_dir: Path = BENCH_HOME
    _progress: Progress | None = None
    _task: TaskID | None = None
    metrics: list[Metric] = field(default_factory=list)

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Bench:
        self.results_dir.mkdir(parents=True, exist_ok=True)
        run_id = uuid.uuid4().hex[:8]
        self.work = BENCH_HOME / "work" / run_id
        self.work.mkdir(parents=True, exist_ok=True)
        external = os.environ.get("FIFOLANE_BOOTSTRAP_SERVERS")
        if external:
            self.bootstrap, self.kafka = external, f"external ({external})"
        else:
            from fifolane.cluster import LocalCluster

            # A directory per run: two benchmark runs at once must not share (or wipe) a broker.
            self._cluster_dir = BENCH_HOME / "clusters" / run_id
            self.console.print(f"starting a one-broker Kafka in {self._cluster_dir} ...")
            self._cluster = LocalCluster(self._cluster_dir, 1, libs=SHARED_LIBS)
            self._cluster.up(timeout=180, fresh=True)
            self.bootstrap = self._cluster.bootstrap_servers
            self.kafka = f"Apache Kafka {_kafka_version(SHARED_LIBS)} (1 local broker, KRaft)"
        self.machine = machine_info(self.kafka)
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                  TextColumn("{task.completed:,.0f}/{task.total:,.0f}"),
                                  TimeElapsedColumn(), console=self.console)
        self._progress.start()
        self._warm_broker()
        return self

    def _warm_broker(self) -> None:
        """Warm the broker's JVM before any suite measures (benchmarks/broker_warm.py); off
        with FIFOLANE_BENCH_WARM_BROKER=0."""
        if os.environ.get("FIFOLANE_BENCH_WARM_BROKER", "1") == "0":
            self.machine["broker_warmup"] = "skipped (FIFOLANE_BENCH_WARM_BROKER=0)"
            return
        from benchmarks.broker_warm import warm_broker

        pids = [] if self._cluster is None else [b.pid for b in self._cluster.status().brokers if b.pid is not None]
        limit = 60.0 if self.quick else 120.0
        self.step("warming the broker's JVM until its compiler threads are quiet (seconds)", limit)
        self.machine["broker_warmup"] = warm_broker(self.bootstrap, pids, min_s=20.0, max_s=limit,
                                                    on_progress=self.advance)
        self.log(f"broker warm-up: {self.machine['broker_warmup']}")

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()
        logs = self.results_dir / "raw" / "logs"  # raw/ is git-ignored
        logs.mkdir(parents=True, exist_ok=True)
        for log in self.work.rglob("*.log"):
            shutil.copy(log, logs / log.name)
        shutil.rmtree(self.work, ignore_errors=True)
        if self._cluster is not None:
            self.console.print("stopping the benchmark Kafka ...")
            self._cluster.down(timeout=30)
            shutil.rmtree(self._cluster_dir, ignore_errors=True)

    # -- progress --------------------------------------------------------------------------
    def step(self, description: str, total: float | None = None) -> None:
        """Show what runs now (a new progress line; ``total`` for a counted step)."""
        assert self._progress is not None
        if self._task is not None:
            self._progress.update(self._task, visible=False)
        self._task = self._progress.add_task(description, total=total if total else 1)

    def advance(self, completed: float) -> None:
        """Update the count of the current step."""
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=completed)

    def log(self, text: str) -> None:
        (self._progress.console if self._progress else self.console).print(text)

    # -- sizes and topics --------------------------------------------------------------------
    def size(self, full: int, quick: int) -> int:
        """A suite parameter: ``quick`` under ``--quick``, else ``full``."""
        return quick if self.quick else full

    def settings(self, tag: str, partitions: int, **overrides: Any) -> Settings:
        """Settings with a uuid topic for every role (nothing created yet)."""
        s = f"{tag}.{uuid.uuid4().hex[:8]}"
        values: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap, "input_topic": f"bench.events.{s}",
            "state_topic": f"bench.state.{s}", "registry_topic": f"bench.listeners.{s}",
            "dlq_topic": f"bench.dlq.{s}", "listener_output_topic": f"bench.notifications.{s}",
            "directory_topic": f"bench.directory.{s}", "parked_topic": f"bench.parked.{s}",
            "partitions": partitions, "home": self.work / s,
        }
        values.update(overrides)
        return Settings(**values)

    def topic_set(self, tag: str, partitions: int, **overrides: Any) -> Settings:
        """Fresh role topics (input, state, registry, dlq, notifications), created."""
        settings = self.settings(tag, partitions, **overrides)
        ensure_topics(settings, partitions)
        return settings

    def run_on(self, base: Settings, tag: str) -> Settings:
        """The same input topic with fresh output topics: one system's run over shared input."""
        s = f"{tag}.{uuid.uuid4().hex[:8]}"
        settings = base.with_overrides(
            state_topic=f"bench.state.{s}", registry_topic=f"bench.listeners.{s}",
            dlq_topic=f"bench.dlq.{s}", listener_output_topic=f"bench.notifications.{s}",
            directory_topic=f"bench.directory.{s}", parked_topic=f"bench.parked.{s}",
            home=self.work / s,
        )
        ensure_topics(settings, base.partitions)
        return settings

    # -- results -----------------------------------------------------------------------------
    def write_result(self, suite: str, metrics: list[Metric], *, settings: dict[str, Any],
                     raw: dict[str, Any], notes: list[str] | None = None,
                     started: float | None = None) -> Path:
        """``<results>/<suite>.json``: machine, settings, raw numbers, the table rows."""
        self.metrics.extend(metrics)
        data = {
            "suite": suite,
            "quick": self.quick,
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "duration_s": round(time.monotonic() - started, 1) if started else None,
            "machine": self.machine,
            "settings": settings,
            "raw": raw,
            "metrics": [m.to_dict() for m in metrics],
            "notes": notes or [],
        }
        path = self.results_dir / f"{suite}.json"
        path.write_text(json.dumps(data, indent=2, default=str) + "\n")
        return path
