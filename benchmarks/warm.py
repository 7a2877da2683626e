"""Warm-start timing shared by the suites that burst a fixed set of events at a running
process (``slow``, ``stages``): the process first joins its consumer group on an empty
input topic, then the pre-encoded events are produced in one burst, and the time runs from
the first produce to the offset commit covering the last event (start-up excluded: the
process's, and the benchmark producer's own connection and producer id)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

from benchmarks.events import produce_raw, ready_producer
from benchmarks.harness import Bench
from benchmarks.procs import log_tail, running, watch_committed
from fifolane.config import Settings

__all__ = ["timed_burst", "wait_joined"]


def wait_joined(bootstrap: str, group: str, alive: Callable[[], bool], timeout: float = 60.0) -> None:
    """Wait until ``group`` is stable with partitions assigned (RuntimeError if the process
    exits first, TimeoutError after ``timeout``)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{group}: process exited before joining")
        try:
            desc = admin.describe_consumer_groups([group])[group].result(10)
        except (KafkaException, TimeoutError):  # coordinator not there yet, or a slow answer: ask again
            time.sleep(0.2)
            continue
        if desc.state == ConsumerGroupState.STABLE and any(
                m.assignment.topic_partitions for m in desc.members):
            time.sleep(0.5)  # let the on-assign work (restore of an empty store) finish
            return
        time.sleep(0.1)  # poll interval under a deadline
    raise TimeoutError(f"{group} did not join within {timeout:.0f}s")


def timed_burst(bench: Bench, settings: Settings, cmd: list[str], group: str,
                values: list[tuple[bytes, bytes]], env: dict[str, str] | None, label: str,
                suite: str) -> dict[str, Any]:
    """Run ``cmd``, wait for it to join, burst ``values`` (key, value) at its input topic and
    time until its group commits past the last one: ``{"seconds", "events"}``."""
    log = settings.home / f"{group}.log"
    bench.step(f"{suite}: {label}", len(values))
    with running(cmd, log, env=env) as proc:
        alive = lambda: proc.poll() is None  # noqa: E731
        try:
            wait_joined(bench.bootstrap, group, alive)
            producer = ready_producer(settings, settings.input_topic)
            t0 = time.monotonic()
            produce_raw(settings, settings.input_topic, ((k, v, None) for k, v in values), producer=producer)
            commits = watch_committed(bench.bootstrap, group, settings.input_topic, 1, len(values),
                                      timeout=60 + len(values) * 0.01, alive=alive,
                                      on_progress=bench.advance)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{exc}\nlog {log}:\n{log_tail(log)}") from exc
    return {"seconds": commits.end - t0, "events": len(values)}
