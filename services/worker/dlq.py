"""Dead-letter records: the original bytes plus headers saying why and where from."""

from __future__ import annotations

from typing import Any

__all__ = ["REASONS", "dead_letter_headers"]

REASONS = (
    "undecodable",
    "unknown-schema",
    "missing-group",
    "missing-key",
    "missing-version",
    "handler-error",
    "invalid-listener",
    "group-parked",
)


def dead_letter_headers(headers: Any, topic: str, partition: int,
                        offset: int, reason: str, error: str, worker_id: str) -> list[tuple[str, bytes]]:
    """The original headers plus why and where from (see docs/formats.md)."""
    assert reason in REASONS, reason
    out = list(headers or [])
    out += [
        ("fifolane.dlq.reason", reason.encode()),
        ("fifolane.dlq.error", error.encode("utf-8", "replace")[:4000]),
        ("fifolane.dlq.topic", topic.encode()),
        ("fifolane.dlq.partition", str(partition).encode()),
        ("fifolane.dlq.offset", str(offset).encode()),
        ("fifolane.dlq.worker", worker_id.encode()),
    ]
    return out
