"""Blocking transactional calls off the poll thread, with a watchdog."""

from __future__ import annotations

import threading
from typing import Any

from confluent_kafka import KafkaError, KafkaException

__all__ = ["Background", "guarded"]


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
