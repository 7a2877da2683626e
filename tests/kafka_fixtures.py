"""Test helpers around one real Apache Kafka: where it comes from, deadline waits, reading topics.

Where the session's Kafka comes from (first that applies):

1. ``FIFOLANE_TEST_BOOTSTRAP=host:port``: an existing cluster; nothing is started or stopped.
2. A Docker engine answers (``docker info``): testcontainers' Kafka module with ``apache/kafka``.
3. Otherwise :class:`fifolane.cluster.LocalCluster` from the jar cache, in its own home under
   ``.fifolane/test-kafka/<pytest pid>`` on free ports, stopped at session end.
   ``FIFOLANE_TEST_BROKERS=3`` makes that cluster 3 nodes.

Tests import the helpers directly: ``from kafka_fixtures import wait_until, consume_all``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Message

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.readers import read_to_end

__all__ = [
    "SessionKafka",
    "TEST_HOMES",
    "consume_all",
    "make_settings",
    "start_local_cluster",
    "start_session_kafka",
    "wait_until",
]

T = TypeVar("T")
#: Homes of the clusters tests start: one directory per pytest process (concurrent sessions
#: of several developers must not share brokers), sharing the jar cache of the default home.
TEST_HOMES = PROJECT_ROOT / ".fifolane" / "test-kafka"
SHARED_LIBS = PROJECT_ROOT / ".fifolane" / "kafka" / "libs"
KAFKA_IMAGE = "apache/kafka:4.1.1"


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy (returned) or ``timeout`` passes.

    On timeout raises ``AssertionError`` with ``message`` (a string, or a callable evaluated
    then, so it can describe the state that was reached).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for: {text}")
        time.sleep(interval)  # the one sanctioned sleep: a poll interval under a deadline


def make_settings(bootstrap: str, home: Path | None = None, **overrides: Any) -> Settings:
    """Settings for one test: its own uuid-suffixed topic for every role, 3 partitions."""
    suffix = uuid.uuid4().hex[:10]
    values: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "input_topic": f"test.events.{suffix}",
        "state_topic": f"test.state.{suffix}",
        "registry_topic": f"test.listeners.{suffix}",
        "dlq_topic": f"test.dlq.{suffix}",
        "listener_output_topic": f"test.notifications.{suffix}",
        "directory_topic": f"test.directory.{suffix}",
        "parked_topic": f"test.parked.{suffix}",
        "members_topic": f"test.members.{suffix}",
        "partitions": 3,
    }
    if home is not None:
        values["home"] = home
    values.update(overrides)
    return Settings(**values)


def consume_all(
    source: Settings | dict[str, Any],
    topic: str,
    isolation: str = "read_committed",
    timeout: float = 30.0,
) -> list[Message]:
    """Every record of ``topic`` from the beginning to its end offsets (as of the call).

    :func:`fifolane.readers.read_to_end`, after waiting (within ``timeout``) for transactions
    open at the call to be decided (tests read right after workers commit). The wait is made
    here: ``read_to_end`` takes its ends from a read_committed consumer, which is told the
    last stable offset, so it stops before a transaction whose commit markers are still
    being written and misses its records (seen as lost outputs under load).
    """
    if isolation == "read_committed":
        _wait_decided(source, topic, timeout)
    return read_to_end(source, topic, isolation=isolation, timeout=timeout, wait_open_transactions=True)


def _wait_decided(source: Settings | dict[str, Any], topic: str, timeout: float) -> None:
    """Wait until each partition's last stable offset reaches its log end as of now."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    base = source.kafka_config() if isinstance(source, Settings) else dict(source)
    made = {iso: Consumer({**base, "group.id": f"test-ends-{uuid.uuid4().hex[:8]}", "isolation.level": iso})
            for iso in ("read_uncommitted", "read_committed")}
    try:
        meta = made["read_committed"].list_topics(topic, timeout=timeout).topics.get(topic)
        if meta is None or meta.error is not None:
            return  # read_to_end reports a missing topic
        tps = [TopicPartition(topic, p) for p in meta.partitions]
        ends = {tp.partition: made["read_uncommitted"].get_watermark_offsets(tp, timeout=timeout)[1] for tp in tps}
        deadline = time.monotonic() + timeout
        while True:
            stable = {tp.partition: made["read_committed"].get_watermark_offsets(tp, timeout=timeout)[1] for tp in tps}
            if all(stable[p] >= end for p, end in ends.items()) or time.monotonic() > deadline:
                return
            time.sleep(0.05)  # polling the broker under a deadline
    except KafkaException as exc:  # read_to_end raises what matters
        print(f"waiting for open transactions of {topic}: {exc}")
    finally:
        for consumer in made.values():
            consumer.close()


# --- where the session's Kafka comes from ------------------------------------------------
@dataclass
class SessionKafka:
    """A running Kafka for tests and how to stop it (a no-op for external clusters)."""

    bootstrap: str
    origin: str
    stop: Callable[[], None] = field(default=lambda: None)
    cluster: Any = None  # the LocalCluster, when one was started (fault tests kill brokers)


def _docker_available() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=15, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _start_testcontainer() -> SessionKafka | None:
    try:  # not a dependency: only used where Docker exists
        from testcontainers.kafka import KafkaContainer
    except ImportError:
        return None
    container = KafkaContainer(KAFKA_IMAGE).with_kraft()
    container.start()
    return SessionKafka(container.get_bootstrap_server(), f"testcontainers {KAFKA_IMAGE}", container.stop)


def _reap_stale_homes() -> None:
    """Stop clusters left behind by pytest processes that died without their teardown."""
    from fifolane.cluster import LocalCluster

    if not TEST_HOMES.is_dir():
        return
    for home in TEST_HOMES.iterdir():
        owner = home.name.split("-")[0]
        if not owner.isdigit() or Path(f"/proc/{owner}").exists():
            continue
        LocalCluster(home).down(timeout=5)
        shutil.rmtree(home, ignore_errors=True)


def start_local_cluster(brokers: int = 1, tag: str = "") -> SessionKafka:
    """A LocalCluster on free ports in this process's own test home."""
    from fifolane.cluster import LocalCluster

    _reap_stale_homes()
    home = TEST_HOMES / f"{os.getpid()}{tag}"
    cluster = LocalCluster(home, brokers, libs=SHARED_LIBS)
    cluster.up(timeout=120, fresh=True)

    def stop() -> None:
        cluster.down(timeout=15)
        shutil.rmtree(home, ignore_errors=True)

    return SessionKafka(cluster.bootstrap_servers, f"local Kafka ({brokers} node(s)) in {home}", stop, cluster)


def start_session_kafka() -> SessionKafka:
    """The session's Kafka: env cluster, else testcontainers, else a LocalCluster."""
    external = os.environ.get("FIFOLANE_TEST_BOOTSTRAP")
    if external:
        return SessionKafka(external, "FIFOLANE_TEST_BOOTSTRAP")
    if _docker_available():
        started = _start_testcontainer()
        if started is not None:
            return started
    return start_local_cluster(int(os.environ.get("FIFOLANE_TEST_BROKERS", "1")))
