"""The Kafka Streams baseline app (``benchmarks/kstreams/``): built once, then run as a JVM.

:func:`ensure_app` runs ``mvn -q package`` on ``benchmarks/kstreams/pom.xml`` into a
git-ignored cache (``.fifolane/kstreams``), the way :mod:`fifolane.cluster.jars` caches
the Kafka jars: a marker records a hash of the pom and the sources, so the build runs
again only when they change; the build goes to a temporary sibling and is renamed into
place under a file lock. :func:`app_cmd` is the ``java`` command line of one run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from fifolane.cluster.jars import KAFKA_VERSION, file_lock
from fifolane.config import PROJECT_ROOT

__all__ = ["APP_DIR", "BUILD_DIR", "GUARANTEE", "KafkaStreamsError", "app_cmd", "built", "ensure_app", "java",
           "java_version"]

APP_DIR = Path(__file__).resolve().parent / "kstreams"
BUILD_DIR = PROJECT_ROOT / ".fifolane" / "kstreams" / "build"
MAIN_CLASS = "io.fifolane.bench.TableApp"
_MARKER = ".fifolane-complete"
#: Kafka Streams' processing.guarantee per fifolane guarantee name.
GUARANTEE = {"exactly-once": "exactly_once_v2", "at-least-once": "at_least_once"}


class KafkaStreamsError(RuntimeError):
    """The Kafka Streams app could not be built (Maven missing or failing) or run."""


def _sources_hash() -> str:
    h = hashlib.sha256(f"kafka {KAFKA_VERSION}\n".encode())
    for path in sorted([APP_DIR / "pom.xml", *APP_DIR.glob("src/**/*.java")]):
        h.update(str(path.relative_to(APP_DIR)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def built(build: Path = BUILD_DIR) -> bool:
    """True if ``build`` holds a complete build of the current pom and sources."""
    marker = build / _MARKER
    return marker.is_file() and marker.read_text().strip() == _sources_hash()


def ensure_app(build: Path = BUILD_DIR, *, timeout: float = 900.0,
               on_progress: Callable[[str], None] | None = None) -> Path:
    """Build the app into ``build`` unless a current build is there; returns ``build``.

    ``on_progress`` gets a line every few seconds while Maven runs (the first build downloads
    kafka-streams, RocksDB and Avro from Maven Central). Raises :class:`KafkaStreamsError`.
    """
    if built(build):
        return build
    with file_lock(build.parent / ".build.lock"):
        if built(build):  # another process built it while we waited
            return build
        mvn = shutil.which("mvn")
        if mvn is None:
            raise KafkaStreamsError("Maven (mvn) is not on PATH: it is needed once to build "
                                    "the Kafka Streams benchmark app")
        tmp = build.with_name(build.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [mvn, "-q", "-B", "-f", str(APP_DIR / "pom.xml"), "package", f"-Dkstreams.build={tmp}"]
        done = threading.Event()
        t0 = time.monotonic()

        def tick() -> None:
            while not done.wait(5.0):
                if on_progress is not None:
                    on_progress(f"building the Kafka Streams app (mvn package): {time.monotonic() - t0:.0f}s")

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise KafkaStreamsError(f"building the Kafka Streams app took longer than {timeout:.0f}s") from exc
        finally:
            done.set()
        if proc.returncode != 0 or not (tmp / "libs").is_dir():
            output = (proc.stdout + proc.stderr).strip().splitlines()[-30:]
            raise KafkaStreamsError(f"building the Kafka Streams app failed ({' '.join(cmd)}):\n"
                                    + "\n".join(output))
        (tmp / _MARKER).write_text(_sources_hash())
        shutil.rmtree(build, ignore_errors=True)
        tmp.rename(build)
        if on_progress is not None:
            on_progress(f"built the Kafka Streams app in {time.monotonic() - t0:.0f}s")
        return build


def java() -> str:
    """The ``java`` to run the app with (``JAVA_HOME`` first, as the local cluster does)."""
    home = os.environ.get("JAVA_HOME")
    path = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not path or not Path(path).exists():
        raise KafkaStreamsError("no Java runtime found (install Java 17+ or set JAVA_HOME)")
    return path


def java_version() -> str | None:
    """``java -version``'s first line, for the results (None without a Java runtime)."""
    try:
        out = subprocess.run([java(), "-version"], capture_output=True, text=True, timeout=30)
    except (KafkaStreamsError, OSError, subprocess.SubprocessError):
        return None
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[0] if lines else None


def app_cmd(build: Path, *, bootstrap: str, input_topic: str, output_topic: str, app_id: str,
            state_dir: Path, guarantee: str, variant: str, commit_interval: float,
            warmup: tuple[str, str, int] | None = None, heap_mb: int = 1024) -> list[str]:
    """``java ... TableApp`` for one run; ``warmup`` = (input, output, events) warms the JIT first."""
    cmd = [java(), f"-Xmx{heap_mb}m", "-XX:+UseG1GC", "-Djava.awt.headless=true",
           "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
           "-cp", f"{build / 'classes'}{os.pathsep}{build / 'libs'}/*", MAIN_CLASS,
           "--bootstrap", bootstrap, "--input", input_topic, "--output", output_topic,
           "--application-id", app_id, "--state-dir", str(state_dir),
           "--schemas", str(PROJECT_ROOT / "schemas"), "--guarantee", GUARANTEE[guarantee],
           "--variant", variant, "--commit-interval-ms", str(round(commit_interval * 1000))]
    if warmup is not None:
        cmd += ["--warmup-input", warmup[0], "--warmup-output", warmup[1], "--warmup-events", str(warmup[2])]
    return cmd
