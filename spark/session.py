"""The one SparkSession factory for fifolane's batch views.

Spark's Kafka source and Avro functions are not in pyspark's wheel: they are resolved from
Maven Central through ``spark.jars.packages`` (exact pins, see :mod:`spark.packages`) into
an ivy cache under ``<settings.home>/spark/ivy`` (git-ignored), so they are downloaded once.
On a cluster the driver ships them to the executors (``spark.jars``).

Spark's own output (the ivy resolution report, log4j WARN lines) goes to a log file under
``<settings.home>/spark/logs/``, not to the terminal: the JVM's stdout and stderr are that
file. :func:`session_log` says which file a session writes to.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

from py4j.protocol import Py4JError
from pyspark import SparkConf, SparkContext
from pyspark.errors import PySparkRuntimeError
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

from fifolane.errors import FifolaneError
from spark.packages import check_versions, connector_packages

__all__ = ["SparkStartError", "check_master_reachable", "get_session", "ivy_dir", "new_log_file", "session_log", "spark_home",
           "spark_running"]

# Small-machine defaults (2 cores, a few GB): few shuffle partitions, no UI, UTC everywhere
# so Avro dates and Kafka timestamps read the same on every machine.
_DEFAULTS: dict[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.default.parallelism": "4",
    "spark.driver.memory": "2g",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.adaptive.enabled": "true",
    "spark.driver.extraJavaOptions": "-Duser.timezone=UTC",
    "spark.executor.extraJavaOptions": "-Duser.timezone=UTC",
    # Every Spark distribution ships its own Hadoop client: do not add a second copy.
    "spark.jars.excludes": (
        "org.apache.hadoop:hadoop-client-runtime,org.apache.hadoop:hadoop-client-api"
    ),
}
#: conf key under which a session records its log file (read by :func:`session_log`)
LOG_CONF = "spark.fifolane.logFile"
_LOCAL = re.compile(r"^local(\[.*\])?$")


class SparkStartError(FifolaneError):
    """Spark could not start (connectors not resolvable, JVM failed, another session runs)."""


def spark_home(home: Path | None = None) -> Path:
    """``<settings.home>/spark``: ivy cache and logs (never committed)."""
    if home is None:
        from fifolane.config import load_settings

        home = load_settings().home
    return Path(home) / "spark"


def ivy_dir(home: Path | None = None) -> Path:
    """The ivy cache used for connector jars: ``<settings.home>/spark/ivy``."""
    return spark_home(home) / "ivy"


def new_log_file(home: Path | None, app_name: str) -> Path:
    """A fresh log file ``<home>/spark/logs/<app>-<UTC time>-<pid>.log`` (folder created)."""
    logs = spark_home(home) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return logs / f"{app_name}-{stamp}-{os.getpid()}.log"


def session_log(session: SparkSession) -> Path | None:
    """The file that receives this session's JVM output (ivy report, Spark log lines)."""
    value = session.sparkContext.getConf().get(LOG_CONF)
    return Path(value) if value else None


def spark_running() -> bool:
    """Does this process already have a SparkContext (which :func:`get_session` returns)?"""
    return SparkContext._active_spark_context is not None


def _same_master(running: str, wanted: str) -> bool:
    # local[2] and local[*] are the same kind of place; a cluster URL must match exactly.
    return running == wanted or bool(_LOCAL.match(running) and _LOCAL.match(wanted))


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log written)"
    return "\n".join(text[-lines:])


def get_session(
    master: str = "local[*]",
    app_name: str = "fifolane-views",
    *,
    home: Path | None = None,
    conf: dict[str, str] | None = None,
    log_file: Path | None = None,
) -> SparkSession:
    """Get (or create) the SparkSession with the Kafka and Avro connectors on the classpath.

    ``master`` is any Spark master URL (``local[*]``, ``spark://host:7077``, ``yarn``...);
    ``conf`` overrides the small-machine defaults (including ``spark.jars.packages``);
    ``log_file`` receives the JVM's output (default: :func:`new_log_file`).

    The installed pyspark and the connectors must be the pinned Spark version
    (:func:`spark.packages.check_versions`), else :class:`~spark.packages.SparkVersionError`
    before any JVM starts. If Spark cannot start (say the connectors cannot be resolved),
    :class:`SparkStartError` carries the end of the log. An already running session is
    returned as is if it runs on the same kind of master (Spark allows one SparkContext per
    process); on another master it is refused.
    """
    ivy = ivy_dir(home)
    settings = {
        **_DEFAULTS,
        "spark.jars.ivy": str(ivy),
        "spark.jars.packages": ",".join(connector_packages()),
        **(conf or {}),
    }
    check_versions(settings["spark.jars.packages"])
    running = SparkContext._active_spark_context
    if running is not None:
        if not _same_master(running.master or "", master):
            raise SparkStartError(
                f"a Spark session on {running.master} already runs in this process; Spark allows "
                f"one per process: stop it before starting one on {master}"
            )
        return SparkSession.builder.getOrCreate()

    check_master_reachable(master)
    ivy.mkdir(parents=True, exist_ok=True)
    spark_conf = SparkConf().setMaster(master).setAppName(app_name)
    for key, value in settings.items():
        spark_conf.set(key, value)
    global _jvm_log
    if SparkContext._gateway is None:
        # The JVM (spark-submit) writes its ivy report and log lines to the file, not to our
        # terminal. A JVM of an earlier, stopped session is reused, with its log file.
        log = log_file or new_log_file(home, app_name)
        with log.open("ab") as out:
            try:
                gateway = launch_gateway(
                    spark_conf, popen_kwargs={"stdout": out, "stderr": subprocess.STDOUT}
                )
            except PySparkRuntimeError as exc:
                raise SparkStartError(
                    f"Spark did not start on {master} ({exc}); the end of its log {log}:\n{_tail(log)}"
                ) from exc
        _jvm_log = str(log)
        SparkContext._ensure_initialized(gateway=gateway, conf=spark_conf)
    if _jvm_log:
        spark_conf.set(LOG_CONF, _jvm_log)
    try:
        context = SparkContext(conf=spark_conf)
    except Py4JError as exc:
        where = f"; the end of its log {_jvm_log}:\n{_tail(Path(_jvm_log))}" if _jvm_log else ""
        raise SparkStartError(f"Spark did not start on {master}: {_first_line(exc)}{where}") from exc
    context.setLogLevel("WARN")
    return SparkSession.builder.getOrCreate()


#: the log file of this process's Spark JVM (there is at most one, see get_session)
_jvm_log: str | None = None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def check_master_reachable(master: str, timeout: float = 5.0) -> None:
    """A ``spark://host:port`` master that does not answer is refused at once (Spark itself
    would retry for a minute and then fail with "All masters are unresponsive")."""
    if not master.startswith("spark://"):
        return
    for address in master[len("spark://"):].split(","):
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout):
                return
        except (OSError, ValueError):
            continue
    raise SparkStartError(
        f"cannot reach the Spark master {master}: nothing answers there; start the cluster, "
        f"or pass another --master (FIFOLANE_SPARK_MASTER)"
    )
