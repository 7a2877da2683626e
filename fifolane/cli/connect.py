"""Reaching Kafka from a CLI command: one short check up front, librdkafka's lines once each.

    names = check_reachable(settings)        # ConfigError naming the servers and the setting
    conf = {"logger": LIBRDKAFKA_LOG}        # a client's log lines through Python logging
    settings = reachable(load_settings())    # both: checked, and every client it configures logs so

A client that cannot reach its brokers retries for as long as its request allows and logs
every failed connection attempt (~20 lines a second, ``%3|...|FAIL|...Connection refused``).
:func:`check_reachable` asks for the cluster's metadata with a few seconds' patience and
refuses with the bootstrap servers and the setting to change; its client's log lines go to
the ``fifolane.librdkafka`` logger at debug level (the error says it all). Clients given
:data:`LIBRDKAFKA_LOG` as their ``logger`` log through Python logging, at the level
librdkafka gives (3 = error, 4 = warning, 5-6 = info, 7 = debug), each distinct line once;
they serve their log lines when they are polled (a producer's ``poll``/``flush``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from fifolane.access import is_login_error, login_refused
from fifolane.config import Settings
from fifolane.errors import ConfigError

__all__ = ["CHECK_TIMEOUT_S", "LIBRDKAFKA_LOG", "LibrdkafkaLog", "check_reachable", "logged", "reachable",
           "unreachable_hint"]

#: How long :func:`check_reachable` waits for a broker to answer.
CHECK_TIMEOUT_S = 5.0
# The parts of a librdkafka line that change between repeats of one problem.
_VARYING = re.compile(r"\s*\(after \d+ms in state \w+(?:[^()]|\([^()]*\))*\)|\s*\d+ms\b|: \d+/\d+ brokers are down")
# Lines of a retry that librdkafka makes on its own, each time a broker has just started
# (its coordinators load): info, not a warning to the person at the command line.
_RETRIED = re.compile(r"(Coordinator load in progress|Not coordinator|Coordinator not available).*: retrying")


class LibrdkafkaLog:
    """A ``logger`` for librdkafka clients: each distinct line once, to Python logging.

    confluent-kafka calls ``log(level, "%s [%s] %s", facility, client, text)`` with a Python
    level. Repeats of a line (timings aside) are counted, not logged; ``max_level`` caps the
    level lines are logged at (``logging.DEBUG``: only with ``-vv``). ``last`` is the text of
    the latest error line (a reason for a clear message)."""

    def __init__(self, name: str = "fifolane.librdkafka", max_level: int = logging.CRITICAL,
                 limit: int = 1000) -> None:
        self.logger = logging.getLogger(name)
        self.max_level = max_level
        self.limit = limit
        self.repeats: dict[str, int] = {}
        self.last: str | None = None

    def log(self, level: int, fmt: str, *args: Any) -> None:
        try:
            facility, _client, text = args
        except ValueError:
            facility, text = "", fmt % args if args else fmt
        key = f"{facility} {_VARYING.sub('', str(text))}"
        if level >= logging.ERROR:
            self.last = str(text)
        if key in self.repeats:
            self.repeats[key] += 1
            return
        if len(self.repeats) < self.limit:
            self.repeats[key] = 1
        if _RETRIED.search(str(text)):
            level = min(level, logging.INFO)
        self.logger.log(min(level, self.max_level), "%s: %s (repeats are not logged)", facility, text)


#: The logger of CLI clients (``{"logger": LIBRDKAFKA_LOG}`` in their config).
LIBRDKAFKA_LOG = LibrdkafkaLog()


def unreachable_hint(settings: Settings) -> str:
    """Where the bootstrap servers come from, and what to change."""
    if settings.bootstrap_servers:
        return ("check that Kafka runs there, or change FIFOLANE_BOOTSTRAP_SERVERS (or bootstrap_servers "
                "in the FIFOLANE_CONFIG file); with TLS or SASL, check FIFOLANE_SECURITY_PROTOCOL too")
    return ("FIFOLANE_BOOTSTRAP_SERVERS is not set, so this is the local cluster: start it with "
            "`fifolane kafka up` (`fifolane kafka status` shows it), or set FIFOLANE_BOOTSTRAP_SERVERS "
            "to your brokers")


def check_reachable(settings: Settings, timeout: float = CHECK_TIMEOUT_S,
                    stop: Callable[[], bool] | None = None) -> set[str]:
    """Ask the cluster for its metadata (all topics: asking for one could create it on a broker
    with automatic topic creation); returns the topic names.

    :class:`ConfigError` when no broker answers within ``timeout`` seconds (naming the
    bootstrap servers and the setting to change), or at once when a broker refuses the
    login or the TLS handshake (:class:`LoginRefusedError`, a ConfigError). ``stop``
    returning True ends the wait early (an empty set)."""
    bootstrap = settings.resolved_bootstrap()
    quiet = LibrdkafkaLog("fifolane.librdkafka.check", max_level=logging.DEBUG)
    errors: list[KafkaError] = []
    conf = settings.kafka_config(logger=quiet, error_cb=errors.append)
    admin = AdminClient(conf)
    deadline = time.monotonic() + timeout
    last: Any = None
    try:
        while True:
            try:
                md = admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
                return {name for name, topic in md.topics.items() if topic.error is None}
            except KafkaException as exc:
                last = exc.args[0] if exc.args else exc
            admin.poll(0)  # serves the error callback and the log lines
            refused = next((e for e in errors if is_login_error(e)), None)
            if refused is not None:  # the same words as the worker's own check (fifolane.access)
                raise login_refused(refused, {**conf, "bootstrap.servers": bootstrap})
            if time.monotonic() >= deadline:
                break
            if stop is not None and stop():
                return set()
    finally:
        del admin  # destroyed here, before the error is shown
    reason = quiet.last or (last.str() if isinstance(last, KafkaError) else str(last))
    reason = re.sub(r"^\[thrd:[^\]]*\]: |^\S+/(bootstrap|\d+): ", "", reason or "no answer")
    reason = re.sub(r"^\S+/(bootstrap|\d+): ", "", reason)
    reason = re.sub(r"\s*\(after \d+ms in state \w+(?:[^()]|\([^()]*\))*\)", "", reason)
    raise ConfigError(
        f"cannot reach Kafka at {bootstrap}: no broker answered within {timeout:.0f}s ({reason}); "
        f"{unreachable_hint(settings)}"
    )


def logged(settings: Settings) -> Settings:
    """``settings`` whose every client (``kafka_config()``) logs through :data:`LIBRDKAFKA_LOG`:
    for clients made by code that takes the settings, not a configuration."""
    return settings.with_overrides(librdkafka={**settings.librdkafka, "logger": LIBRDKAFKA_LOG})


def reachable(settings: Settings) -> Settings:
    """:func:`check_reachable`, then :func:`logged` settings (a command's first step)."""
    check_reachable(settings)
    return logged(settings)
