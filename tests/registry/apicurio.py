"""A real Apicurio Registry for tests: fetched from Maven Central, run as a local JVM.

Apicurio Registry speaks the Confluent Schema Registry API under ``/apis/ccompat/v7``, the
API fifolane's Confluent wire format uses (``fifolane.serde.confluent.RegistryClient``).
:func:`ensure_apicurio` fetches the Quarkus distribution once with Maven (``pom.xml``
beside this module) into ``<home>/apicurio/<version>`` (git-ignored);
:func:`start_apicurio` runs it on 127.0.0.1 with in-memory storage. Version 3.3.3 needs a
Java 21+ runtime: :func:`find_java` looks at ``JAVA_HOME``, ``java`` on ``PATH`` and the
JDKs under ``/usr/lib/jvm``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kafka_fixtures import wait_until

from fifolane.cluster.jars import file_lock
from fifolane.cluster.ports import free_port

__all__ = ["APICURIO_VERSION", "ApicurioRegistry", "ensure_apicurio", "find_java", "start_apicurio"]

APICURIO_VERSION = "3.3.3"
JAVA_MIN = 21  # apicurio-registry-app 3.3.x is compiled for Java 21 (class files version 65)
POM = Path(__file__).with_name("pom.xml")
_MARKER = ".fifolane-complete"


def java_major(java: Path) -> int | None:
    """The major version of a ``java`` executable (None if it does not run)."""
    try:
        proc = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', proc.stderr + proc.stdout)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major  # "1.8" is Java 8


def find_java(minimum: int = JAVA_MIN) -> Path:
    """A ``java`` of version ``minimum`` or newer, or AssertionError naming what was found."""
    candidates: list[Path] = []
    if os.environ.get("JAVA_HOME"):
        candidates.append(Path(os.environ["JAVA_HOME"]) / "bin" / "java")
    on_path = shutil.which("java")
    if on_path:
        candidates.append(Path(on_path))
    candidates += sorted(Path("/usr/lib/jvm").glob("*/bin/java"), reverse=True)
    found: dict[str, int | None] = {}
    for java in candidates:
        major = found[str(java)] = java_major(java)
        if major is not None and major >= minimum:
            return java
    described = ", ".join(f"{j} (Java {v})" if v else f"{j} (does not run)" for j, v in found.items())
    raise AssertionError(
        f"Apicurio Registry {APICURIO_VERSION} needs Java {minimum}+; found {described or 'no java'}. "
        f"Install a JDK {minimum}+ (for example Temurin 21) and point JAVA_HOME at it."
    )


def ensure_apicurio(home: Path, *, timeout: float = 900.0) -> Path:
    """The unpacked distribution (folder with ``quarkus-run.jar``), fetched once."""
    target = home / "apicurio" / APICURIO_VERSION
    marker = target / _MARKER
    if marker.is_file():
        return target
    with file_lock(target.parent / ".fetch.lock"):
        if marker.is_file():
            return target
        download = target.parent / f"{APICURIO_VERSION}.download"
        shutil.rmtree(download, ignore_errors=True)
        cmd = ["mvn", "-q", "-B", "-f", str(POM), "dependency:copy", f"-DoutputDirectory={download}",
               f"-Dapicurio.version={APICURIO_VERSION}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        archives = sorted(download.glob("apicurio-registry-app-*-all.tar.gz"))
        if proc.returncode != 0 or not archives:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
            raise AssertionError(f"fetching Apicurio Registry failed ({' '.join(cmd)}):\n{tail}")
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with tarfile.open(archives[0]) as archive:
            archive.extractall(partial, filter="data")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
        shutil.rmtree(download, ignore_errors=True)
        (target / _MARKER).write_text(f"apicurio-registry-app {APICURIO_VERSION}\n")
    return target


@dataclass
class ApicurioRegistry:
    """A running registry; ``url`` is its Confluent-compatible API."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        """SIGTERM, then wait (SIGKILL after 30 s)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=2) as answer:
            return int(answer.status) == 200
    except OSError:
        return False


def start_apicurio(home: Path, workdir: Path, *, timeout: float = 180.0) -> ApicurioRegistry:
    """Start the registry on 127.0.0.1 (free ports) and wait until its API answers."""
    dist = ensure_apicurio(home)
    java = find_java()
    port, management = free_port(), free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "apicurio.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [str(java), "-Xmx384m", "-XX:TieredStopAtLevel=1",
             "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={port}",
             # the management interface (health, metrics) would listen on 0.0.0.0:9000
             "-Dquarkus.management.host=127.0.0.1", f"-Dquarkus.management.port={management}",
             "-jar", str(dist / "quarkus-run.jar")],
            cwd=workdir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )
    registry = ApicurioRegistry(f"http://127.0.0.1:{port}/apis/ccompat/v7", proc, log)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"Apicurio Registry exited ({proc.returncode}):\n"
                                 + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
        return _answers(registry.url)

    try:
        wait_until(up, timeout=timeout, interval=0.5, message=lambda: f"Apicurio Registry on port {port}")
    except BaseException:
        registry.stop()
        raise
    return registry
