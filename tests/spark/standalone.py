"""A real Spark standalone cluster for tests: one master and N workers as local JVMs.

They run from pyspark's own distribution (``bin/spark-class`` with
``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``, the jars pyspark ships),
on 127.0.0.1 with free ports; no Docker. Sized for a shared 2-core machine: one core and
1 GiB per worker, 256 MiB heaps for the daemons themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark
from kafka_fixtures import wait_until

from fifolane.cluster.ports import free_port

__all__ = ["StandaloneCluster", "start_standalone"]

SPARK_HOME = Path(pyspark.__file__).parent


@dataclass
class StandaloneCluster:
    """A running master and its workers; ``stop()`` ends them (and their executors)."""

    master_url: str
    web_url: str
    root: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def logs(self) -> Path:
        """Folder with the master's and every worker's output."""
        return self.root / "logs"

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers, active and completed applications)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as answer:
            data: dict[str, Any] = json.load(answer)
        return data

    def alive_workers(self) -> int:
        try:
            return int(self.state()["aliveworkers"])
        except OSError:
            return 0

    def work_dirs(self) -> list[Path]:
        """Each worker's work folder (``<app id>/<executor id>/`` with stderr and fetched jars)."""
        return sorted(self.root.glob("worker-*/work"))

    def stop(self) -> None:
        """SIGTERM every daemon (workers first: they stop their executors), then wait."""
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def describe(self) -> str:
        """The end of every daemon log (for a failed wait)."""
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {log.name}\n" + "\n".join(lines))
        return "\n".join(parts)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
        "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
        # No REST submission server (it would take the fixed port 6066).
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        # Executors that ever start Python use this interpreter (the test's venv).
        "PYSPARK_PYTHON": sys.executable,
    })
    return env


def _launch(cluster: StandaloneCluster, name: str, args: list[str]) -> None:
    log = cluster.logs / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=_env(),
            cwd=cluster.root,
        )
    cluster.processes.append(proc)


def start_standalone(root: Path, *, workers: int = 2, cores: int = 1, memory: str = "1g",
                     timeout: float = 120.0) -> StandaloneCluster:
    """Start a master and ``workers`` workers under ``root``; return once all registered."""
    port, web_port = free_port(), free_port()
    cluster = StandaloneCluster(f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}", root)
    cluster.logs.mkdir(parents=True, exist_ok=True)
    try:
        _launch(cluster, "master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                    "--port", str(port), "--webui-port", str(web_port)])
        for i in range(1, workers + 1):
            work = root / f"worker-{i}" / "work"
            work.mkdir(parents=True, exist_ok=True)
            _launch(cluster, f"worker-{i}", [
                "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--cores", str(cores), "--memory", memory, "--work-dir", str(work),
                "--webui-port", str(free_port()), cluster.master_url,
            ])

        def registered() -> bool:
            if any(p.poll() is not None for p in cluster.processes):
                raise AssertionError(f"a Spark daemon exited while starting:\n{cluster.describe()}")
            return cluster.alive_workers() == workers

        wait_until(registered, timeout=timeout, interval=0.5,
                   message=lambda: f"{workers} workers to register with {cluster.master_url}:\n"
                                   f"{cluster.describe()}")
    except BaseException:
        cluster.stop()
        raise
    return cluster
