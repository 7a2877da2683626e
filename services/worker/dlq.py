"""Dead-letter records: the original bytes plus headers saying why and where from.

A dead-letter copy that Kafka would refuse (its value and headers over what the dead-letter
topic takes) is cut to fit: the value is truncated (and the key, and the original headers
are dropped, when they alone take much of the room), and ``fifolane.dlq.truncated`` says what was cut while
``fifolane.dlq.original-size`` gives the original key + value + headers size in bytes.
"""

from __future__ import annotations

from typing import Any

from services.worker.limits import record_size

__all__ = ["REASONS", "dead_letter", "dead_letter_headers"]

REASONS = (
    "undecodable",
    "unknown-schema",
    "missing-group",
    "missing-key",
    "missing-version",
    "group-too-long",
    "bad-version",
    "too-large",
    "output-refused",
    "handler-error",
    "invalid-listener",
    "group-parked",
)

Headers = list[tuple[str, bytes]]


def dead_letter_headers(headers: Any, topic: str, partition: int,
                        offset: int, reason: str, error: str, worker_id: str) -> Headers:
    """The original headers plus why and where from (see docs/formats.md)."""
    assert reason in REASONS, reason
    return list(headers or []) + _own(topic, partition, offset, reason, error, worker_id)


def _own(topic: str, partition: int, offset: int, reason: str, error: str, worker_id: str) -> Headers:
    return [
        ("fifolane.dlq.reason", reason.encode()),
        ("fifolane.dlq.error", error.encode("utf-8", "replace")[:4000]),
        ("fifolane.dlq.topic", topic.encode()),
        ("fifolane.dlq.partition", str(partition).encode()),
        ("fifolane.dlq.offset", str(offset).encode()),
        ("fifolane.dlq.worker", worker_id.encode()[:200]),
    ]


def dead_letter(key: bytes | None, value: bytes | None, headers: Any, *, topic: str, partition: int,
                offset: int, reason: str, error: str, worker_id: str,
                room: int) -> tuple[bytes | None, bytes | None, Headers]:
    """Key, value and headers of the dead-letter copy of an input record, cut to ``room``
    bytes (key + value + headers) if it would not fit (see the module docstring)."""
    assert reason in REASONS, reason
    own = _own(topic, partition, offset, reason, error, worker_id)
    original = list(headers or [])
    full = original + own
    size = record_size(key, value, full)
    if size <= room:
        return key, value, full
    cut: list[str] = []
    left = room - record_size(None, None, own) - 120  # 120: the two headers added below
    if original and record_size(None, None, original) > left // 4:
        original = []
        cut.append("headers")
    left -= record_size(None, None, original)
    if key is not None and len(key) > max(left // 4, 0):
        key = key[: max(left // 4, 0)]
        cut.append("key")
    left -= len(key or b"")
    if value is not None and len(value) > max(left, 0):
        value = value[: max(left, 0)]
        cut.append("value")
    extra = [("fifolane.dlq.truncated", ",".join(cut).encode()),
             ("fifolane.dlq.original-size", str(size).encode())]
    return key, value, original + own + extra
