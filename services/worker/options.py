"""Worker options: data only, frozen, refused at construction when invalid."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from fifolane.errors import ConfigError

__all__ = ["GUARANTEES", "WorkerOptions", "default_worker_id"]

GUARANTEES = ("exactly-once", "at-least-once")


def default_worker_id() -> str:
    """Host and pid: unique, but not stable across restarts (pass ``--worker-id`` for that)."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How a worker runs. A stable ``worker_id`` makes restarts fence the old transaction
    at once instead of waiting for ``transaction_timeout_ms``."""

    worker_id: str
    group_id: str | None = None  # consumer group; default: fifolane-<app name>
    concurrency: int = 16
    guarantee: Literal["exactly-once", "at-least-once"] = "exactly-once"
    commit_interval: float = 0.25
    max_buffered: int = 20_000
    retries: int = 3
    retry_backoff: float = 0.05
    state_dir: Path | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"  # bind address of the metrics endpoint (0.0.0.0: all)
    stats_file: Path | None = None
    transaction_timeout_ms: int = 10_000
    static_membership: bool = False  # group.instance.id = worker_id: a restart keeps its partitions
    #: what a handler failure after the retries does: "skip" dead-letters the event and the
    #: group goes on; "park" holds the group (services/worker/parking.py)
    on_failure: Literal["skip", "park"] = "skip"
    #: take well-formed table upserts on the fast path (off: every record takes the general
    #: path, the same outcome more slowly; for diagnosis and the tests that compare them)
    fast_path: bool = True
    #: keep the entity directory (services/worker/directory.py) so entities can change
    #: group across partitions; off (``--no-directory``): where entities never change group,
    #: or the input topic has one partition
    directory: bool = True
    #: the query endpoint (services/worker/query/): port (None: no endpoint; 0: any free
    #: one), bind address, the address published to clients (default: the bind address, or
    #: this host's name when it binds every interface), TLS and bearer token
    query_port: int | None = None
    query_host: str = "127.0.0.1"
    query_advertise: str | None = None
    query_tls_cert: Path | None = None
    query_tls_key: Path | None = None
    query_token_file: Path | None = None
    #: processes that serve the query port's key reads beside the worker (0: the worker
    #: serves every read itself; services/worker/query/reader.py)
    query_readers: int = 1
    #: warm copies kept of each partition on other workers (services/worker/query/standby.py)
    standby_replicas: int = 0

    def __post_init__(self) -> None:
        if self.guarantee not in GUARANTEES:
            raise ConfigError(f"guarantee must be one of {', '.join(GUARANTEES)}, got {self.guarantee!r}")
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.commit_interval <= 0:
            raise ConfigError(f"commit_interval must be > 0 seconds, got {self.commit_interval}")
        if self.on_failure not in ("skip", "park"):
            raise ConfigError(f"on_failure must be skip or park, got {self.on_failure!r}")
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries}")
        if self.standby_replicas < 0:
            raise ConfigError(f"standby_replicas must be >= 0, got {self.standby_replicas}")
        if not 0 <= self.query_readers <= 16:
            raise ConfigError(f"query_readers must be 0..16, got {self.query_readers}")
        if self.standby_replicas and self.query_port is None:
            raise ConfigError("standby replicas serve and hand over through the query endpoint: "
                              "give --query-port too")
        if not self.worker_id or any(c.isspace() for c in self.worker_id):
            raise ConfigError(f"worker_id must be a non-empty word, got {self.worker_id!r}")
