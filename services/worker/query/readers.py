"""The worker's side of the query readers (``--query-readers N``, services/worker/query/reader.py).

:class:`Readers` starts N reader processes on the public query port (more than one share it
with ``SO_REUSEPORT``), tells them who this worker is and where its own endpoint listens,
and mirrors the owner views: :class:`MirroredViews` is the :class:`Views` of the owned
partitions; it sends each publish to the readers, and waits for every reader to let go of
a partition before the partition's store may close (the worker may wipe it next). A view
marked stale (services/worker/query/views.py) is passed on too: the readers send that
partition's reads to the worker (which answers ``unavailable``) until its next view.

Liveness, both ways:

- the worker sends ``alive`` every 0.5 s from a thread of its own; a reader answers only
  within 3 s of the last one (``LEASE_S``), so the reader of a frozen worker (SIGSTOP, a
  stalled VM) stops answering before the group can give the worker's partitions to another
  (the session timeout, 6 s at the least): it answers ``unavailable`` instead, and clients
  ask again or elsewhere;
- a reader answers each ``alive`` with a ``pong``; one that has not for 10 s, or has died,
  is stopped and started again (same port; a new one if that is taken and the port was
  chosen freely, then published), with a backoff while it fails.

Readers end with the worker: they stop at the end of their stdin, which the kernel closes
when the worker dies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from fifolane.config import PROJECT_ROOT
from fifolane.errors import ConfigError
from services.worker.query.views import View, Views

__all__ = ["LEASE_S", "MirroredViews", "Readers"]

log = logging.getLogger(__name__)

#: how long a reader answers after the worker's last ``alive`` (< the smallest session timeout)
LEASE_S = 3.0
_BEAT_S = 0.5
_UNRESPONSIVE_S = 10.0
_ACK_TIMEOUT_S = 5.0


class _Reader:
    """One reader process, its pipes, and what it answered."""

    def __init__(self, argv: list[str], n: int) -> None:
        self.n = n
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=PROJECT_ROOT, bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[str] = self.proc.stdin
        self.stdout: IO[str] = self.proc.stdout
        self.started = time.monotonic()
        self.pong = self.started
        self._acks: set[int] = set()
        self._cond = threading.Condition()

    def port(self) -> int:
        """The port it listens on, once it does; then its answers are followed."""
        line = self.stdout.readline()
        if not line:
            raise ConfigError(f"the query reader exited at start (code {self.proc.wait(10)}): see its "
                              "messages above (the query port in use? the TLS files?)")
        port = int(json.loads(line)["port"])
        threading.Thread(target=self._follow, name=f"query-reader-{self.n}", daemon=True).start()
        return port

    def _follow(self) -> None:
        for line in self.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "ack" in msg:
                with self._cond:
                    self._acks.add(int(msg["ack"]))
                    self._cond.notify_all()
            elif "pong" in msg:
                self.pong = time.monotonic()
        with self._cond:
            self._cond.notify_all()

    def acked(self, ack: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while ack not in self._acks:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    return False
                self._cond.wait(left)
            self._acks.discard(ack)
            return True

    def send(self, msg: dict[str, Any]) -> bool:
        try:
            self.stdin.write(json.dumps(msg) + "\n")
            self.stdin.flush()
            return True
        except (OSError, ValueError):  # a dead reader: the watcher starts it again
            return False

    def stop(self, timeout: float = 10.0) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


class Readers:
    """N reader processes and what they are told (see the module docstring)."""

    def __init__(self, count: int, *, host: str, port: int, work_dir: Path, schemas_dir: Path,
                 registry_url: str | None, group_index: bool, directory: bool,
                 tls: tuple[Path, Path] | None, token_file: Path | None) -> None:
        self.count = count
        self._free_port = port == 0  # the port may change when it cannot be had again
        self._port = port
        self._work = work_dir
        self._base = [sys.executable, "-m", "services.worker.query.reader", "--host", host,
                      "--schemas-dir", str(schemas_dir), "--group-index", str(int(group_index)),
                      "--directory", str(int(directory)), "--lease", str(LEASE_S)]
        if registry_url:
            self._base += ["--registry-url", registry_url]
        if tls is not None:
            self._base += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
        if token_file is not None:
            self._base += ["--token-file", str(token_file)]
        self._lock = threading.Lock()  # the readers list and the pipes' writes
        self._readers: list[_Reader] = []
        self._acks = 0
        self._hello: dict[str, Any] | None = None
        self._routing: dict[str, Any] | None = None
        self._views: dict[int, dict[str, Any]] = {}  # what a restarted reader is told again
        self._stale: dict[int, dict[str, Any]] = {}  # (and which of those views are stale)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        #: called with the new port when a restarted reader could not get the old one
        self.on_port: Callable[[int], None] | None = None
        self.restarts = 0

    def _argv(self, n: int, port: int) -> list[str]:
        return self._base + ["--port", str(port), "--work-dir", str(self._work / f"r{n}.{os.getpid()}")] + (
            ["--reuse-port"] if self.count > 1 else [])

    def start(self) -> int:
        """Start the readers; returns the public port they listen on."""
        shutil.rmtree(self._work, ignore_errors=True)  # secondaries of readers before a crash
        port = self._port
        for n in range(self.count):
            r = _Reader(self._argv(n, port), n)
            port = r.port()
            self._readers.append(r)
        self._port = port
        for name, target in (("query-readers", self._watch), ("query-readers-alive", self._beat)):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return port

    def _beat(self) -> None:
        """``alive`` to every reader (they answer reads only while it comes)."""
        n = 0
        while not self._stopping.wait(_BEAT_S):
            n += 1
            self._tell({"op": "alive", "n": n})

    def _watch(self) -> None:
        """Start a reader again when it died or stopped answering (not when the worker
        stops it), with a backoff while that fails."""
        failures = 0
        while not self._stopping.wait(min(30.0, 0.5 * 2 ** failures)):
            for i, r in enumerate(list(self._readers)):
                code = r.proc.poll()
                if code is None and time.monotonic() - r.pong < _UNRESPONSIVE_S:
                    continue
                if code is None:
                    log.error("query reader %d has not answered for %.0f s: stopping it", r.n, _UNRESPONSIVE_S)
                    r.proc.kill()
                else:
                    log.error("query reader %d exited (code %s): starting it again", r.n, code)
                failures = 0 if self._restart(i, r) else failures + 1

    def _restart(self, i: int, old: _Reader) -> bool:
        old.stop(1.0)
        fresh: _Reader | None = None
        for port in [self._port] + ([0] if self._free_port and self.count == 1 else []):
            try:
                fresh = _Reader(self._argv(old.n, port), old.n)
                got = fresh.port()
                break
            except (OSError, ConfigError, ValueError) as exc:
                log.error("query reader %d did not start on port %d: %s", old.n, port, exc)
                fresh = None
        if fresh is None:
            return False
        with self._lock:
            if self._stopping.is_set():
                fresh.stop(1.0)
                return True
            self._readers[i] = fresh
            for msg in [self._hello, self._routing, *self._views.values(), *self._stale.values()]:
                if msg is not None:
                    fresh.send(msg)
        self.restarts += 1
        if got != self._port:
            self._port = got
            if self.on_port is not None:
                self.on_port(got)
        return True

    def stop(self) -> None:
        self._stopping.set()
        for t in self._threads:
            t.join(30)
        with self._lock:
            readers, self._readers = self._readers, []
        for r in readers:
            r.stop()
        shutil.rmtree(self._work, ignore_errors=True)

    # -- what the readers are told -------------------------------------------------------------
    def _tell(self, msg: dict[str, Any]) -> None:
        with self._lock:
            for r in self._readers:
                r.send(msg)

    def hello(self, worker: str, url: str, upstream: str) -> None:
        with self._lock:
            self._hello = {"op": "me", "worker": worker, "url": url, "upstream": upstream}
        self._tell(self._hello)

    def routing(self, input_partitions: int, directory_partitions: int) -> None:
        msg = {"op": "routing", "input_partitions": input_partitions, "directory_partitions": directory_partitions}
        if msg != self._routing:
            with self._lock:
                self._routing = msg
            self._tell(msg)

    def view(self, p: int, path: Path, view: View) -> None:
        msg = {"op": "view", "p": p, "path": str(path), "position": view.position, "seq": view.seq}
        with self._lock:
            self._views[p] = msg
            self._stale.pop(p, None)
            for r in self._readers:
                r.send(msg)

    def stale(self, p: int, why: str) -> None:
        """Partition p's published view is behind its store: the readers stop answering from
        it (the worker answers ``unavailable``) until its next view."""
        msg = {"op": "stale", "p": p, "why": why}
        with self._lock:
            if p not in self._views:
                return
            self._stale[p] = msg
            for r in self._readers:
                r.send(msg)

    def withdraw(self, p: int) -> None:
        """Every reader has closed its secondaries of p when this returns (or is dead, or did
        not answer within 5 s: then it is killed, and started again without p)."""
        with self._lock:
            self._stale.pop(p, None)
            if self._views.pop(p, None) is None:
                return  # never sent: no reader reads it
            self._acks += 1
            ack = self._acks
            readers = [r for r in self._readers if r.send({"op": "withdraw", "p": p, "ack": ack})]
        for r in readers:
            if not r.acked(ack, _ACK_TIMEOUT_S) and r.proc.poll() is None:
                log.error("query reader %d did not let go of partition %d: stopping it", r.n, p)
                r.proc.kill()


class MirroredViews(Views):
    """The owner views, mirrored to the readers (see the module docstring)."""

    def __init__(self, readers: Readers, path_of: Callable[[int], Path]) -> None:
        super().__init__()
        self._readers = readers
        self._path_of = path_of

    def publish(self, partition: int, view: View) -> None:
        super().publish(partition, view)
        if view.db is not None:
            self._readers.view(partition, self._path_of(partition), view)

    def withdraw(self, partition: int, timeout: float = 10.0) -> None:
        super().withdraw(partition, timeout)
        self._readers.withdraw(partition)

    def mark_stale(self, partition: int, why: str) -> None:
        super().mark_stale(partition, why)
        if self.stale(partition) is not None:
            self._readers.stale(partition, why)
