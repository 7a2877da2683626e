"""Helpers for worker tests: send events, run workers in threads or processes, read tables."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from kafka_fixtures import consume_all, wait_until

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.testing.records import table_from
from services.worker import App, Event, GroupState, WorkerOptions
from services.worker.runtime import Worker

__all__ = [
    "WorkerProcess", "WorkerThread", "accounted", "app_of", "committed_input", "read_dlq", "read_table",
    "reservation", "send_events", "wait_accounted",
]

CATALOG = SchemaCatalog.load(PROJECT_ROOT / "schemas")


def reservation(rid: str, flight: str, version: int, *, seats: int = 1, amount: float = 100.0,
                state: str = "NEW", customer: str = "c1") -> dict[str, Any]:
    return {"reservation_id": rid, "flight_number": flight, "customer_id": customer, "seats": seats,
            "amount": amount, "state": state, "version": version}


def app_of(name: str, rule: Callable[[Event, GroupState], None], kind: str) -> App:
    """An app whose reservation handler is ``rule``: a sync one on the handler threads, or
    an async one (that would await I/O) on the event loop's thread."""
    made = App(f"{name}-{kind}")
    if kind == "sync":
        made.handler("reservation")(rule)
    else:
        @made.handler("reservation")
        async def rule_async(event: Event, state: GroupState) -> None:
            await asyncio.to_thread(rule, event, state)
    return made


def send_events(settings: Settings, events: Iterable[tuple[str, dict[str, Any], str]]) -> int:
    """Send ``(type, record, op)`` events keyed by group, in order; returns how many."""
    codec = make_codec(settings, CATALOG)
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all", "linger.ms": 5}))
    n = 0
    for type_name, record, op in events:
        et = CATALOG.entity(type_name)
        group = str(et.group_of(record))
        if op == "delete":
            value = codec.encode_delete(type_name, et.key_of(record), group, int(et.version_of(record)))
        else:
            value = codec.encode(type_name, record)
        while True:
            try:
                producer.produce(settings.input_topic, value, group.encode())
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
    assert producer.flush(30) == 0
    return n


def read_table(settings: Settings) -> dict[str, tuple[int, dict[str, Any] | None]]:
    """The committed state topic as a table: key -> (version, record or None if deleted)."""
    codec = make_codec(settings, CATALOG)
    return {key: (entry.version, entry.value)
            for key, entry in table_from(consume_all(settings, settings.state_topic), codec).items()}


def committed_input(settings: Settings, group: str) -> int:
    """A group's committed offsets on the input topic, summed (none committed counts as 0)."""
    c = Consumer(settings.kafka_config(**{"group.id": group, "enable.auto.commit": False}))
    try:
        tps = [TopicPartition(settings.input_topic, p) for p in range(settings.partitions)]
        return sum(max(0, tp.offset) for tp in c.committed(tps, timeout=10))
    finally:
        c.close()


def read_dlq(settings: Settings) -> list[dict[str, Any]]:
    """Dead letters as dicts of their fifolane.dlq.* headers plus key and value."""
    out = []
    for msg in consume_all(settings, settings.dlq_topic):
        headers = {k: v.decode() for k, v in (msg.headers() or ()) if k.startswith("fifolane.dlq.")}
        out.append({"key": msg.key(), "value": msg.value(), **{k[len("fifolane.dlq."):]: v for k, v in headers.items()}})
    return out


def accounted(stats: Iterable[Any]) -> int:
    return sum(s.processed + s.superseded + s.dead_lettered for s in stats)


def wait_accounted(workers: list[Any], n: int, timeout: float = 60.0) -> None:
    """Wait until every input record is processed, superseded or dead-lettered, and committed."""
    wait_until(lambda: accounted(w.stats for w in workers) >= n and all(w.committed() for w in workers),
               timeout=timeout,
               message=lambda: f"accounted {accounted(w.stats for w in workers)} of {n}")


class WorkerThread:
    """A Worker running in a thread of the test process."""

    def __init__(self, settings: Settings, app: App | None = None, *, listeners: Any = None,
                 **options: Any) -> None:
        options.setdefault("worker_id", "w1")
        options.setdefault("state_dir", settings.home / "state" / options["worker_id"])
        self.worker = Worker(settings, app, WorkerOptions(**options), listeners=listeners)
        self.thread = threading.Thread(target=self._run, name=f"worker-{options['worker_id']}", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # surfaced by stop()
            self.error = exc
            raise

    @property
    def stats(self) -> Any:
        return self.worker.stats

    def committed(self) -> bool:
        """Nothing consumed but uncommitted (read under the GIL; a hint, tests re-check)."""
        return self.worker.committed()

    def __enter__(self) -> WorkerThread:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.worker.stop()
        self.thread.join(60)
        assert not self.thread.is_alive(), "worker thread did not stop"
        if self.error is not None:
            raise self.error

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@dataclass
class _Snapshot:
    processed: int = 0
    superseded: int = 0
    dead_lettered: int = 0


def _die_with_parent() -> None:
    """Linux: SIGKILL the worker when the test process dies, so no orphan keeps a group busy."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class WorkerProcess:
    """A worker in its own process (``python -m services.worker``), for kill tests."""

    def __init__(self, settings: Settings, worker_id: str, tmp: Path, app: str | None = None,
                 extra: list[str] | None = None, *, static: bool = True) -> None:
        """``static=False``: no ``--worker-id`` (as a user who gives none: dynamic group
        membership, the id is host-pid); ``worker_id`` then only names the files."""
        self.settings = settings
        self.worker_id = worker_id
        self.static = static
        self.stats_file = tmp / f"{worker_id}.stats.json"
        self.log_file = tmp / f"{worker_id}.log"
        self.args = [sys.executable, "-m", "services.worker", *(["--worker-id", worker_id] if static else []),
                     "--state-dir", str(tmp / "state" / worker_id), "--stats-file", str(self.stats_file),
                     *(["--app", app] if app else []), *(extra or [])]
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    def env(self) -> dict[str, str]:
        s = self.settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
        env.update({
            "FIFOLANE_BOOTSTRAP_SERVERS": s.resolved_bootstrap(),
            "FIFOLANE_INPUT_TOPIC": s.input_topic, "FIFOLANE_STATE_TOPIC": s.state_topic,
            "FIFOLANE_REGISTRY_TOPIC": s.registry_topic, "FIFOLANE_DLQ_TOPIC": s.dlq_topic,
            "FIFOLANE_LISTENER_OUTPUT_TOPIC": s.listener_output_topic,
            "FIFOLANE_DIRECTORY_TOPIC": s.directory_topic,
            "FIFOLANE_PARKED_TOPIC": s.parked_topic,
            "FIFOLANE_MEMBERS_TOPIC": s.members_topic,
            "FIFOLANE_HOME": str(s.home), "FIFOLANE_PARTITIONS": str(s.partitions),
            "PYTHONPATH": str(PROJECT_ROOT) + os.pathsep + str(PROJECT_ROOT / "tests"),
        })
        return env

    def start(self) -> WorkerProcess:
        with contextlib.suppress(FileNotFoundError):
            self.stats_file.unlink()
        self.runs += 1
        log = self.log_file.open("ab")
        self.proc = subprocess.Popen(self.args, env=self.env(), stdout=log, stderr=subprocess.STDOUT,
                                     cwd=PROJECT_ROOT, preexec_fn=_die_with_parent)
        return self

    @property
    def effective_id(self) -> str:
        """The id the worker runs with (its transactional id is ``<group>-<this>``)."""
        if self.static:
            return self.worker_id
        assert self.proc is not None
        return f"{socket.gethostname()}-{self.proc.pid}"

    def pause(self) -> None:
        """SIGSTOP: the process stays, frozen (a long GC pause, a stalled VM)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def snapshot(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.stats_file.read_text())
            return data
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.terminate()
        return self.proc.wait(60)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-n:])
        except FileNotFoundError:
            return ""


@contextlib.contextmanager
def processes(*procs: WorkerProcess) -> Iterator[tuple[WorkerProcess, ...]]:
    for p in procs:
        p.start()
    try:
        yield procs
    finally:
        for p in procs:
            if p.alive():
                p.kill()
