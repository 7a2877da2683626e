"""Blocking transactional calls off the poll thread, with a watchdog."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from fifolane.errors import ProducerFencedError, WorkerError

__all__ = ["Background", "FenceWatch", "guarded"]

log = logging.getLogger(__name__)


class Background:
    """``call(*args)`` on its own thread; :meth:`wait` returns its result or raises its error."""

    def __init__(self, call: Any, *args: Any) -> None:
        self._call, self._args = call, args
        self._box: dict[str, Any] = {}
        self._done = threading.Event()
        threading.Thread(target=self._run, name="txn-call", daemon=True).start()

    def _run(self) -> None:
        try:
            self._box["value"] = self._call(*self._args)
        except BaseException as exc:  # handed to the caller in wait()
            self._box["error"] = exc
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> Any:
        if not self._done.wait(timeout):
            name = getattr(self._call, "__name__", "call")
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{name} did not return", fatal=True))
        if "error" in self._box:
            raise self._box["error"]
        return self._box.get("value")


def guarded(call: Any, *args: Any) -> Any:
    """Run a blocking transactional call (its last argument is its timeout in seconds) and
    give up 15 s after that timeout.

    When the transaction coordinator's broker dies, librdkafka can stay blocked in such a
    call far past its timeout. A hung call is reported as a fatal error: the worker then
    replaces its producer (which fences the hung transaction) and replays the input.
    """
    return Background(call, *args).wait(float(args[-1]) + 15.0)


class FenceWatch:
    """Fencings of the worker's producer by another one with its transactional id.

    One now and then is normal: a restarted worker fences its old incarnation, a transaction
    past its timeout is fenced by the broker. Many in a short time mean that another live
    worker runs with the same ``--worker-id``: the two fence each other at every commit, and
    both replay their input again and again. :meth:`note` then stops this worker with a
    :class:`WorkerError` that says so (its transaction is aborted: nothing is lost).
    """

    def __init__(self, transactional_id: str, limit: int = 8, window_s: float = 120.0) -> None:
        self.transactional_id = transactional_id
        self.window_s = window_s
        self._times: deque[float] = deque(maxlen=limit)

    def note(self, exc: BaseException) -> None:
        """The producer is unusable after ``exc`` (logged); raises after too many fencings."""
        log.warning("producer unusable (%s): starting a new one", exc)
        if not isinstance(exc, ProducerFencedError):
            return
        now = time.monotonic()
        times = self._times
        times.append(now)
        if len(times) == times.maxlen and now - times[0] <= self.window_s:
            raise WorkerError(
                f"another producer with this worker's transactional id {self.transactional_id!r} fenced it "
                f"{len(times)} times in {now - times[0]:.0f} s: another worker runs with the same "
                "--worker-id in this consumer group. Give each worker its own --worker-id (or leave it "
                "out: host and pid)")
