"""Which librdkafka settings a user may change over the worker's own (FIFOLANE_LIBRDKAFKA)."""

from __future__ import annotations

from typing import Any

__all__ = ["TUNING_KEYS", "merged_config"]

#: librdkafka keys that only trade latency, throughput or load on the broker: a value set in
#: ``FIFOLANE_LIBRDKAFKA`` replaces the worker's default (every other key of the worker's own
#: settings is needed for its guarantees and is kept).
TUNING_KEYS = frozenset({"fetch.wait.max.ms", "fetch.queue.backoff.ms", "fetch.min.bytes",
                         "fetch.max.bytes", "max.partition.fetch.bytes", "queued.min.messages",
                         "linger.ms", "batch.num.messages", "batch.size",
                         "queue.buffering.max.messages", "queue.buffering.max.kbytes",
                         "compression.type", "socket.nagle.disable", "topic.metadata.propagation.max.ms"})


def merged_config(base: dict[str, Any], conf: dict[str, Any]) -> dict[str, Any]:
    """A worker client's settings (``conf``) over the connection settings (``base``), except
    the :data:`TUNING_KEYS` set in ``base`` (``FIFOLANE_LIBRDKAFKA``): the user's value wins."""
    return {**base, **conf, **{k: v for k, v in base.items() if k in TUNING_KEYS}}
