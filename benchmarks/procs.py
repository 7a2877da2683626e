"""Systems under test as subprocesses, and the one way their progress is measured.

Every system (fifolane worker, the plain passthrough loop, the serial baseline, Quix
Streams) commits its input offsets under a consumer group; :func:`watch_committed` samples
those commits. Throughput is timed from the first commit seen to the commit that covers
every event, so process start-up, group join and restore (everything before the first
commit) are excluded the same way for every system.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from fifolane.config import PROJECT_ROOT, Settings

__all__ = ["CONSUMER_PINNED", "WORKER_CODE_ENV", "Commits", "child_env", "pinned_args", "read_stats", "running",
           "watch_committed", "worker_cmd"]

#: librdkafka consumer settings pinned for every librdkafka-based system (the plain loops,
#: fifolane, Quix Streams). By default a consumer stops fetching for fetch.queue.backoff.ms
#: (1000 ms) whenever its queue holds more than queued.min.messages (100,000); with the
#: high-level consumer that is the one queue of all partitions, so a single fetch response
#: (6 partitions x max.partition.fetch.bytes 1 MB, ~120,000 of the benchmark's events) trips
#: it. A fast loop then drains the queue in ~0.3 s and idles for the rest of the second:
#: ~120k events/s. Runs whose fetches and drains interleave differently never trip it: ~200k
#: and more. That was the bimodal plain loop (benchmarks/README.md, "Stable baselines").
#: Re-checking the queue every 10 ms instead keeps the same memory bound without the stall.
#: The Java client (Kafka Streams) has no such back-off. The fifolane worker sets it itself.
CONSUMER_PINNED: dict[str, str] = {"fetch.queue.backoff.ms": "10"}


def read_stats(path: Path) -> dict[str, Any]:
    """A worker's ``--stats-file`` snapshot ({} while it is not written yet)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError):
        return {}


def pinned_args() -> list[str]:
    """``--consumer-config KEY=VALUE`` arguments carrying :data:`CONSUMER_PINNED`."""
    return [arg for k, v in CONSUMER_PINNED.items() for arg in ("--consumer-config", f"{k}={v}")]


#: Another checkout whose fifolane workers run instead of this one's (``benchmarks compare``).
WORKER_CODE_ENV = "FIFOLANE_BENCH_WORKER_CODE"


def child_env(settings: Settings) -> dict[str, str]:
    """The environment of a fifolane child: the settings as FIFOLANE_* and nothing else of ours.
    With ``FIFOLANE_BENCH_WORKER_CODE`` set, the child runs that checkout's code (its
    consumer then gets :data:`CONSUMER_PINNED` through FIFOLANE_LIBRDKAFKA, as older workers
    did not set it themselves)."""
    code = os.environ.get(WORKER_CODE_ENV)
    librdkafka = {**settings.librdkafka, **(CONSUMER_PINNED if code else {})}
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    env.update({
        "FIFOLANE_BOOTSTRAP_SERVERS": settings.resolved_bootstrap(),
        "FIFOLANE_INPUT_TOPIC": settings.input_topic, "FIFOLANE_STATE_TOPIC": settings.state_topic,
        "FIFOLANE_REGISTRY_TOPIC": settings.registry_topic, "FIFOLANE_DLQ_TOPIC": settings.dlq_topic,
        "FIFOLANE_LISTENER_OUTPUT_TOPIC": settings.listener_output_topic,
        "FIFOLANE_DIRECTORY_TOPIC": settings.directory_topic,
        "FIFOLANE_PARKED_TOPIC": settings.parked_topic,
        "FIFOLANE_HOME": str(settings.home), "FIFOLANE_PARTITIONS": str(settings.partitions),
        "FIFOLANE_LOG_LEVEL": "INFO",
        # The worker's consumer has CONSUMER_PINNED in its own configuration
        # (services.worker.clients.consumer_config).
        "FIFOLANE_LIBRDKAFKA": json.dumps(librdkafka),
        "PYTHONPATH": code or str(PROJECT_ROOT),
    })
    if code:  # an older checkout refuses settings it does not know (topic roles added since)
        known = (Path(code) / "fifolane" / "config.py").read_text()
        env = {k: v for k, v in env.items() if not k.startswith("FIFOLANE_") or k[9:].lower() in known}
    return env


def worker_cmd(settings: Settings, worker_id: str, group_id: str, *, guarantee: str,
               concurrency: int = 16, commit_interval: float = 0.25, app: str | None = None,
               listeners: bool = False, python: list[str] | None = None,
               extra: list[str] | None = None) -> list[str]:
    """``python -m services.worker ...`` for one benchmark run (``python`` e.g. adds cProfile;
    ``extra``: more worker arguments)."""
    home = Path(settings.home)
    return [*(python or [sys.executable]), "-m", "services.worker", "--worker-id", worker_id,
            "--group-id", group_id, "--guarantee", guarantee, "--concurrency", str(concurrency),
            "--commit-interval", str(commit_interval), "--state-dir", str(home / "state" / worker_id),
            "--stats-file", str(home / f"{worker_id}.stats.json"),
            "--listeners" if listeners else "--no-listeners",
            *(["--app", app] if app else []), *(extra or [])]


@contextlib.contextmanager
def running(cmd: list[str], log_file: Path, env: dict[str, str] | None = None,
            stop_timeout: float = 60.0) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` (output to ``log_file``); SIGTERM at the end, SIGKILL if it lingers."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        # A child of another checkout (child_env) runs from there: ``-m`` puts the cwd first.
        code = (env or {}).get("PYTHONPATH", "")
        cwd = code if os.path.isdir(code) else PROJECT_ROOT
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(stop_timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Commits:
    """Committed-offset samples of one run: (monotonic time, events committed)."""

    total: int
    samples: list[tuple[float, int]]

    @property
    def first(self) -> tuple[float, int]:
        return next(s for s in self.samples if s[1] > 0)

    @property
    def end(self) -> float:
        return next(t for t, c in self.samples if c >= self.total)

    @property
    def rate(self) -> float:
        """Events per second between the first commit and the commit of the last event."""
        t0, c0 = self.first
        if c0 >= self.total:  # everything landed in the first checkpoint: no interval to time
            return float("nan")
        return (self.total - c0) / (self.end - t0)

    def to_dict(self) -> dict[str, object]:
        t0 = self.samples[0][0] if self.samples else 0.0
        return {"total": self.total, "first_commit": self.first[1], "seconds": self.end - self.first[0],
                "events_per_s": self.rate,
                "samples": [(round(t - t0, 3), c) for t, c in self.samples[:: max(1, len(self.samples) // 200)]]}


def watch_committed(bootstrap: str, group_id: str, topic: str, partitions: int, total: int, *,
                    timeout: float, alive: Callable[[], bool] = lambda: True,
                    on_progress: Callable[[int], None] | None = None,
                    interval: float = 0.02, first_commit_timeout: float = 90.0) -> Commits:
    """Sample the group's committed offsets on ``topic`` until they cover ``total`` events.

    Uses a consumer that never joins the group (``committed()`` only). Raises if the
    system under test exits, commits nothing within ``first_commit_timeout`` (stuck) or
    ``timeout`` passes first.
    """
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id,
                         "enable.auto.commit": False})
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    samples: list[tuple[float, int]] = []
    started = time.monotonic()
    deadline = started + timeout
    try:
        while True:
            try:
                done = sum(max(tp.offset, 0) for tp in consumer.committed(tps, timeout=10))
            except KafkaException as exc:  # coordinator moving or loading: ask again
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{group_id}: committed offsets unavailable: {exc}") from exc
                time.sleep(0.2)
                continue
            now = time.monotonic()
            samples.append((now, done))
            if on_progress is not None:
                on_progress(done)
            if done >= total:
                return Commits(total, samples)
            if not alive():
                raise RuntimeError(f"the process under test exited after committing {done}/{total}")
            if done == 0 and now - started > first_commit_timeout:
                raise TimeoutError(f"{group_id}: nothing committed after {first_commit_timeout:.0f}s")
            if now > deadline:
                raise TimeoutError(f"{group_id}: {done}/{total} committed after {timeout:.0f}s")
            time.sleep(interval)  # a sampling interval under a deadline
    finally:
        consumer.close()
