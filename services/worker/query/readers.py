"""The worker's side of the query readers (``--query-readers N``, services/worker/query/reader.py).

:class:`Readers` starts N reader processes on the public query port (more than one share it
with ``SO_REUSEPORT``), tells them who this worker is and where its own endpoint listens,
and mirrors the owner views: :class:`MirroredViews` is the :class:`Views` of the owned
partitions, and sends each publish to the readers and waits for every reader to let go of
a partition before the partition's store may close (the worker may wipe it next).

A reader that dies is started again on the same port, and told everything again; the
worker's own endpoint answers nothing publicly meanwhile, so clients retry (their routing
names this worker's public address). Readers end with the worker: they stop at the end of
their stdin, which the kernel closes when the worker dies.
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
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from fifolane.config import PROJECT_ROOT
from fifolane.errors import ConfigError
from services.worker.query.views import View, Views

__all__ = ["MirroredViews", "Readers"]

log = logging.getLogger(__name__)

_ACK_TIMEOUT_S = 5.0
_START_TIMEOUT_S = 60.0


class _Reader:
    """One reader process and its pipes."""

    def __init__(self, argv: list[str], n: int) -> None:
        self.n = n
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=PROJECT_ROOT, bufsize=1, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[str] = self.proc.stdin
        self.stdout: IO[str] = self.proc.stdout

    def port(self) -> int:
        line = self.stdout.readline()
        if not line:
            raise ConfigError(f"the query reader exited at start (code {self.proc.wait(10)}): see its "
                              "messages above (the query port in use? the TLS files?)")
        return int(json.loads(line)["port"])


class Readers:
    """N reader processes and what they are told (see the module docstring)."""

    def __init__(self, count: int, *, host: str, port: int, work_dir: Path, schemas_dir: Path,
                 registry_url: str | None, group_index: bool, directory: bool,
                 tls: tuple[Path, Path] | None, token_file: Path | None) -> None:
        self.count = count
        self._host = host
        self._port = port
        self._work = work_dir
        self._base = [sys.executable, "-m", "services.worker.query.reader", "--host", host,
                      "--schemas-dir", str(schemas_dir), "--group-index", str(int(group_index)),
                      "--directory", str(int(directory))]
        if registry_url:
            self._base += ["--registry-url", registry_url]
        if tls is not None:
            self._base += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
        if token_file is not None:
            self._base += ["--token-file", str(token_file)]
        self._lock = threading.Lock()  # one writer of the pipes at a time
        self._readers: list[_Reader] = []
        self._acks = 0
        self._hello: dict[str, Any] | None = None
        self._routing: dict[str, Any] | None = None
        self._views: dict[int, dict[str, Any]] = {}  # what a restarted reader is told again
        self._stopping = False
        self._watch: threading.Thread | None = None
        #: called with the new port when a restarted reader could not get the old one
        self.on_port: Callable[[int], None] | None = None

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
        self._watch = threading.Thread(target=self._watch_readers, name="query-readers", daemon=True)
        self._watch.start()
        return port

    def _watch_readers(self) -> None:
        """Start a reader again when it dies (not when the worker stops it)."""
        while not self._stopping:
            for r in list(self._readers):
                code = r.proc.poll()
                if code is None or self._stopping:
                    continue
                log.error("query reader %d exited (code %s): starting it again", r.n, code)
                with self._lock:
                    try:
                        fresh = _Reader(self._argv(r.n, self._port), r.n)
                        port = fresh.port()
                    except (OSError, ConfigError, ValueError) as exc:
                        log.error("query reader %d did not start again: %s", r.n, exc)
                        continue
                    self._readers[self._readers.index(r)] = fresh
                    for msg in [self._hello, self._routing, *self._views.values()]:
                        if msg is not None:
                            self._send(fresh, msg)
                if port != self._port and self.on_port is not None:
                    self._port = port
                    self.on_port(port)
            threading.Event().wait(0.5)

    def stop(self) -> None:
        self._stopping = True
        for r in self._readers:
            with contextlib.suppress(OSError):
                r.stdin.close()
        for r in self._readers:
            try:
                r.proc.wait(10)
            except subprocess.TimeoutExpired:
                r.proc.kill()
        shutil.rmtree(self._work, ignore_errors=True)

    # -- what the readers are told -------------------------------------------------------------
    @staticmethod
    def _send(r: _Reader, msg: dict[str, Any]) -> bool:
        try:
            r.stdin.write(json.dumps(msg) + "\n")
            r.stdin.flush()
            return True
        except (OSError, ValueError):  # a dead reader: the watcher starts it again
            return False

    def _tell(self, msg: dict[str, Any]) -> None:
        with self._lock:
            for r in self._readers:
                self._send(r, msg)

    def hello(self, worker: str, url: str, upstream: str) -> None:
        self._hello = {"op": "me", "worker": worker, "url": url, "upstream": upstream}
        self._tell(self._hello)

    def routing(self, input_partitions: int, directory_partitions: int) -> None:
        msg = {"op": "routing", "input_partitions": input_partitions, "directory_partitions": directory_partitions}
        if msg != self._routing:
            self._routing = msg
            self._tell(msg)

    def view(self, p: int, path: Path, view: View) -> None:
        msg = {"op": "view", "p": p, "path": str(path), "position": view.position, "seq": view.seq}
        with self._lock:
            self._views[p] = msg
            for r in self._readers:
                self._send(r, msg)

    def withdraw(self, p: int) -> None:
        """Every reader has closed its secondary of p when this returns (or is dead, or did
        not answer within 5 s: then it is started again, which closes its secondaries)."""
        with self._lock:
            if self._views.pop(p, None) is None:
                return  # never sent: no reader reads it
            self._acks += 1
            ack = self._acks
            for r in self._readers:
                if not self._send(r, {"op": "withdraw", "p": p, "ack": ack}):
                    continue
                if not self._await(r, ack):
                    log.error("query reader %d did not let go of partition %d: stopping it", r.n, p)
                    r.proc.kill()

    @staticmethod
    def _await(r: _Reader, ack: int) -> bool:
        done = threading.Event()
        got: list[bool] = []

        def read() -> None:
            while True:
                line = r.stdout.readline()
                if not line:
                    break
                try:
                    if json.loads(line).get("ack") == ack:
                        got.append(True)
                        break
                except ValueError:
                    continue
            done.set()

        threading.Thread(target=read, daemon=True).start()
        done.wait(_ACK_TIMEOUT_S)
        return bool(got)


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
