"""Shared fixtures: one session-wide real Apache Kafka, per-test topics and clients.

Kafka starts only when a test asks for it (``kafka_bootstrap`` or anything built on it), so
unit tests start no processes. See :mod:`kafka_fixtures` for where the cluster comes from.

Fixtures:
    kafka_bootstrap   (session)  bootstrap servers of the session's Kafka
    kafka_cluster3    (session)  a separate 3-node LocalCluster (fault tests: kill_broker/start_broker)
    settings          Settings with uuid-suffixed topics for every role, home in tmp_path
    settings3         the same against kafka_cluster3, replication factor 3
    topics            ensure_topics(settings): the role topics created, by role
    admin             an AdminClient for settings
    producer_factory  make Producers (flushed at teardown)
    consumer_factory  make Consumers with a uuid group (closed at teardown)

With ``FIFOLANE_FAIL_ON_SKIP=1`` the session fails if a test marked integration, spark or
faults was skipped (CI must not pass by skipping the tests that need Kafka or Spark).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from kafka_fixtures import SessionKafka, make_settings, start_local_cluster, start_session_kafka

from fifolane.config import Settings

_GUARDED_MARKERS = ("integration", "spark", "faults")
_KAFKA_FIXTURES = {"kafka_bootstrap", "kafka_cluster3", "settings", "settings3", "topics", "admin",
                   "producer_factory", "consumer_factory"}
_skipped_guarded: list[str] = []


# --- markers and the fail-on-skip guard ------------------------------------------------
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses a Kafka fixture is an integration test, marked or not."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if names & _KAFKA_FIXTURES and not any(item.get_closest_marker(m) for m in _GUARDED_MARKERS):
            item.add_marker(pytest.mark.integration)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        marks = [m for m in _GUARDED_MARKERS if m in report.keywords]
        if marks:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            _skipped_guarded.append(f"{report.nodeid} [{','.join(marks)}]: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get("FIFOLANE_FAIL_ON_SKIP") == "1" and _skipped_guarded:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if os.environ.get("FIFOLANE_FAIL_ON_SKIP") == "1" and _skipped_guarded:
        terminalreporter.section("FIFOLANE_FAIL_ON_SKIP: guarded tests were skipped", red=True)
        for line in _skipped_guarded:
            terminalreporter.write_line(line)


# --- Kafka -------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def session_kafka() -> Iterator[SessionKafka]:
    """The session's Kafka (started on first use, stopped at session end)."""
    kafka = start_session_kafka()
    try:
        yield kafka
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(session_kafka: SessionKafka) -> str:
    """Bootstrap servers of the session's Kafka."""
    return session_kafka.bootstrap


@pytest.fixture(scope="session")
def kafka_cluster3() -> Iterator[Any]:
    """A 3-node LocalCluster of its own (RF 3, min ISR 2), for tests that kill brokers.

    Always local processes (kill_broker/start_broker need them), even when
    FIFOLANE_TEST_BOOTSTRAP names another cluster.
    """
    kafka = start_local_cluster(3, tag="-3")
    try:
        yield kafka.cluster
    finally:
        kafka.stop()


@pytest.fixture
def settings(kafka_bootstrap: str, tmp_path: Path) -> Settings:
    """Settings with this test's own topics (uuid-suffixed) and home."""
    return make_settings(kafka_bootstrap, home=tmp_path / "home")


@pytest.fixture
def settings3(kafka_cluster3: Any, tmp_path: Path) -> Settings:
    """Settings against the 3-node cluster, replication factor 3."""
    return make_settings(kafka_cluster3.bootstrap_servers, home=tmp_path / "home3", replication_factor=3)


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """``settings`` as the environment of CLI commands run in this process (click's CliRunner)."""
    for k, v in {"FIFOLANE_BOOTSTRAP_SERVERS": settings.resolved_bootstrap(),
                 "FIFOLANE_INPUT_TOPIC": settings.input_topic,
                 "FIFOLANE_REGISTRY_TOPIC": settings.registry_topic,
                 "FIFOLANE_LISTENER_OUTPUT_TOPIC": settings.listener_output_topic}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    return settings


@pytest.fixture
def topics(settings: Settings) -> dict[str, Any]:
    """The role topics of ``settings``, created; by role name (input, state, registry, dlq, listener_output)."""
    from fifolane.topics import ensure_topics

    return ensure_topics(settings)


@pytest.fixture
def admin(settings: Settings) -> AdminClient:
    """An AdminClient for the test's cluster."""
    return AdminClient(settings.kafka_config())


@pytest.fixture
def producer_factory(settings: Settings) -> Iterator[Callable[..., Producer]]:
    """``producer_factory(conf=None, **overrides)`` -> Producer; each flushed at teardown.

    ``overrides`` use underscores for dots (``transactional_id="t1"``); ``conf`` takes dotted keys.
    """
    made: list[Producer] = []

    def make(conf: dict[str, Any] | None = None, **overrides: Any) -> Producer:
        merged = {k.replace("_", "."): v for k, v in overrides.items()}
        merged.update(conf or {})
        producer = Producer(settings.kafka_config(**merged))
        made.append(producer)
        return producer

    yield make
    for producer in made:
        producer.flush(10)


@pytest.fixture
def consumer_factory(settings: Settings) -> Iterator[Callable[..., Consumer]]:
    """``consumer_factory(group_id=None, **librdkafka_overrides)`` -> Consumer; closed at teardown.

    Defaults: a uuid group, ``auto.offset.reset=earliest``, ``isolation.level=read_committed``.
    Overrides may use dotted keys via a dict: ``consumer_factory(conf={"max.poll.interval.ms": 10000})``.
    """
    made: list[Consumer] = []

    def make(group_id: str | None = None, conf: dict[str, Any] | None = None, **overrides: Any) -> Consumer:
        base: dict[str, Any] = {
            "group.id": group_id or f"test-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
        base.update({k.replace("_", "."): v for k, v in overrides.items()})
        base.update(conf or {})
        consumer = Consumer(settings.kafka_config(**base))
        made.append(consumer)
        return consumer

    yield make
    for consumer in made:
        with contextlib.suppress(RuntimeError):  # already closed by the test
            consumer.close()
