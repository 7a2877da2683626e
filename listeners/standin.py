"""Stand-ins for running a :class:`listeners.runtime.ListenerRuntime` without Kafka.

:class:`StandInContext` is a sink context (services.worker.sink.SinkContext) whose
``produce`` records (or only counts) what is sent, over committed rows kept in a dict;
:class:`QuietRegistry` is a registry follower that is always caught up and never reads
anything (records are applied with ``ListenerRuntime.apply_records``). For unit tests and
``python -m benchmarks.listener_cpu``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fifolane.errors import KafkaClientError, RecordRefusedError
from fifolane.serde.entity import EntityType
from services.worker.sink import Row

__all__ = ["QuietRegistry", "StandInContext"]


@dataclass
class StandInContext:
    """A sink context over a codec; ``keep=False`` only counts what is sent."""

    codec: Any
    keep: bool = True
    worker_id: str = "standin"
    room_bytes: int = 1_000_000
    sent: list[tuple[str, Any, Any, int]] = field(default_factory=list)
    headers: list[Any] = field(default_factory=list)
    dead: list[tuple[Any, ...]] = field(default_factory=list)
    #: committed rows per partition (``committed_rows`` reads them in key order)
    rows: dict[int, dict[bytes, Row]] = field(default_factory=dict)
    count: int = 0
    #: topics whose records Kafka refuses at once, as for a deleted topic (tests)
    refuse: set[str] = field(default_factory=set)
    #: topics whose metadata the sink asked to read again
    refresh: list[str] = field(default_factory=list)
    #: what the sink registered with :meth:`answer_refusals`
    answer: Callable[[str | None, KafkaClientError], bool] | None = None

    def produce(self, topic: str, value: Any, key: Any, partition: int = -1,
                headers: Any = None) -> None:  # fmt: skip
        if topic in self.refuse:
            err = RecordRefusedError(f"produce to {topic}: Local: Unknown partition (_UNKNOWN_PARTITION)",
                                     code="_UNKNOWN_PARTITION", refused=True)
            err.topic = topic
            raise err
        self.count += 1
        if self.keep:
            self.sent.append((topic, value, key, partition))
            self.headers.append(headers)

    def committed_rows(self, partition: int, after: bytes | None = None) -> Iterator[tuple[bytes, Row]]:
        for ekey in sorted(self.rows.get(partition, {})):
            row = self.rows[partition][ekey]
            if (after is None or ekey > after) and not row.deleted:
                yield ekey, row

    def decode(self, value: bytes) -> dict[str, Any]:
        record: dict[str, Any] = self.codec.decode(value).record
        return record

    def entity_type(self, name: str) -> EntityType | None:
        catalog = getattr(self.codec, "catalog", None)
        found: EntityType | None = catalog.types.get(name) if catalog is not None else None
        return found

    def room(self, topic: str) -> int:
        return self.room_bytes

    def dead_letter(self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]],
                    topic: str, partition: int, offset: int, reason: str, error: str) -> None:
        self.dead.append((key, value, topic, partition, offset, reason, error))

    def refresh_topic(self, topic: str) -> None:
        self.refresh.append(topic)

    def answer_refusals(self, answer: Callable[[str | None, KafkaClientError], bool]) -> None:
        self.answer = answer


class QuietRegistry:
    """A registry follower that reads nothing and is always caught up."""

    healthy = True
    alive = False
    restarts = 0
    last_error: str | None = None

    def start(self) -> None:
        self.alive = True

    def stop(self) -> None:
        self.alive = False

    def mark(self) -> None:
        pass

    def caught_up(self) -> bool:
        return True

    def drain(self) -> list[Any]:
        return []
