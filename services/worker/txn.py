"""Blocking transactional calls off the poll thread, with a watchdog."""

from __future__ import annotations

import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from fifolane.errors import KafkaRetriableError

__all__ = ["STALL_S", "Background", "commit_producer", "guarded"]

#: seconds the flush before an exactly-once commit may take before the offsets and the commit
#: are sent anyway (see commit_producer)
STALL_S = 0.5


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
            name = getattr(self._call, "__name__", "<lambda>")
            what = "the call" if name == "<lambda>" else name  # a lambda: the caller names it
            within = f" within {timeout:.0f}s" if timeout is not None else ""
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{what} did not return{within}", fatal=True))
        if "error" in self._box:
            raise self._box["error"]
        return self._box.get("value")


def guarded(call: Any, *args: Any, limit: float | None = None) -> Any:
    """Run a blocking transactional call (its last argument is its timeout in seconds) and
    give up 15 s after that timeout, or after ``limit`` seconds if given.

    When the transaction coordinator's broker dies, librdkafka can stay blocked in such a
    call far past its timeout. A hung call is reported as a fatal error: the worker then
    replaces its producer (which fences the hung transaction) and replays the input.
    """
    return Background(call, *args).wait(float(args[-1]) + 15.0 if limit is None else limit)


def commit_producer(producer: Any, eos: bool, offsets: list[Any], group_metadata: Any, timeout: float) -> None:
    """The producer's part of a commit (services.worker.checkpoint, off the poll thread; touches
    only the producer: a consumer call from here could deadlock with a poll thread inside
    ``consume()``). ``timeout``: for each call.

    Exactly-once flushes before it sends the offsets: the transaction's first records wait for
    AddPartitionsToTxn, which the coordinator refuses (CONCURRENT_TRANSACTIONS) while it still
    writes the previous commit's markers; an AddOffsetsToTxn sent then is refused too and retried
    on a longer backoff. Flushing first halved the commit on a quiet machine (100 -> 50 ms at
    2,000 events/s; benchmarks/README.md, "Latency").

    But only for :data:`STALL_S`: a commit's flush takes milliseconds, one that takes longer is
    mostly waiting for records that will never be sent. When Kafka refuses a record (too large
    for its topic, say), the transaction must be aborted, and librdkafka holds the records behind
    it in its partition for the abort's epoch bump: a flush waited for them until they timed out
    (message.timeout.ms, at most the transaction's time-out: 10 s by default), every time a record
    was refused. ``send_offsets`` and ``commit_transaction`` check the transaction's state first
    and fail at once then; the commit flushes the rest itself, in calls of STALL_S (resumed: it
    says so), so a record refused meanwhile is found out within STALL_S too.
    """
    left = producer.flush(STALL_S if eos else timeout)
    if eos:
        if offsets:
            producer.send_offsets(offsets, group_metadata, timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                producer.commit(STALL_S)
                return
            except KafkaRetriableError as exc:  # (a time-out: flushing; resumed by the next call)
                if not exc.retriable or time.monotonic() >= deadline:
                    raise
    if left:
        raise KafkaRetriableError(f"{left} records not delivered within {timeout:.0f}s",
                                  code="_TIMED_OUT", retriable=True)
    failed = producer.report.take()
    if failed is not None:
        raise failed[1]
