"""Fake Kafka clients for worker unit tests (services.worker.clients.KafkaClients' interface).

No broker: the consumer hands out the batches a test queues, the producer records what is
produced and can be told to fail, and restores find empty changelogs. End-to-end behaviour
against real Kafka is tested in tests/integration and tests/faults.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fifolane.errors import KafkaClientError
from services.worker.clients import KafkaClients
from services.worker.kafka import DeliveryReport

__all__ = ["FakeClients", "FakeConsumer", "FakeMsg", "FakeProducer"]


class FakeMsg:
    """The part of a confluent-kafka Message the worker reads."""

    def __init__(self, partition: int, offset: int, key: bytes | None, value: bytes | None,
                 headers: list[tuple[str, bytes]] | None = None, topic: str = "in") -> None:
        self._p, self._o, self._k, self._v, self._h, self._t = partition, offset, key, value, headers, topic

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return self._t

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._h

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self._o)


class FakeProducer:
    """Records ``(topic, value, key, partition, headers)``; ``fail`` makes the next produce raise."""

    def __init__(self) -> None:
        self.records: list[tuple[str, Any, Any, int, list[Any]]] = []
        self.transactions = 0
        self.commits = 0
        self.aborts = 0
        self.offsets: list[Any] = []
        self.metadata: list[dict[tuple[str, int], str]] = []
        self.fail: KafkaClientError | None = None
        self.report = DeliveryReport()
        self.renewals = 0
        self.queue_full = 0
        #: As librdkafka: a transactional producer refuses records outside a transaction
        #: (set by FakeClients for an exactly-once worker).
        self.transactional = False
        self.in_txn = False
        self.full = 0
        self.closed = 0  # close() calls (FakeClients.producer() opens it again)

    def produce(self, topic: str, value: Any = None, key: Any = None, partition: int = -1,
                headers: Any = None, *, full: bool = False) -> None:
        self.queue_full += full
        if self.closed:
            raise RuntimeError("Producer has been closed")  # as confluent-kafka's
        if self.fail is not None:
            exc, self.fail = self.fail, None
            raise exc
        if self.transactional and not self.in_txn:
            raise KafkaClientError("produce: Erroneous state (no transaction begun)", code="_STATE")
        self.records.append((topic, value, key, partition, list(headers or [])))

    def send(self, topic: str, value: Any = None, key: Any = None, partition: int = -1,
             headers: Any = None) -> None:
        """The client's own produce: refuses while ``full`` (a full local queue), as
        librdkafka's does with BufferError; ``produce`` then waits for room."""
        if self.full:
            self.full -= 1
            raise BufferError("Local: Queue full")
        self.produce(topic, value, key, partition, headers)

    def init(self, timeout: float = 60.0) -> None:
        pass

    def begin(self) -> None:
        self.transactions += 1
        self.in_txn = True

    def send_offsets(self, offsets: Any, group_metadata: Any, timeout: float) -> None:
        self.offsets.append(sorted((tp.topic, tp.partition, tp.offset) for tp in offsets))
        self.metadata.append({(tp.topic, tp.partition): tp.metadata for tp in offsets if tp.metadata})

    def commit(self, timeout: float) -> None:
        self.commits += 1
        self.in_txn = False

    def abort(self, timeout: float) -> None:
        self.aborts += 1
        self.in_txn = False

    def flush(self, timeout: float) -> int:
        return 0

    def close(self, flush: float = 0.0) -> None:
        self.closed += 1

    def renew(self) -> None:
        self.renewals += 1
        self.in_txn = False

    def report_each(self, on: bool) -> None:
        pass

    def poll(self, timeout: float = 0.0) -> None:
        pass


class FakeConsumer:
    """Hands out queued batches; records seeks, pauses and resumes."""

    def __init__(self, committed: dict[tuple[str, int], int | None]) -> None:
        self.batches: list[list[FakeMsg]] = []
        self.seeks: list[tuple[str, int, int]] = []
        self.paused: set[tuple[str, int]] = set()
        self.offsets = committed
        self.metadata: dict[tuple[str, int], str | None] = {}
        self.callbacks: dict[str, Callable[..., None]] = {}
        self.renewals = 0  # renew() calls: a new client joins the group (callbacks stay)
        self.commits: list[tuple[list[tuple[str, int, int]], bool]] = []  # (offsets, waited for)

    def renew(self) -> None:
        self.renewals += 1

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.callbacks = callbacks

    def consume(self, n: int, timeout: float = 0) -> list[FakeMsg]:
        return self.batches.pop(0) if self.batches else []

    def poll(self, timeout: float) -> None:
        return None

    def group_metadata(self) -> object:
        return object()

    def committed(self, partitions: list[Any], timeout: float) -> dict[tuple[str, int], tuple[int | None, str | None]]:
        """Offsets as set in ``offsets`` (and ``metadata``), or what was last committed."""
        return {(tp.topic, tp.partition): (self.offsets.get((tp.topic, tp.partition)),
                                           self.metadata.get((tp.topic, tp.partition)))
                for tp in partitions}

    def commit(self, offsets: list[Any], wait: bool = True) -> None:
        self.commits.append(([(tp.topic, tp.partition, tp.offset) for tp in offsets], wait))

    def seek(self, tp: Any) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))

    def assign_more(self, partitions: list[Any]) -> None:
        pass

    def unassign_some(self, partitions: list[Any]) -> None:
        pass

    def partition_count(self, topic: str, timeout: float) -> int | None:
        return 0  # a worker takes no directory partitions here

    def pause(self, partitions: list[Any]) -> None:
        self.paused |= {(tp.topic, tp.partition) for tp in partitions}

    def resume(self, partitions: list[Any]) -> None:
        self.paused -= {(tp.topic, tp.partition) for tp in partitions}

    def watermarks(self, tp: Any, timeout: float | None = None, cached: bool = False) -> tuple[int, int]:
        return 0, 0

    def position(self, tp: Any) -> int:
        return 0

    def close(self) -> None:
        pass


class _EmptyChangelog:
    """A restore consumer over an empty changelog."""

    def get_watermark_offsets(self, tp: Any, timeout: float | None = None) -> tuple[int, int]:
        return 0, 0

    def close(self) -> None:
        pass


class FakeClients(KafkaClients):
    """What a worker unit test passes as ``Worker(..., clients=...)``."""

    def __init__(self, committed: dict[tuple[str, int], int | None] | None = None) -> None:
        super().__init__({})
        self.fake_consumer = FakeConsumer(committed or {})
        self.fake_producer = FakeProducer()
        self.topic_ids: dict[str, str] = {}  # none known: restores check offsets only

    def consumer(self, conf: dict[str, Any]) -> Any:
        return self.fake_consumer

    def producer(self, conf: dict[str, Any], *, transactional: bool) -> Any:
        self.fake_producer.transactional = transactional
        self.fake_producer.closed = 0
        return self.fake_producer

    def restore_consumer(self, conf: dict[str, Any]) -> Any:
        return _EmptyChangelog()

    def alive(self, topic: str, group: str, worker_id: str) -> None:
        return None  # no heartbeat (services.worker.liveness needs a broker)

    def topic_id(self, topic: str, timeout: float = 10.0) -> str | None:
        return self.topic_ids.get(topic)

    def topic_configs(self, names: list[str], timeout: float = 30.0, **_access: Any) -> dict[str, dict[str, str]]:
        return {n: {} for n in names}
