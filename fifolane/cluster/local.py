"""A real Apache Kafka cluster (KRaft, combined broker+controller nodes) as local JVM processes.

Layout under ``<home>/kafka/``::

    libs/                 the jars (see :mod:`fifolane.cluster.jars`), shared and reused
    layout.json           broker count, cluster id and ports of the formatted data (kept by down)
    cluster.json          the running cluster: bootstrap servers, pids, ports (removed by down)
    node-<i>/server.properties, log4j2.properties, server.log, stdout.log, data/

``cluster.json`` is what :meth:`fifolane.config.Settings.resolved_bootstrap` reads, and the
only source of pids that :meth:`LocalCluster.down` will signal: it stops what ``up`` started
and nothing else (each pid is also checked to be a JVM running that node's config).
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import signal
import subprocess
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from fifolane.cluster.jars import ensure_jars, file_lock
from fifolane.cluster.ports import free_port, pick_ports, port_free
from fifolane.cluster.properties import NodePorts, log4j2_properties, server_properties
from fifolane.cluster.secure import ADMIN_USER, SecureFiles, ensure_secure_files
from fifolane.errors import ClusterError

__all__ = ["BrokerStatus", "ClusterStatus", "LocalCluster", "free_port"]

log = logging.getLogger(__name__)
_LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class BrokerStatus:
    """One node of the local cluster."""

    node_id: int
    pid: int | None
    alive: bool
    port: int
    controller_port: int
    log_file: Path


@dataclass(frozen=True)
class ClusterStatus:
    """What ``up`` / ``status`` report."""

    running: bool
    bootstrap_servers: str | None
    brokers: list[BrokerStatus] = field(default_factory=list)
    already_running: bool = False
    jars_downloaded: bool = False


def _new_cluster_id() -> str:
    # Kafka's Uuid.toString(): url-safe base64 of 16 random bytes, without padding. Like
    # Kafka's own generator, never one starting with '-': the storage tool would read it
    # as an option.
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) or "(empty log)"


class LocalCluster:
    """Apache Kafka run from its jars, in KRaft combined mode on 127.0.0.1.

    ``brokers`` nodes (1 or 3 in practice), each both broker and controller. ``libs`` is the
    jar cache (default ``<home>/kafka/libs``); tests point several homes at one cache.
    ``preferred_port`` is tried for the first broker (the CLI passes 9092); ``port`` is the
    first broker's client port, or a :class:`ClusterError` if it cannot be had.
    """

    def __init__(
        self,
        home: Path,
        brokers: int = 1,
        *,
        libs: Path | None = None,
        preferred_port: int | None = None,
        port: int | None = None,
        heap_mb: int | None = None,
        secure: bool = False,
    ) -> None:
        if brokers < 1:
            raise ClusterError(f"brokers must be >= 1, got {brokers}")
        self.home = Path(home)
        self.dir = self.home / "kafka"
        self.libs = Path(libs) if libs else self.dir / "libs"
        self.brokers = brokers
        self.preferred_port = preferred_port
        self.port = port
        self.heap_mb = heap_mb or (512 if brokers == 1 else 384)
        self.state_file = self.dir / "cluster.json"
        self._layout_file = self.dir / "layout.json"
        # Popen handles of the nodes this object started, so dead children are reaped
        # (a zombie would otherwise look alive to kill(pid, 0)).
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        # TLS + SASL/SCRAM + ACLs (fifolane.cluster.secure); its files live in <dir>/secure.
        self.secure = secure
        self.secure_files = SecureFiles(self.dir / "secure")

    # --- paths ----------------------------------------------------------------------------
    def node_dir(self, i: int) -> Path:
        """Directory of node ``i`` (config, logs, data)."""
        return self.dir / f"node-{i}"

    def log_file(self, i: int) -> Path:
        """The broker log of node ``i``."""
        return self.node_dir(i) / "server.log"

    @property
    def bootstrap_servers(self) -> str:
        """``host:port,...`` of the running cluster (raises if it is not running)."""
        state = self._read_state()
        if state is None:
            raise ClusterError(f"no local Kafka is running under {self.dir} (run `fifolane kafka up`)")
        return str(state["bootstrap_servers"])

    # --- public API -----------------------------------------------------------------------
    def fetch(self) -> bool:
        """Download the jars if needed; True if a download happened."""
        return ensure_jars(self.libs)

    def status(self) -> ClusterStatus:
        """Which nodes of the recorded cluster are alive (no network calls)."""
        state = self._read_state()
        if state is None:
            return ClusterStatus(running=False, bootstrap_servers=None)
        brokers = [
            BrokerStatus(
                node_id=i,
                pid=pid,
                alive=pid is not None and self._alive(i, pid),
                port=int(ports["broker"]),
                controller_port=int(ports["controller"]),
                log_file=self.log_file(i),
            )
            for i, (pid, ports) in enumerate(zip(state["pids"], state["ports"], strict=True))
        ]
        return ClusterStatus(
            running=all(b.alive for b in brokers),
            bootstrap_servers=str(state["bootstrap_servers"]),
            brokers=brokers,
        )

    def up(self, timeout: float = 90.0, *, fresh: bool = False) -> ClusterStatus:
        """Start the cluster and wait until every broker answers; idempotent.

        ``fresh`` wipes earlier data first. Raises :class:`ClusterError` (with the failing
        node's log tail) if a node exits or the cluster does not answer within ``timeout``.
        """
        with file_lock(self.dir / ".up.lock"):
            current = self.status()
            if current.bootstrap_servers is not None:
                if bool((self._read_state() or {}).get("secure")) != self.secure and any(b.alive for b in current.brokers):
                    raise ClusterError(
                        f"a local Kafka {'with' if not self.secure else 'without'} --secure is running "
                        f"under {self.dir}; run `fifolane kafka down` first"
                    )
                if current.running and current.brokers and self.port not in (None, current.brokers[0].port):
                    raise ClusterError(f"a local Kafka is running under {self.dir} on port {current.brokers[0].port}; "
                                       f"run `fifolane kafka down` first to start it on port {self.port}")
                if current.running and len(current.brokers) == self.brokers:
                    return ClusterStatus(
                        running=True,
                        bootstrap_servers=current.bootstrap_servers,
                        brokers=current.brokers,
                        already_running=True,
                    )
                if any(b.alive for b in current.brokers):
                    if len(current.brokers) != self.brokers or fresh or self.port not in (None, current.brokers[0].port):
                        raise ClusterError(f"a local Kafka with {len(current.brokers)} node(s) is (partly) "
                                           f"running under {self.dir}; run `fifolane kafka down` first")
                    for i, b in enumerate(current.brokers):  # nodes that stopped: started again
                        if not b.alive:
                            self.start_broker(i, timeout)
                    return self.status()
                self.state_file.unlink(missing_ok=True)  # stale: every recorded pid is gone
            downloaded = ensure_jars(self.libs)
            ports, cluster_id = self._prepare(fresh)
            self._format(cluster_id)
            try:
                for i in range(self.brokers):
                    self._spawn(i)
                self._write_state(ports, [self._procs[i].pid for i in range(self.brokers)])
                self._wait_ready(timeout)
            except BaseException:
                self._stop_pids({i: p.pid for i, p in self._procs.items()}, timeout=5.0)
                self.state_file.unlink(missing_ok=True)
                raise
            status = self.status()
            return ClusterStatus(
                running=status.running,
                bootstrap_servers=status.bootstrap_servers,
                brokers=status.brokers,
                jars_downloaded=downloaded,
            )

    def down(self, timeout: float = 30.0) -> list[int]:
        """Stop the nodes recorded in ``cluster.json`` (SIGTERM, SIGKILL after ``timeout``).

        Returns the pids that were signalled; removes the state file.
        """
        with file_lock(self.dir / ".up.lock"):
            state = self._read_state()
            if state is None:
                return []
            pids = {i: pid for i, pid in enumerate(state["pids"]) if pid is not None}
            stopped = self._stop_pids(pids, timeout)
            self.state_file.unlink(missing_ok=True)
            return stopped

    def kill_broker(self, i: int, *, graceful: bool = False, timeout: float = 30.0) -> None:
        """Stop node ``i``: SIGKILL (a crash) by default, SIGTERM (controlled shutdown) if graceful."""
        state = self._require_state()
        pid = state["pids"][i]
        if pid is None or not self._alive(i, pid):
            raise ClusterError(f"broker {i} is not running")
        self._stop_pids({i: pid}, timeout=timeout, sig=signal.SIGTERM if graceful else signal.SIGKILL)
        state["pids"][i] = None
        self._save(state)

    def pause_broker(self, i: int) -> None:
        """Freeze node ``i`` (SIGSTOP): it keeps its sockets and state but answers nothing,
        as a broker in a long GC pause or on a stalled VM. :meth:`resume_broker` thaws it."""
        self._signal_live(i, signal.SIGSTOP)

    def resume_broker(self, i: int) -> None:
        """Thaw node ``i`` after :meth:`pause_broker` (SIGCONT)."""
        self._signal_live(i, signal.SIGCONT)

    def _signal_live(self, i: int, sig: signal.Signals) -> None:
        pid = self._require_state()["pids"][i]
        if pid is None or not self._alive(i, pid):
            raise ClusterError(f"broker {i} is not running")
        _signal(pid, sig)

    def start_broker(self, i: int, timeout: float = 240.0) -> None:
        """Restart node ``i`` (after :meth:`kill_broker`) and wait until it serves requests
        (after a SIGKILL it first recovers its logs: over 60 s on 2 busy cores)."""
        state = self._require_state()
        if (pid := state["pids"][i]) is not None and self._alive(i, pid):
            return
        proc = self._spawn(i)
        state["pids"][i] = proc.pid
        self._save(state)
        port = int(state["ports"][i]["broker"])
        deadline = time.monotonic() + timeout
        # Ask the restarted broker itself: the cluster may still list its old registration.
        while not self._answers(f"127.0.0.1:{port}", expect_brokers=None, node_id=i):
            self._check_alive(i)
            if time.monotonic() > deadline:
                raise ClusterError(f"broker {i} did not come back within {timeout:.0f}s; {self.failure_report(i)}")

    # --- internals ------------------------------------------------------------------------
    def _prepare(self, fresh: bool) -> tuple[list[NodePorts], str]:
        """Choose ports and a cluster id; keep earlier data only if its layout still fits."""
        layout = self._read_json(self._layout_file)
        if self.port is not None and not port_free("127.0.0.1", self.port):
            raise ClusterError(f"port {self.port} on 127.0.0.1 is taken: choose another --port, "
                               f"or stop what listens there")
        new_users = self.secure and ensure_secure_files(self.secure_files.dir)[1]
        keep = (
            not fresh
            and not new_users  # SCRAM users are added when the storage is formatted
            and layout is not None
            and layout.get("brokers") == self.brokers
            and layout.get("secure", False) == self.secure
        )
        strict = self.port is not None
        if keep:
            assert layout is not None
            # The data stays on other ports too (a static quorum: the voters are in the config,
            # and each broker registers its address as it starts): every port of the layout
            # that is still free is kept, --port is the first node's, the others are new.
            earlier = [NodePorts(**n) for n in layout["ports"]]
            ports = pick_ports(self.brokers, self.port, strict=strict, earlier=earlier)
            cluster_id = str(layout["cluster_id"])
        else:
            # Another size, security or set of users: the formatted storage does not fit.
            for node in self.dir.glob("node-*"):
                shutil.rmtree(node, ignore_errors=True)
            ports = pick_ports(self.brokers, self.port or self.preferred_port, strict=strict)
            cluster_id = _new_cluster_id()
        for i in range(self.brokers):
            node = self.node_dir(i)
            (node / "data").mkdir(parents=True, exist_ok=True)
            security = self.secure_files.broker_properties() if self.secure else None
            (node / "server.properties").write_text(server_properties(i, ports, node / "data", security))
            (node / "log4j2.properties").write_text(log4j2_properties(self.log_file(i)))
        self._layout_file.write_text(json.dumps({
            "brokers": self.brokers,
            "secure": self.secure,
            "cluster_id": cluster_id,
            "ports": [{"broker": p.broker, "controller": p.controller} for p in ports],
        }, indent=2))
        return ports, cluster_id

    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
        if not java or not Path(java).exists():
            raise ClusterError("no Java runtime found (install Java 17+ or set JAVA_HOME)")
        return java

    def _jvm(self, i: int, *, heap_mb: int) -> list[str]:
        node = self.node_dir(i)
        return [
            self._java(),
            f"-Xmx{heap_mb}m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={node / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={node}",
            "-cp",
            f"{self.libs}/*",
        ]

    def _format(self, cluster_id: str) -> None:
        """Format every node's storage (in parallel: each is a JVM start); skip formatted ones."""
        procs = []
        for i in range(self.brokers):
            node = self.node_dir(i)
            if (node / "data" / "meta.properties").is_file():
                continue
            cmd = self._jvm(i, heap_mb=256) + [
                "kafka.tools.StorageTool", "format",
                "-t", cluster_id, "-c", str(node / "server.properties"), "--ignore-formatted",
            ] + (self.secure_files.format_args() if self.secure else [])
            out = (node / "format.log").open("wb")
            procs.append((i, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=node), out))
        for i, proc, out in procs:
            code = proc.wait(timeout=120)
            out.close()
            if code != 0:
                log_path = self.node_dir(i) / "format.log"
                raise ClusterError(f"formatting node {i} failed; log {log_path}:\n{_tail(log_path)}")

    def _spawn(self, i: int) -> subprocess.Popen[bytes]:
        node = self.node_dir(i)
        cmd = self._jvm(i, heap_mb=self.heap_mb) + ["kafka.Kafka", str(node / "server.properties")]
        with (node / "stdout.log").open("ab") as out:
            # A new session: Ctrl-C in the terminal that ran `fifolane kafka up` must not
            # reach the brokers, which outlive that command.
            proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=node, start_new_session=True,
            )
        self._procs[i] = proc
        log.info("started Kafka node %d (pid %d)", i, proc.pid)
        return proc

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        bootstrap = self.bootstrap_servers
        while not self._answers(bootstrap, expect_brokers=self.brokers):
            for i in range(self.brokers):
                self._check_alive(i)
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"local Kafka did not answer within {timeout:.0f}s; {self.failure_report(0)}"
                )

    def _answers(self, bootstrap: str, expect_brokers: int | None, node_id: int | None = None) -> bool:
        """One metadata request: do all expected brokers (or ``node_id``) answer?"""
        conf: dict[str, Any] = {
            **(self.secure_files.librdkafka_config(ADMIN_USER) if self.secure else {}),
            "bootstrap.servers": bootstrap,
            "log_level": 0,  # connection-refused noise while the JVM starts
            "error_cb": lambda _err: None,
            "socket.connection.setup.timeout.ms": 1000,
        }
        admin = AdminClient(conf)
        try:
            md = admin.list_topics(timeout=1.5)
        except KafkaException:
            return False
        if node_id is not None:
            return md.orig_broker_id == node_id
        return expect_brokers is None or len(md.brokers) >= expect_brokers

    def _check_alive(self, i: int) -> None:
        proc = self._procs.get(i)
        if proc is not None and proc.poll() is not None:
            raise ClusterError(f"Kafka node {i} exited with code {proc.returncode}; {self.failure_report(i)}")

    def failure_report(self, i: int) -> str:
        """Where node ``i`` logs and the last lines: its log4j log and the JVM's own output
        (stdout.log holds what happens before logging starts: bad JVM options, OOM exits)."""
        report = f"log {self.log_file(i)}:\n{_tail(self.log_file(i))}"
        stdout = self.node_dir(i) / "stdout.log"
        if stdout.is_file() and stdout.stat().st_size:
            report += f"\nJVM output {stdout}:\n{_tail(stdout, 10)}"
        return report

    def _alive(self, i: int, pid: int) -> bool:
        """Is ``pid`` alive and really node ``i`` (not a recycled pid)?"""
        proc = self._procs.get(i)
        if proc is not None and proc.pid == pid and proc.poll() is not None:
            return False
        if Path("/proc/self").is_dir():
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                return False
            if stat.rsplit(")", 1)[-1].split()[0] == "Z":
                return False
            return str(self.node_dir(i) / "server.properties").encode() in args
        try:  # no /proc (macOS): trust the pid
            os.kill(pid, 0)
        except OSError:
            return False
        return True

    def _stop_pids(
        self, pids: dict[int, int], timeout: float, sig: signal.Signals = signal.SIGTERM
    ) -> list[int]:
        ours = {i: pid for i, pid in pids.items() if self._alive(i, pid)}
        for pid in ours.values():
            _signal(pid, sig)
        deadline = time.monotonic() + timeout
        while any(self._alive(i, pid) for i, pid in ours.items()):
            if time.monotonic() > deadline:
                for i, pid in ours.items():
                    if self._alive(i, pid):
                        log.warning("Kafka node %d (pid %d) ignored %s; killing", i, pid, sig.name)
                        _signal(pid, signal.SIGKILL)
                deadline = time.monotonic() + 10.0
            time.sleep(0.05)  # polling a process we just signalled; not a test wait
        for i in ours:
            proc = self._procs.pop(i, None)
            if proc is not None:
                proc.wait(timeout=5)
        return list(ours.values())

    def _write_state(self, ports: list[NodePorts], pids: list[int | None]) -> None:
        self._save({
            "bootstrap_servers": ",".join(f"127.0.0.1:{p.broker}" for p in ports),
            "brokers": self.brokers,
            "secure": self.secure,
            "pids": pids,
            "ports": [{"broker": p.broker, "controller": p.controller} for p in ports],
            "home": str(self.home),
            "logs": [str(self.log_file(i)) for i in range(self.brokers)],
        })

    def _save(self, state: dict[str, Any]) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_file)  # atomic: readers never see half a file

    def _read_state(self) -> dict[str, Any] | None:
        return self._read_json(self.state_file)

    def _require_state(self) -> dict[str, Any]:
        state = self._read_state()
        if state is None:
            raise ClusterError(f"no local Kafka is running under {self.dir}")
        return state

    @staticmethod
    def _read_json(path: Path) -> dict[str, Any] | None:
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except ValueError as exc:
            raise ClusterError(f"corrupt state file {path}: {exc}; remove it") from exc
        return data if isinstance(data, dict) else None


def _signal(pid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, sig)
