"""Replication by default on a 3-broker cluster: topics get the brokers' default.replication.factor
(3 here, not 1), so `fifolane produce` rides out the SIGKILL of a partition leader."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient
from kafka_fixtures import consume_all, make_settings

from fifolane.cli import cli
from fifolane.config import Settings
from fifolane.produce import EventProducer
from fifolane.topics import ROLES, create_topic, describe_topics, ensure_topics

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(kafka_cluster3: Any) -> Iterator[Any]:
    """The 3-node cluster; every broker is running again after the test."""
    yield kafka_cluster3
    for i, broker in enumerate(kafka_cluster3.status().brokers):
        if not broker.alive:
            kafka_cluster3.start_broker(i)


@pytest.fixture
def default_settings(cluster: Any, tmp_path: Path) -> Settings:
    """Settings for the 3-node cluster with no replication factor given (the default)."""
    return make_settings(cluster.bootstrap_servers, home=tmp_path / "home")


def test_topics_create_defaults_to_the_brokers_replication(default_settings: Settings) -> None:
    s = default_settings
    env = {"FIFOLANE_BOOTSTRAP_SERVERS": s.resolved_bootstrap(), "FIFOLANE_HOME": str(s.home),
           **{f"FIFOLANE_{role.upper()}_TOPIC": getattr(s, f"{role}_topic")
              for role in ROLES}}
    result = CliRunner().invoke(cli, ["topics", "create", "--partitions", "2"], env=env)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == len(ROLES)
    assert all(line.endswith("replication 3 (the brokers' default.replication.factor))") for line in lines)
    assert {role: state.replication_factor for role, state in describe_topics(s).items() if state} == {
        role: 3 for role in ROLES}
    # Other topics fifolane creates (listener outputs) follow the same setting.
    create_topic(s, s.input_topic + ".out", 1)
    md = AdminClient(s.kafka_config()).list_topics(s.input_topic + ".out", timeout=10)
    assert len(md.topics[s.input_topic + ".out"].partitions[0].replicas) == 3


def test_produce_survives_the_kill_of_a_partition_leader(cluster: Any, default_settings: Settings) -> None:
    s = default_settings
    ensure_topics(s, partitions=1)
    admin = AdminClient(s.kafka_config())

    def leader() -> int:
        return int(admin.list_topics(s.input_topic, timeout=10).topics[s.input_topic].partitions[0].leader)

    old = leader()
    record = {"reservation_id": "R-0", "flight_number": "LX1", "customer_id": "C-1", "seats": 1,
              "amount": 1.0, "state": "NEW"}
    with EventProducer(s, source="failover") as producer:
        for v in range(100):
            producer.send("reservation", {**record, "version": v})
        assert producer.flush() == 0
        cluster.kill_broker(old)  # SIGKILL: the partition's leader is gone mid-stream
        for v in range(100, 300):  # sent while the producer still knows the dead leader
            producer.send("reservation", {**record, "version": v})
        assert producer.flush() == 0
        assert producer.delivery_errors == [] and producer.delivered == 300
    assert leader() not in (old, -1)
    seqs = sorted(int(dict(m.headers())["fifolane.seq"]) for m in consume_all(s, s.input_topic))
    assert seqs == list(range(300))
