"""CPU and bytes meters of the capacity and scaling suites.

- CPU seconds (user + system, every thread) of processes, from /proc through psutil: the
  workers the suite started and the Kafka brokers of the bootstrap address, found as the
  local processes listening on its ports (any broker on this machine: the benchmark's own,
  a test session's, one of ``fifolane kafka up``).
- Broker bytes of a topic: the sizes of its log segments in the brokers' data directories
  (``log.dirs`` of each broker's ``server.properties``, from its command line), so record
  batches, headers and transaction markers count as the broker stores them; and the records
  themselves, read back with a consumer (count, key + value + header bytes).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Consumer, KafkaError, TopicPartition

__all__ = ["Brokers", "TopicBytes", "cpu_seconds", "find_brokers", "loadavg", "read_records",
           "restore_span", "restored_from_log"]

_RESTORED = re.compile(r"restored \S+\[(\d+)\]: (\d+) records in ([\d.]+)s")
#: the same line with its log time (``2026-11-24 02:16:26,670``)
_RESTORED_AT = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*restored \S+\[\d+\]: \d+ records in ([\d.]+)s",
                          re.MULTILINE)


def restored_from_log(log: Path) -> dict[int, tuple[int, float]]:
    """partition -> (records, seconds) from a worker's "restored <topic>[p]: N records in Xs" lines."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    return {int(p): (int(n), float(s)) for p, n, s in _RESTORED.findall(text)}


def restore_span(log: Path) -> float | None:
    """Seconds from the first partition's restore start to the last one's end, from the
    same log lines (a worker restores its partitions at the same time, one thread each, so
    the sum of their times is not how long the restore took)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    spans = []
    for stamp, ms, secs in _RESTORED_AT.findall(text):
        end = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp() + int(ms) / 1000
        spans.append((end - float(secs), end))
    if not spans:
        return None
    return max(e for _s, e in spans) - min(s for s, _e in spans)


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded: noted with every number."""
    return [round(x, 2) for x in os.getloadavg()]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (a process that is gone counts 0)."""
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


@dataclass(frozen=True)
class Brokers:
    """The local broker processes of a bootstrap address and their data directories."""

    pids: list[int]
    data_dirs: list[Path]

    def disk_bytes(self, topic: str) -> int:
        """Bytes of ``topic``'s log segments on every broker (all replicas)."""
        total = 0
        for data in self.data_dirs:
            for part in data.glob(f"{topic}-*"):
                if part.name.rsplit("-", 1)[0] != topic:
                    continue
                total += sum(f.stat().st_size for f in part.glob("*.log"))
        return total


def _ports(bootstrap: str) -> set[int]:
    return {int(hp.rsplit(":", 1)[1]) for hp in bootstrap.split(",") if ":" in hp}


def _log_dirs(proc: psutil.Process) -> list[Path]:
    """``log.dirs`` from the ``server.properties`` on the broker's command line."""
    try:
        args = proc.cmdline()
    except psutil.Error:
        return []
    for arg in args:
        if arg.endswith(".properties") and Path(arg).is_file():
            for line in Path(arg).read_text().splitlines():
                if line.startswith(("log.dirs=", "log.dir=")):
                    return [Path(d) for d in line.split("=", 1)[1].split(",") if d]
    return []


def find_brokers(bootstrap: str) -> Brokers | None:
    """The processes of this machine listening on ``bootstrap``'s ports (None: not local).

    Only the ports of the address are known, so every broker of a multi-broker cluster must
    be named in it (``LocalCluster`` bootstrap strings name them all).
    """
    ports = _ports(bootstrap)
    pids = sorted({c.pid for c in psutil.net_connections(kind="tcp")
                   if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port in ports and c.pid})
    if not pids:
        return None
    dirs = [d for pid in pids for d in _log_dirs(psutil.Process(pid))]
    return Brokers(pids, dirs)


@dataclass(frozen=True)
class TopicBytes:
    """What one topic holds: records read back and their bytes."""

    records: int
    record_bytes: int  # key + value + header names and values
    disk_bytes: int | None  # log segments on the brokers (None: brokers not local)

    def per_record(self, replicas: int = 1) -> float | None:
        """Broker bytes per record, one replica (disk if known, else the records' bytes)."""
        if not self.records:
            return None
        if self.disk_bytes is not None:
            return self.disk_bytes / replicas / self.records
        return self.record_bytes / self.records

    def to_dict(self) -> dict[str, Any]:
        return {"records": self.records, "record_bytes": self.record_bytes, "disk_bytes": self.disk_bytes}


def read_records(bootstrap: str, topic: str, brokers: Brokers | None, *, committed: bool = True,
                 timeout: float = 120.0) -> TopicBytes:
    """Read ``topic`` to its end (``read_committed`` unless ``committed`` is False) and size it."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-size-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": "read_committed" if committed else "read_uncommitted"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        ended: set[int] = set()
        count = size = 0
        deadline = time.monotonic() + timeout
        while len(ended) < len(parts):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: {len(ended)}/{len(parts)} partitions to the end "
                                   f"after {timeout:.0f}s")
            for msg in consumer.consume(5000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        ended.add(msg.partition() or 0)
                    continue
                count += 1
                size += len(msg.key() or b"") + len(msg.value() or b"")
                size += sum(len(k) + len(v or b"") for k, v in msg.headers() or ())
    finally:
        consumer.close()
    return TopicBytes(count, size, brokers.disk_bytes(topic) if brokers is not None else None)
