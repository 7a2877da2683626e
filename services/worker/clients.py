"""The worker's Kafka clients: their settings (on top of Settings.kafka_config) and
:class:`KafkaClients`, which makes them and checks access at start-up."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from fifolane.access import KafkaAccess
from fifolane.config import Settings
from fifolane.errors import ConfigError, WorkerError
from services.worker.group_admin import GroupAdmin
from services.worker.kafka import TxnProducer, WorkerConsumer, map_error
from services.worker.liveness import Heartbeat, check_alone
from services.worker.options import WorkerOptions
from services.worker.tuning import merged_config

if TYPE_CHECKING:
    from services.worker.assignment import Topics

__all__ = ["PRODUCER_BATCHING", "GroupConsumer", "KafkaClients", "commit_done", "consumer_config", "needed_access", "producer_config"]

log = logging.getLogger(__name__)

#: Producer batching of the worker (also used by the benchmarks' plain loops): 20 ms of
#: lingering makes larger produce requests; at 75k records/s that saved the broker (on the
#: same 2 cores) enough work to raise the worker's throughput by ~15% over 5 ms. It adds
#: nothing to the end-to-end latency of a checkpoint, which flushes its records anyway.
PRODUCER_BATCHING: dict[str, int] = {
    "linger.ms": 20,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1 << 20,
}


def commit_done(err: KafkaError | None, partitions: list[TopicPartition]) -> None:
    """The outcome of an offset commit (the worker consumer's ``on_commit``): failures are logged.
    At-least-once only: its events after the last committed offset may be delivered again."""
    failed = [f"{tp.topic}[{tp.partition}]: {tp.error}" for tp in partitions or () if tp.error is not None]
    if err is not None or failed:
        log.warning("an offset commit failed (events after the last committed offsets may be seen "
                    "again): %s", err if err is not None else "; ".join(failed))


class GroupConsumer(WorkerConsumer):
    """The worker's consumer, with at most one offset commit not waited for at a time: the
    next one waits (at-least-once, Checkpoint.commit), so commits never pile up behind a slow
    coordinator. (librdkafka retries a commit that timed out: a retry landing after the next
    commit sets the offset back, and those events are seen again, as at-least-once allows.)"""

    def __init__(self, conf: dict[str, Any], factory: Callable[[dict[str, Any]], Any] = Consumer) -> None:
        self.commits_unanswered = 0
        super().__init__({**conf, "on_commit": self._answered}, factory)

    def _open(self, client: Any) -> None:
        self.commits_unanswered = 0  # a new client (renew): the old one's commits are its own
        super()._open(client)

    def _answered(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        self.commits_unanswered = max(0, self.commits_unanswered - 1)  # (async commits only)
        commit_done(err, partitions)

    def commit(self, offsets: list[TopicPartition], wait: bool = True) -> None:
        wait = wait or self.commits_unanswered > 0
        super().commit(offsets, wait)
        self.commits_unanswered += not wait


def consumer_config(opts: WorkerOptions, group_id: str) -> dict[str, Any]:
    """Manual offsets (committed with the transaction), committed reads, cooperative
    rebalancing; static membership when the worker id is stable.

    ``fetch.queue.backoff.ms``: librdkafka stops fetching for this long (1 s by default)
    whenever its queue holds more than ``queued.min.messages``; one fetch response of small
    events across six partitions is enough to trip it, and the worker then idled most of
    each second (benchmarks/README.md, "the bimodal loop"). 10 ms keeps the queue fed.
    ``fetch.wait.max.ms`` 50: 5 ms halved the at-least-once end-to-end p50 at 2,000
    events/s (43 -> 21 ms), but cost at-least-once throughput a third (0.66-0.71x head to
    head, 15 ms too); users who want the latency set it (a tuning key, benchmarks/README.md).
    """
    return {
        "group.id": group_id,
        "client.id": f"{opts.worker_id}-consumer",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "partition.assignment.strategy": "cooperative-sticky",
        "session.timeout.ms": 10_000,
        "heartbeat.interval.ms": 1_000,
        "max.poll.interval.ms": 300_000,
        "fetch.wait.max.ms": 50,
        "fetch.queue.backoff.ms": 10,
        "on_commit": commit_done,  # at-least-once commits that do not wait (Checkpoint.commit)
        **({"group.instance.id": opts.worker_id} if opts.static_membership else {}),
    }


def producer_config(opts: WorkerOptions, group_id: str) -> dict[str, Any]:
    """Idempotent, acks=all; transactional (id = group + worker id) for exactly-once.

    Keys are partitioned like Java clients do (murmur2), so the entity directory and
    producers in other languages agree on where a key goes. Exactly-once needs no delivery
    reports (a record that cannot be delivered fails the transaction's commit); the
    at-least-once producer reports failures only (services.worker.kafka.TxnProducer).
    A transactional producer's message time-out cannot exceed its transaction time-out.

    ``retry.backoff.ms`` 10 (exactly-once): a transaction's first request to the coordinator
    is refused (``CONCURRENT_TRANSACTIONS``) while the previous commit's markers are still
    written, for a few milliseconds. librdkafka retries ``AddOffsetsToTxn`` after this
    back-off (100 ms by default, growing to ``retry.backoff.max.ms``): a commit that had only
    offsets to send (input that produced nothing, e.g. the directory's own claims read back)
    took ~95 ms instead of ~12 (benchmarks/README.md, "Latency").
    """
    conf: dict[str, Any] = {
        "client.id": f"{opts.worker_id}-producer",
        "enable.idempotence": True,
        "acks": "all",
        "partitioner": "murmur2_random",
        # A topic deleted under the worker (a listener's output, a handler's emit) is refused
        # as unknown after 5 s, not after 30 (librdkafka's default, longer than an exactly-once
        # record's time-out: its records timed out, retriably, for ever; listeners.runtime).
        "topic.metadata.propagation.max.ms": 5000,
        **PRODUCER_BATCHING,
    }
    if opts.guarantee == "exactly-once":
        conf["transactional.id"] = f"{group_id}-{opts.worker_id}"
        conf["transaction.timeout.ms"] = opts.transaction_timeout_ms
        conf["retry.backoff.ms"] = 10
    else:
        # Outlast a leader election (Kafka's own default delivery.timeout.ms is 120 s).
        conf["message.timeout.ms"] = 120_000
    return conf


def needed_access(settings: Settings, topics: Topics, *, registry: bool,
                  parked: bool) -> tuple[list[str], dict[str, tuple[str, ...]]]:
    """The topics whose configs the worker reads at start-up, and the ACL operations it
    needs, by topic (the worker role of docs/security.md): input, state and directory read
    and written, the dead-letter topic written, the registry with listeners (``registry``),
    the parked topic with ``--on-failure park`` (``parked``)."""
    names = [t for t in (topics.input, settings.state_topic, settings.dlq_topic, topics.directory) if t]
    rw = ("READ", "WRITE", "DESCRIBE_CONFIGS")
    need = {**dict.fromkeys(names, rw), settings.dlq_topic: ("WRITE", "DESCRIBE_CONFIGS")}
    if registry:
        need[settings.registry_topic] = ("READ", "WRITE")
    if parked:
        need[settings.parked_topic] = rw
    return names, need


class KafkaClients:
    """How a worker makes its Kafka clients and asks about topics (unit tests pass fakes)."""

    #: How long a topic id read is reused: the restores of one assignment ask together.
    ID_TTL_S = 5.0

    def __init__(self, base: dict[str, Any]) -> None:
        self._base = base  # connection settings (Settings.kafka_config())
        self._ids: dict[str, tuple[str | None, float]] = {}
        self._ids_lock = threading.Lock()

    def consumer(self, conf: dict[str, Any]) -> WorkerConsumer:
        return GroupConsumer(merged_config(self._base, conf))

    def producer(self, conf: dict[str, Any], *, transactional: bool) -> TxnProducer:
        return TxnProducer(merged_config(self._base, conf), transactional=transactional)

    def admin(self) -> GroupAdmin:
        """The group watch's admin (services.worker.orphans), in a child process
        (services.worker.group_admin: librdkafka#4605 aborts the process that asks)."""
        return GroupAdmin(self._base)

    def alive(self, topic: str, group: str, worker_id: str) -> Heartbeat | None:
        """Stop if another live process has this worker id, else start this one's heartbeat
        (services.worker.liveness)."""
        beat = Heartbeat(self._base, topic, group, worker_id)
        beat.start(active=check_alone(self._base, topic, group, worker_id, beat.instance))  # False: not
        return beat  # checked (warned); it beats once the topic is there

    def restore_consumer(self, conf: dict[str, Any]) -> Any:
        """A plain consumer for reading a changelog (confluent-kafka's own)."""
        return Consumer({**self._base, **conf})

    def topic_id(self, topic: str, timeout: float = 5.0) -> str | None:
        """Kafka's id of ``topic`` (None: not known now): a topic deleted and created again
        has a new one, so a restore tells a store built from the earlier topic
        (services.worker.restore ``foreign``). An answer, or the lack of one, is kept for
        :data:`ID_TTL_S`: the restores of one assignment ask together, and a broker that does
        not answer (frozen, restarting) must not hold each of them up in turn."""
        with self._ids_lock:
            hit = self._ids.get(topic)
            if hit is not None and time.monotonic() - hit[1] < self.ID_TTL_S:
                return hit[0]
        found: str | None = None
        access = KafkaAccess(self._base, timeout)
        try:
            futures = access.admin.describe_topics(TopicCollection([topic]), request_timeout=timeout)
            found = str(futures[topic].result(timeout).topic_id)
        except Exception as exc:  # noqa: BLE001 - not known: the restore checks offsets only
            log.info("the id of topic %r not read (%s): its restores check offsets only", topic, exc)
        finally:
            access.close()
        with self._ids_lock:
            self._ids[topic] = (found, time.monotonic())
        return found

    def topic_configs(self, names: list[str], timeout: float = 30.0, *,
                      need: Mapping[str, Collection[str]] | None = None,
                      group: str | None = None) -> dict[str, dict[str, str]]:
        """The configs of these topics; :class:`WorkerError` if Kafka refuses the login, a
        topic is missing, or the principal lacks an operation of ``need`` (topic -> ACL
        operations, e.g. ``READ``) or READ on consumer group ``group``: the message names
        each missing permission, and the worker stops instead of failing later in a loop."""
        access = KafkaAccess(self._base, timeout)
        try:
            return self._topic_configs(access, names, timeout, need or {}, group)
        finally:
            access.close()  # also when refused: a client left to the exit can crash it

    @staticmethod
    def _topic_configs(access: KafkaAccess, names: list[str], timeout: float,
                       need: Mapping[str, Collection[str]], group: str | None) -> dict[str, dict[str, str]]:
        checked = list(dict.fromkeys([*names, *need]))
        try:
            found = access.topics(checked)
            group_ok = group is None or access.group_allows(group, "READ")
        except ConfigError as exc:  # wrong password, bad CA, no broker: say so, once
            raise WorkerError(f"the worker cannot start: {exc}") from exc
        missing = sorted(n for n in checked if not found[n].exists)
        if missing:
            raise WorkerError(f"the worker cannot start: topics missing: {', '.join(missing)}; run "
                              "`fifolane topics create`")
        lacking = [f"{op} on topic {n!r}" for n in checked
                   for op in need.get(n, ()) or ("DESCRIBE",) if not found[n].allows(op)]
        if not group_ok:
            lacking.append(f"READ on consumer group {group!r}")
        if lacking:
            who = access.principal or "this worker's principal"
            grant = (f"fifolane acls apply --role worker --principal {access.principal or 'User:<name>'}"
                     + (f" --group-id {group}" if group else ""))
            raise WorkerError(f"the worker cannot start: {who} lacks {', '.join(lacking)}; grant them "
                              f"(`{grant}`, docs/security.md)")
        found_configs: dict[str, dict[str, str]] = {}
        try:
            futures = access.admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names],
                                             request_timeout=timeout)
            for res, fut in futures.items():
                entries = fut.result(timeout=timeout)
                found_configs[res.name] = {k: v.value for k, v in entries.items() if v.value is not None}
        except (KafkaException, TimeoutError) as exc:  # optional: a frozen broker is no reason to stop
            log.warning("cannot read topic configs (%s): assuming Kafka's defaults",
                        map_error(exc, "describe configs") if isinstance(exc, KafkaException) else "timed out")
        return {n: found_configs.get(n, {}) for n in names}
