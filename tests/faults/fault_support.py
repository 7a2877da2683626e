"""Shared machinery of the fault suite: a paced stream, fault-app workers, the history."""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka_fixtures import consume_all, wait_until
from worker_support import CATALOG, WorkerProcess

from fifolane.config import Settings
from fifolane.errors import TopicConfigError
from fifolane.serde import make_codec
from fifolane.testing import History, ProducedEvent, Report, check_history, expected_effects
from fifolane.testing.records import effects_from, table_from
from fifolane.testing.workload import TrackedProducer, Workload
from fifolane.topics import ensure_topics
from listeners.client import ListenerClient, MaterializedView
from listeners.model import ListenerSpec

__all__ = [
    "ClientFollower", "Stream", "collect_history", "committed_effects", "committed_offsets", "fault_worker", "full_isr",
    "group_coordinator", "group_members", "input_seqs", "lag", "make_topics", "seeded_rng", "table_worker",
    "txn_coordinator", "wait_settled",
]


def seeded_rng(default: int) -> random.Random:
    """The suite's randomness; ``FIFOLANE_FAULTS_SEED`` replays a failing run."""
    seed = int(os.environ.get("FIFOLANE_FAULTS_SEED", default))
    print(f"fault suite seed: {seed}")
    return random.Random(seed)


def fault_worker(settings: Settings, worker_id: str, tmp: Path, effect_topic: str,
                 concurrency: int = 8, listeners: bool = True) -> WorkerProcess:
    """A ``python -m services.worker`` process running ``apps.fault_app`` (listener runtime on,
    as deployed; ``listeners=False`` passes ``--no-listeners``)."""
    # Each test its own consumer group (named after its input topic): static members of an
    # earlier test's group must not hand their old assignment to this test's workers.
    proc = WorkerProcess(settings, worker_id, tmp, app="apps.fault_app:app",
                         extra=["--concurrency", str(concurrency),
                                "--group-id", f"fifolane-fault-{settings.input_topic}",
                                *([] if listeners else ["--no-listeners"])])
    base = proc.env
    extra = {"FAULT_EFFECT_TOPIC": effect_topic, "FAULT_WORKER": worker_id,
             "FIFOLANE_REPLICATION_FACTOR": str(settings.replication_factor)}
    proc.env = lambda: {**base(), **extra}  # type: ignore[method-assign]
    return proc


class Stream:
    """A producer thread sending a workload at a steady rate until stopped or exhausted."""

    def __init__(self, settings: Settings, workload: Workload, rate: float,
                 conf: dict[str, Any] | None = None, burst: int = 0) -> None:
        """``burst``: send the first events unpaced (``Workload(initial=True)`` fills the table)."""
        self.producer = TrackedProducer(settings, make_codec(settings, CATALOG), dict(conf or {}))
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(workload, rate, burst), name="stream",
                                       daemon=True)

    def _run(self, workload: Workload, rate: float, burst: int) -> None:
        try:
            self.producer.run(workload.generate(), rate, self.stop_event, burst)
        except BaseException as exc:  # re-raised by finish()
            self.error = exc

    def start(self) -> Stream:
        self.thread.start()
        return self

    def running(self) -> bool:
        return self.thread.is_alive()

    def finish(self, stop: bool = True, timeout: float = 120.0) -> list[ProducedEvent]:
        """Stop (or let it run out), wait for every outcome, return the produced events."""
        if stop:
            self.stop_event.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the stream did not finish"
        if self.error is not None:
            raise self.error
        return self.producer.outcomes()


class ClientFollower:
    """A :class:`ListenerClient` polled on a thread from the beginning of the output topic,
    applying to a :class:`MaterializedView` (what a user's follower does)."""

    def __init__(self, settings: Settings, spec: ListenerSpec) -> None:
        self.client = ListenerClient(settings, spec.name, from_beginning=True, spec=spec)
        self.view = MaterializedView()
        self.notes: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="listener-client", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop_event.is_set():
                notes = self.client.poll(0.2)
                with self.lock:
                    for note in notes:
                        self.view.apply(note)
                        self.notes.append(note)
        except BaseException as exc:  # re-raised by view()
            self.error = exc

    def view_now(self) -> dict[str, Any]:
        """A copy of the view."""
        if self.error is not None:
            raise self.error
        with self.lock:
            return dict(self.view.data)

    def count(self, registration: str | None = None, snapshot: bool | None = None) -> int:
        """Notifications delivered (of one registration, snapshot ones or not)."""
        with self.lock:
            return sum(1 for n in self.notes
                       if (registration is None or n.get("registration") == registration)
                       and (snapshot is None or bool(n.get("snapshot")) == snapshot))

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the listener client thread did not stop"
        self.client.close()
        if self.error is not None:
            raise self.error


def committed_effects(settings: Settings, effect_topic: str) -> int:
    """How many effect records are committed (duplicates included); -1 while a broker
    fault makes the topic unreadable (a leader moving)."""
    try:
        return len(consume_all(settings, effect_topic))
    except KafkaException as exc:
        print(f"reading {effect_topic}: {exc}")
        return -1


def wait_settled(settings: Settings, effect_topic: str, produced: list[ProducedEvent],
                 timeout: float, describe: Callable[[], str] = lambda: "") -> bool:
    """Wait until every required effect is committed; False (not raising) on timeout."""
    need = {k for k, v in expected_effects(produced).items() if v == "required"}
    last: list[int] = [0]

    def done() -> bool:
        seen = {(e.group, e.seq) for e in effects_from(consume_all(settings, effect_topic))}
        last[0] = len(need & seen)
        return need <= seen

    try:
        wait_until(done, timeout=timeout, interval=0.5,
                   message=lambda: f"{last[0]} of {len(need)} required effects; {describe()}")
    except AssertionError as exc:
        print(exc)
        return False
    return True


def collect_history(settings: Settings, effect_topic: str | None,
                    produced: list[ProducedEvent]) -> tuple[History, Report]:
    """Read the committed effects and state topic and check them against ``produced``."""
    codec = make_codec(settings, CATALOG)
    effects = effects_from(consume_all(settings, effect_topic)) if effect_topic else None
    table = table_from(consume_all(settings, settings.state_topic), codec)
    history = History(produced, effects, table, compare_values=True)
    report = check_history(history)
    print(report.summary())
    return history, report


def input_seqs(settings: Settings) -> set[tuple[str, int]]:
    """``(group, seq)`` of every record on the input topic."""
    out = set()
    for m in consume_all(settings, settings.input_topic, isolation="read_uncommitted"):
        seq = dict(m.headers() or ()).get("test.seq")
        if seq is not None:
            out.add(((m.key() or b"").decode(), int(seq)))
    return out


# --- cluster-side helpers (3-node tests) -------------------------------------------------------
def make_topics(settings: Settings) -> None:
    """ensure_topics, retried: on 3 brokers describing a just-created topic may fail."""
    def attempt() -> bool:
        try:
            ensure_topics(settings)
        except TopicConfigError as exc:
            print(f"ensure_topics: {exc}")
            return False
        return True

    wait_until(attempt, timeout=30, interval=0.5, message="role topics on the 3-node cluster")


def table_worker(settings: Settings, worker_id: str, tmp: Path, group_id: str,
                 listeners: bool = True, extra: list[str] | None = None, static: bool = True) -> WorkerProcess:
    """A ``python -m services.worker`` process with the built-in table handler (what
    ``fifolane worker`` runs without ``--app``), in consumer group ``group_id``;
    ``static=False`` gives it no ``--worker-id`` (dynamic membership)."""
    return WorkerProcess(settings, worker_id, tmp, static=static,
                         extra=["--group-id", group_id, *([] if listeners else ["--no-listeners"]),
                                *(extra or [])])


def _java_hash(text: str) -> int:
    """Java's ``String.hashCode`` (Kafka places coordinators by it)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def _coordinator(settings: Settings, internal: str, key: str) -> int:
    """The leader of ``key``'s partition of an internal topic (``abs(hashCode) % partitions``,
    as Kafka places transaction and group coordinators); -1 while not known."""
    try:
        md = AdminClient(settings.kafka_config()).list_topics(internal, timeout=10)
    except KafkaException as exc:
        print(f"metadata of {internal}: {exc}")
        return -1
    topic = md.topics.get(internal)
    if topic is None or topic.error is not None or not topic.partitions:
        return -1
    h = _java_hash(key)
    return int(topic.partitions[0 if h == -(1 << 31) else abs(h) % len(topic.partitions)].leader)


def txn_coordinator(settings: Settings, transactional_id: str) -> int:
    """The broker hosting the transaction coordinator of ``transactional_id`` (-1: not known;
    ``__transaction_state`` exists once a transactional producer started)."""
    return _coordinator(settings, "__transaction_state", transactional_id)


def group_coordinator(settings: Settings, group_id: str) -> int:
    """The broker hosting the group coordinator of ``group_id`` (-1: not known now). Asking
    for the group's offsets first makes Kafka create ``__consumer_offsets`` if needed."""
    committed_offsets(settings, group_id)
    return _coordinator(settings, "__consumer_offsets", group_id)


def group_members(settings: Settings, group_id: str) -> set[str] | None:
    """Client ids of the group's members (``<worker id>-consumer``); None while unknown."""
    admin = AdminClient(settings.kafka_config())  # kept referenced until the future is done
    fut = admin.describe_consumer_groups([group_id], request_timeout=10)[group_id]
    try:
        return {m.client_id for m in fut.result(timeout=15).members}
    except (KafkaException, TimeoutError) as exc:
        print(f"members of {group_id}: {exc!r}")
        return None


def full_isr(settings: Settings) -> bool:
    """Whether every partition of every topic (internal ones too) has all replicas in sync:
    the cluster can lose any one broker again."""
    try:
        md = AdminClient(settings.kafka_config()).list_topics(timeout=10)
    except KafkaException as exc:
        print(f"list_topics: {exc}")
        return False
    return all(p.leader >= 0 and len(p.isrs) == len(p.replicas)
               for t in md.topics.values() for p in t.partitions.values())


def committed_offsets(settings: Settings, group_id: str) -> dict[int, int]:
    """The group's committed offsets of the input topic (-1: none); {} while unreadable."""
    consumer = Consumer(settings.kafka_config(**{"group.id": group_id, "enable.auto.commit": False}))
    try:
        tps = [TopicPartition(settings.input_topic, p) for p in range(settings.partitions)]
        return {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
    except KafkaException as exc:
        print(f"committed offsets of {group_id}: {exc}")
        return {}
    finally:
        consumer.close()


def lag(settings: Settings, group_id: str) -> int | None:
    """Records of the input topic not yet committed by the group (None while unreadable)."""
    committed = committed_offsets(settings, group_id)
    if not committed:
        return None
    consumer = Consumer(settings.kafka_config(**{"group.id": group_id, "enable.auto.commit": False}))
    try:
        total = 0
        for p, off in committed.items():
            _low, high = consumer.get_watermark_offsets(TopicPartition(settings.input_topic, p), timeout=10)
            total += high - max(off, 0)
        return total
    except KafkaException as exc:
        print(f"watermarks of {settings.input_topic}: {exc}")
        return None
    finally:
        consumer.close()
