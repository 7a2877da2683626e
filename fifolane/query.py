"""The query API's contract, shared by the workers' endpoint and its clients.

docs/formats.md ("Query API") specifies the paths, the JSON answers and the status codes;
this module holds what both sides must agree on:

- where a key lives: an entity ``<type>/<key>`` is in the *directory* partition
  ``partition_for(b"<type>/<key>", directory partitions)``, which knows the input partition
  of its group; a group ``G`` is in the input partition ``partition_for(G, input
  partitions)`` (Java's murmur2, :mod:`fifolane.partitioner`);
- the members topic's records (each worker's query address);
- the statuses of an answer, and :class:`QueryError` for the ones that are not data.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from fifolane.errors import FifolaneError

__all__ = [
    "API", "MOVED", "NOT_FOUND", "OK", "RESTORING", "STATUS_CODES", "TIMEOUT", "UNAVAILABLE",
    "QueryError", "entity_key", "json_object", "member_key", "member_value", "read_member",
]

#: The path prefix of every endpoint (a new major version gets a new prefix).
API = "/v1"

# Statuses of an answer (the ``status`` field) and their HTTP codes.
OK = "ok"
NOT_FOUND = "not_found"
MOVED = "moved"  # ask the owner named in the answer (the seed's stale locator)
RESTORING = "restoring"  # the owner is restoring the partition: retry after a moment
TIMEOUT = "timeout"  # min_position not reached within the wait
UNAVAILABLE = "unavailable"  # nobody owns the partition right now (a rebalance)
BAD_REQUEST = "bad_request"
UNAUTHORIZED = "unauthorized"

STATUS_CODES: dict[str, int] = {
    OK: 200, NOT_FOUND: 404, MOVED: 421, RESTORING: 503, TIMEOUT: 504, UNAVAILABLE: 503,
    BAD_REQUEST: 400, UNAUTHORIZED: 401,
}


class QueryError(FifolaneError):
    """A query that got no data: moved, restoring, timed out, refused, or no worker
    reachable. ``status`` is the answer's status, ``answer`` its JSON body (if any)."""

    def __init__(self, message: str, *, status: str, answer: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.answer = answer or {}


def entity_key(type_name: str, key: str) -> bytes:
    """The key of an entity in the state topic, the stores and the directory."""
    return f"{type_name}/{key}".encode()


def member_key(group: str, worker_id: str) -> bytes:
    """The members-topic key of a worker of consumer group ``group``."""
    return f"{group}/{worker_id}".encode()


def member_value(worker_id: str, group: str, input_topic: str, url: str) -> bytes:
    """The members-topic value a worker writes when its endpoint is up."""
    return json.dumps({"worker": worker_id, "group": group, "input_topic": input_topic, "url": url,
                       "at": datetime.now(UTC).isoformat(timespec="seconds")}).encode()


def read_member(key: bytes | None, value: bytes | None) -> tuple[str, str, dict[str, Any] | None] | None:
    """``(group, worker, record)`` of a members-topic record (record None: the worker left);
    None for a record that is not one (it is skipped, never fatal)."""
    if key is None:
        return None
    group, sep, worker = key.decode(errors="replace").partition("/")
    if not sep or not worker:
        return None
    if value is None:
        return group, worker, None
    body = json_object(value)
    if body is None or not _usable_url(body.get("url")):
        return None
    return group, worker, body


def json_object(value: bytes) -> dict[str, Any] | None:
    """``value`` as a JSON object; None for anything else (never an error: the members topic
    is writable by every worker, and JSON nested thousands deep raises RecursionError)."""
    try:
        body = json.loads(value)
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


def _usable_url(url: object) -> bool:
    """An ``http(s)://host[:port]`` a client can ask: anyone who may write the members topic
    may write anything there, and one bad address must not break every reader's routing."""
    if not isinstance(url, str) or len(url) > 2048 or not url.isprintable() or " " in url:
        return False
    scheme, sep, rest = url.partition("://")
    return bool(sep) and scheme in ("http", "https") and bool(rest) and not rest.startswith(("/", ":"))
