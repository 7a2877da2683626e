"""The Apache Kafka jars of the local cluster: resolved once from Maven Central, then reused.

Maven (with ``pom.xml`` beside this module) copies Kafka and a log4j2 backend into a cache
directory (``<home>/kafka/libs`` by default, git-ignored). A marker file records what was
fetched, so a later ``fifolane kafka up`` starts without touching the network. Downloads go
to a temporary sibling directory and are renamed into place, under a file lock, so two
processes (two test sessions, say) never see a half-filled cache.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fifolane.errors import ClusterError

__all__ = ["KAFKA_VERSION", "POM_PATH", "ensure_jars", "file_lock", "jars_present"]

KAFKA_VERSION = "4.1.1"
POM_PATH = Path(__file__).with_name("pom.xml")
_MARKER = ".fifolane-complete"


def jars_present(libs: Path) -> bool:
    """True if ``libs`` holds a complete copy made from the current pom."""
    marker = libs / _MARKER
    return marker.is_file() and marker.read_text().strip() == _marker_text()


def _marker_text() -> str:
    # The pom's content is part of the marker: editing the pom (a new Kafka version) refetches.
    return f"kafka {KAFKA_VERSION}\n{POM_PATH.read_text()}".strip()


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_jars(libs: Path, *, timeout: float = 900.0) -> bool:
    """Make sure ``libs`` holds the Kafka jars; returns True if they had to be downloaded.

    Raises :class:`ClusterError` if Maven is missing or fails (with its output).
    """
    if jars_present(libs):
        return False
    with file_lock(libs.parent / ".libs.lock"):
        if jars_present(libs):  # another process fetched them while we waited
            return False
        mvn = shutil.which("mvn")
        if mvn is None:
            raise ClusterError("Maven (mvn) is not on PATH: it is needed once to fetch the Kafka jars")
        tmp = libs.with_name(libs.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [
            mvn, "-q", "-B", "-f", str(POM_PATH),
            "dependency:copy-dependencies",
            f"-DoutputDirectory={tmp}",
            "-DincludeScope=runtime",
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"fetching the Kafka jars took longer than {timeout:.0f}s") from exc
        if proc.returncode != 0 or not any(tmp.glob("kafka_2.13-*.jar")):
            output = (proc.stdout + proc.stderr).strip().splitlines()[-30:]
            raise ClusterError(
                f"fetching the Kafka jars failed ({' '.join(cmd)}):\n" + "\n".join(output)
            )
        (tmp / _MARKER).write_text(_marker_text())
        shutil.rmtree(libs, ignore_errors=True)
        tmp.rename(libs)
        return True
