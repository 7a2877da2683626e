"""Views "as of" a past time: end offsets by timestamp, bounded by the history window.

The state topic is compacted, so older versions of a key survive only while they are younger
than the topic's ``min.compaction.lag.ms`` (the history window, the seed's
``MIN_RELEASE_AGE``): the log cleaner may remove a version once a newer one exists and the
version is older than that lag. A view as of T is exact when T >= now - lag; for an older T
a key whose version at T was replaced since may be missing (only the newer, later-than-T
version was kept), so such a request is refused unless the caller accepts an incomplete view.

Records count as "as of T" when their Kafka timestamp is <= T. Limits: timestamps are the
producers' CreateTime (workers stamp them as they write); a transaction that straddles T
contributes the records written up to T.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from fifolane.config import Settings
from fifolane.errors import FifolaneError

__all__ = [
    "HistoryWindowError",
    "HistoryWindow",
    "ending_offsets_json",
    "history_window",
    "offsets_as_of",
]

_TIMEOUT = 30.0


class HistoryWindowError(FifolaneError):
    """The asked time is older than the topic's history window (min.compaction.lag.ms)."""


@dataclass(frozen=True)
class HistoryWindow:
    """The history window of a compacted topic at one moment."""

    topic: str
    lag_ms: int
    now: datetime

    @property
    def oldest(self) -> datetime:
        """The oldest time for which a view is guaranteed complete."""
        return datetime.fromtimestamp(self.now.timestamp() - self.lag_ms / 1000.0, tz=UTC)

    def contains(self, as_of: datetime) -> bool:
        return as_of >= self.oldest

    def check(self, as_of: datetime, *, allow_compacted: bool = False) -> str | None:
        """None if ``as_of`` is inside the window; else the warning text (or raise).

        Raises :class:`HistoryWindowError` unless ``allow_compacted``.
        """
        if self.contains(as_of):
            return None
        message = (
            f"{as_of.isoformat()} is outside the history window of topic {self.topic}: "
            f"min.compaction.lag.ms={self.lag_ms} ({self.lag_ms / 3_600_000:.2f} h) keeps "
            f"history only back to {self.oldest.isoformat()}; older versions may have been "
            "compacted away, so the view may be incomplete"
        )
        if not allow_compacted:
            raise HistoryWindowError(message + " (pass --allow-compacted to build it anyway)")
        return message


def history_window(settings: Settings, topic: str, *, now: datetime | None = None) -> HistoryWindow:
    """Read ``min.compaction.lag.ms`` of ``topic`` from the brokers."""
    admin = AdminClient(settings.kafka_config())
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        configs = admin.describe_configs([resource])[resource].result(timeout=_TIMEOUT)
    except KafkaException as exc:
        raise FifolaneError(f"cannot read the configuration of topic {topic}: {exc}") from exc
    entry = configs.get("min.compaction.lag.ms")
    lag = int(entry.value) if entry is not None and entry.value is not None else 0
    return HistoryWindow(topic, lag, now or datetime.now(tz=UTC))


def offsets_as_of(settings: Settings, topic: str, as_of: datetime) -> dict[int, int]:
    """Per partition, the exclusive end offset of the records with timestamp <= ``as_of``.

    That is the first offset with a timestamp > as_of (``offsets_for_times`` at as_of + 1 ms),
    or ``-1`` (Spark's "latest", the last stable offset under read_committed) when every
    committed record is older.
    """
    millis = int(as_of.timestamp() * 1000) + 1
    consumer = Consumer(settings.kafka_config(**{
        "group.id": "fifolane-views-as-of",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    }))
    try:
        meta = consumer.list_topics(topic, timeout=_TIMEOUT).topics.get(topic)
        if meta is None or meta.error is not None:
            raise FifolaneError(f"topic {topic} does not exist: {meta.error if meta else 'missing'}")
        asked = [TopicPartition(topic, p, millis) for p in sorted(meta.partitions)]
        found = consumer.offsets_for_times(asked, timeout=_TIMEOUT)
        ends: dict[int, int] = {}
        for tp in found:
            # No record after the time: everything committed in the partition counts.
            ends[tp.partition] = tp.offset if tp.offset >= 0 else -1
        return ends
    except KafkaException as exc:
        raise FifolaneError(f"cannot look up offsets of {topic} at {as_of.isoformat()}: {exc}") from exc
    finally:
        consumer.close()


def ending_offsets_json(topic: str, ends: dict[int, int]) -> str:
    """Spark's ``endingOffsets`` option for these end offsets."""
    return json.dumps({topic: {str(p): o for p, o in sorted(ends.items())}})
