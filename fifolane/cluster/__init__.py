"""The local Apache Kafka cluster behind ``fifolane kafka up`` (real Kafka 4.1, KRaft, JVM processes)."""

from __future__ import annotations

from fifolane.cluster.jars import KAFKA_VERSION, ensure_jars
from fifolane.cluster.local import BrokerStatus, ClusterStatus, LocalCluster
from fifolane.cluster.ports import free_port

__all__ = ["KAFKA_VERSION", "BrokerStatus", "ClusterStatus", "LocalCluster", "ensure_jars", "free_port"]
