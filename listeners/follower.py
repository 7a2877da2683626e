"""Following the listener registry on a background thread, restarted when it fails.

The worker's poll thread takes the records with :meth:`RegistryFollower.drain` (at every
checkpoint) and asks with :meth:`RegistryFollower.mark` / :meth:`RegistryFollower.caught_up`
whether everything committed before a moment has been read (on partition assignment, so a
worker never processes events with an outdated listener set).

The thread survives its own failures: any error (a broker outage, a watermark time-out) is
logged and counted, and the thread starts again after a backoff (0.5 s doubling to 30 s)
from where it stopped. While it is down, :meth:`caught_up` is False: a newly assigned
partition waits instead of running with a stale registry. :attr:`healthy`, :attr:`restarts`
and :attr:`last_error` are exported as metrics by the listener runtime.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from fifolane.config import Settings

__all__ = ["RegistryFollower", "RegistryRecord"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RegistryRecord:
    """One registry record as read: key, value (None = tombstone), offset, headers."""

    key: str
    value: bytes | None
    offset: int
    headers: tuple[tuple[str, bytes], ...] = ()


def registry_consumer(settings: Settings) -> Consumer:
    """A consumer for the registry: no group offsets, committed records only."""
    return Consumer(settings.kafka_config(**{
        "group.id": f"fifolane-registry-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": 100,
    }))  # fmt: skip


class RegistryFollower:
    """Reads the registry topic from its beginning, for ever (see the module docstring).

    ``make_consumer`` and ``ensure_topic`` are replaceable (tests inject failures).
    """

    def __init__(self, settings: Settings, poll_timeout: float = 0.1, *,
                 make_consumer: Callable[[Settings], Any] = registry_consumer,
                 ensure_topic: Callable[[Settings], None] | None = None,
                 max_backoff: float = 30.0) -> None:
        self.settings = settings
        self.poll_timeout = poll_timeout
        self._make_consumer = make_consumer
        self._ensure_topic = ensure_topic
        self._max_backoff = max_backoff
        self._queue: queue.SimpleQueue[RegistryRecord] = queue.SimpleQueue()
        self._position = 0  # next offset to read (records before it are queued)
        self._end: int | None = None  # the registry's end, asked for by mark()
        self._asked = threading.Event()
        self._gen = 0  # counts mark() calls
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.healthy = False
        self.restarts = 0
        self.last_error: str | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="registry-follower", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- for the poll thread -------------------------------------------------------------------
    def drain(self) -> list[Any]:
        """The records read since the last call, in registry order."""
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def mark(self) -> None:
        """Remember the registry's end now (read asynchronously): see :meth:`caught_up`."""
        with self._lock:
            self._end = None
            self._gen += 1
        self._asked.set()

    def caught_up(self) -> bool:
        """Whether every record before the end remembered by :meth:`mark` has been read
        (records of transactions open at the mark too: a new partition owner then sees the
        previous owner's last snapshot progress). False while the thread is down."""
        with self._lock:
            return self.healthy and self._end is not None and self._position >= self._end

    def sync(self, timeout: float = 30.0) -> bool:
        """:meth:`mark`, then wait until :meth:`caught_up` (False on timeout)."""
        self.mark()
        deadline = time.monotonic() + timeout
        while not self.caught_up():
            if time.monotonic() > deadline:
                log.warning("registry not caught up after %.0fs (at %d of %s)", timeout,
                            self._position, self._end)  # fmt: skip
                return False
            time.sleep(0.01)
        return True

    # -- the thread ----------------------------------------------------------------------------
    def _main(self) -> None:
        backoff = min(0.5, self._max_backoff)
        while not self._stop.is_set():
            try:
                self._follow()
                return
            except Exception as exc:  # noqa: BLE001 - any failure: log, count, start again
                self.healthy = False
                self.restarts += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("registry follower failed (%s); restarting in %.1fs", self.last_error, backoff)
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, self._max_backoff)

    def _follow(self) -> None:
        if self._ensure_topic is not None:
            self._ensure_topic(self.settings)
        consumer = self._make_consumer(self.settings)
        topic = self.settings.registry_topic
        try:
            consumer.assign([TopicPartition(topic, 0, self._position or OFFSET_BEGINNING)])
            tp = TopicPartition(topic, 0)
            self.healthy = True
            while not self._stop.is_set():
                if self._asked.is_set():
                    # One thread makes every call on this consumer. The request stands until
                    # it is answered (a failure here restarts the thread), and an answer to
                    # an earlier mark() does not count for a later one.
                    with self._lock:
                        gen = self._gen
                    _lo, high = consumer.get_watermark_offsets(tp, timeout=10)
                    with self._lock:
                        if gen == self._gen:
                            self._asked.clear()
                            self._end = high
                msgs = consumer.consume(500, timeout=self.poll_timeout)
                pos = self._position
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            pos = max(pos, msg.offset() or 0)
                        elif err.fatal() or not err.retriable():
                            log.warning("registry follower: %s", err)
                        continue
                    key = (msg.key() or b"").decode("utf-8", "replace")
                    self._queue.put(RegistryRecord(key, msg.value(), msg.offset() or 0,
                                                   tuple(msg.headers() or ())))
                    pos = max(pos, (msg.offset() or 0) + 1)
                if pos != self._position:
                    with self._lock:
                        self._position = pos
        finally:
            consumer.close()
