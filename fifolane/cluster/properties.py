"""The files a local Kafka node runs from: ``server.properties`` and a log4j2 configuration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NodePorts", "log4j2_properties", "server_properties"]


@dataclass(frozen=True)
class NodePorts:
    """The two listeners of one combined (broker + controller) node."""

    broker: int
    controller: int


def server_properties(node_id: int, ports: list[NodePorts], data_dir: Path,
                      security: Mapping[str, str] | None = None) -> str:
    """``server.properties`` for node ``node_id`` (0-based) of a combined-mode KRaft cluster.

    ``security`` (from :meth:`fifolane.cluster.secure.SecureFiles.broker_properties`) makes
    the client listener ``CLIENT`` (SASL_SSL) instead of ``PLAINTEXT`` and adds TLS, SASL and
    the authorizer; without it every listener is plaintext and open.

    Replication settings follow the cluster size: with 3 or more nodes, topics get 3 replicas
    and need 2 in sync (so one broker may die without losing acknowledged writes); with fewer,
    everything is 1 so a single broker can serve transactions and consumer groups.
    """
    n = len(ports)
    rf = 3 if n >= 3 else 1
    min_isr = 2 if n >= 3 else 1
    me = ports[node_id]
    voters = ",".join(f"{i}@127.0.0.1:{p.controller}" for i, p in enumerate(ports))
    client = "CLIENT" if security is not None else "PLAINTEXT"
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        # A static quorum: the voter set is fixed by the config, so formatting needs no
        # --standalone/--initial-controllers and every node is formatted the same way.
        "controller.quorum.voters": voters,
        "listeners": f"{client}://127.0.0.1:{me.broker},CONTROLLER://127.0.0.1:{me.controller}",
        "advertised.listeners": f"{client}://127.0.0.1:{me.broker}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "default.replication.factor": str(rf),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(rf),
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        # Tests and demos want a consumer group to start consuming at once, not after 3 s.
        "group.initial.rebalance.delay.ms": "0",
        # Quick compaction, so compaction tests finish in seconds (topics still choose their
        # own segment.ms / min.cleanable.dirty.ratio).
        "log.cleaner.backoff.ms": "500",
        "log.retention.check.interval.ms": "5000",
        # Fault tests kill a leader: fence a dead broker after 3 s instead of 9 s.
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        # Small machine: fewer threads than the defaults sized for servers.
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
    }
    props.update(security or {})
    return "".join(f"{key}={value}\n" for key, value in props.items())


def log4j2_properties(log_file: Path) -> str:
    """A log4j2 configuration that writes the node's log to ``log_file`` (rolled at 50 MB)."""
    return f"""\
status = warn
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.filePattern = {log_file}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 2
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
# The request logger and the state-change logger are very chatty at INFO/TRACE.
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
"""
