"""The worker's Kafka client boundary: every ``KafkaException`` becomes a fifolane error here.

The worker talks to Kafka through :class:`TxnProducer` and :class:`WorkerConsumer`, thin
wrappers around confluent-kafka's clients. Their methods raise only
:class:`fifolane.errors.KafkaClientError` leaves, chosen by :func:`map_error` from
librdkafka's own classification of the error:

- fatal (the producer is unusable): :class:`ProducerFencedError` when another producer
  took over the transactional id, else :class:`ProducerFatalError`;
- the open transaction must be aborted: :class:`TransactionAbortedError`;
- one record is refused for what it is (``RECORD_ERRORS``): :class:`RecordRefusedError`;
- anything else, time-outs and unavailable brokers included: :class:`KafkaRetriableError`.

Transactional calls that librdkafka reports as retriable ("call again to resume") are
called again until their deadline; a call that hangs far past its time-out is reported as
fatal by the watchdog of :mod:`services.worker.txn`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from fifolane.access import principal_of
from fifolane.errors import (
    KafkaClientError,
    KafkaRetriableError,
    WorkerError,
)
from services.worker.kafka_errors import RECORD_ERRORS, DeliveryReport, consumer_error, map_error
from services.worker.txn import guarded

#: What :attr:`TxnProducer.send` may raise: then :meth:`TxnProducer.produce` the record.
SEND_FAILED = (BufferError, KafkaException)

__all__ = ["RECORD_ERRORS", "SEND_FAILED", "DeliveryReport", "Record", "TxnProducer", "WorkerConsumer",
           "consumer_error", "map_error"]

log = logging.getLogger(__name__)


class Record(Protocol):
    """A consumed record (a ``confluent_kafka.Message``): what the worker reads of it."""

    def error(self) -> KafkaError | None: ...
    def topic(self) -> str: ...
    def partition(self) -> int: ...
    def offset(self) -> int: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> list[tuple[str, bytes]] | None: ...
    def timestamp(self) -> tuple[int, int]: ...


class TxnProducer:
    """A confluent-kafka producer, transactional or not, whose errors are fifolane errors.

    ``reports``: a delivery callback for every record (:meth:`report_each`) or only for
    failures (at-least-once sets ``on_delivery`` in the config; exactly-once learns of a
    failed delivery from the commit and sets none, since a callback costs ~1.4 us a record).
    """

    def __init__(self, conf: dict[str, Any], *, transactional: bool,
                 factory: Callable[[dict[str, Any]], Any] = Producer) -> None:
        self.transactional = transactional
        self.report = DeliveryReport()
        self._each = False
        conf = dict(conf)
        if not transactional:
            conf.setdefault("delivery.report.only.error", True)
            conf["on_delivery"] = self.report
        self._conf = conf
        self._txn_timeout_s = int(conf.get("transaction.timeout.ms", 60_000)) / 1000
        self._factory = factory
        self._producer = factory(conf)
        self._raw = self._producer.produce
        #: The client's own produce, for hot loops (a call less per record). If it raises
        #: :data:`SEND_FAILED`, call :meth:`produce` (waits for room, maps the error).
        self.send: Callable[..., None] = self._raw
        self.renewals, self.queue_full = 0, 0  # queue_full: records that met a full local queue

    def renew(self) -> None:
        """Replace the client after a fatal error: a new producer with the same settings
        (call :meth:`init` next if transactional). The old one's queued records are dropped;
        a call of the old one that hangs (watchdog) is left to its thread."""
        old = self._producer
        self._producer = self._factory(self._conf)
        self._raw = self._producer.produce
        self._set_send()
        self.renewals += 1
        try:
            old.purge(True, True, False)
        except (KafkaException, RuntimeError, TypeError) as exc:
            log.debug("purge of the replaced producer: %s", exc)

    # -- records -----------------------------------------------------------------------------
    def produce(self, topic: str, value: bytes | str | None, key: bytes | str | None,
                partition: int = -1, headers: Any = None, *, full: bool = False) -> None:
        """Queue one record, waiting while the local queue is full (counted once in queue_full;
        ``full``: :attr:`send` found it full)."""
        self.queue_full += full
        while True:
            try:
                if headers is None:
                    self.send(topic, value, key, partition)  # even headers=None costs 0.4 us
                else:
                    self.send(topic, value, key, partition, headers=headers)
                return
            except BufferError:
                self.queue_full += not full
                full = True
                self._producer.poll(0.05)  # let deliveries drain
            except KafkaException as exc:
                err = map_error(exc, f"produce to {topic}")
                err.topic = topic
                raise err from exc

    def refresh(self, topic: str, timeout: float = 5.0) -> None:
        """Read ``topic``'s metadata again: librdkafka keeps a topic it saw deleted as unknown
        (and refuses records to it at once) until its next refresh, minutes later.

        All topics are listed, not ``topic`` alone: a producer's request naming a missing topic
        makes a broker with ``auto.create.topics.enable`` create it (1 partition, the broker's
        defaults); the listing updates the producer's view of every topic in it. Heavier on a
        cluster of many topics, but called only when a listener is activated."""
        try:
            self._producer.list_topics(timeout=timeout)
        except KafkaException as exc:
            log.info("metadata of %s not read again: %s", topic, exc)

    def report_each(self, on: bool) -> None:
        """Report every record's delivery (to find which record Kafka refuses)."""
        self._each = on
        self._set_send()

    def _set_send(self) -> None:
        self.send = partial(self._raw, on_delivery=self.report) if self._each else self._raw

    def poll(self, timeout: float = 0.0) -> None:
        self._producer.poll(timeout)

    def close(self, flush: float = 0.0) -> None:
        """Wait up to ``flush`` seconds for deliveries, drop what is left, and destroy the
        client (its threads end now, not at the interpreter's exit). Idempotent."""
        try:
            if flush:
                self.flush(flush)
            self._producer.purge(True, True, False)
            self._producer.close()
        except (KafkaClientError, KafkaException, RuntimeError) as exc:  # RuntimeError: closed
            log.debug("producer close: %s", exc)

    def flush(self, timeout: float) -> int:
        """Wait for deliveries; the number of records still undelivered."""
        try:
            return int(self._producer.flush(timeout))
        except KafkaException as exc:
            raise map_error(exc, "flush") from exc

    # -- transactions ------------------------------------------------------------------------
    def init(self, timeout: float = 60.0) -> None:
        """init_transactions: fences older producers with this id and settles their
        open transaction (waits, calling again, while the coordinator is unavailable).
        :class:`WorkerError` naming the ACL if the principal may not use its transactional id."""
        try:
            self._resume(self._producer.init_transactions, "init_transactions", timeout)
        except KafkaClientError as exc:
            if exc.code != "TRANSACTIONAL_ID_AUTHORIZATION_FAILED":
                raise
            raise WorkerError(_txn_denied(self._conf)) from exc

    def begin(self) -> None:
        try:
            self._producer.begin_transaction()
        except KafkaException as exc:
            raise map_error(exc, "begin_transaction") from exc

    def send_offsets(self, offsets: list[TopicPartition], group_metadata: Any, timeout: float) -> None:
        """send_offsets_to_transaction, called again while librdkafka says retriable, and given
        up once the transaction timeout has passed: a call still running then is hung (fatal:
        a new producer, the input replayed). librdkafka can block in it for
        good: after a broker restart it may keep the group coordinator's decommissioned
        broker handle and wait for a state change of it that never comes (librdkafka
        #5511; it ignores the call's timeout there, #5456). Past the transaction timeout the
        coordinator aborts the transaction anyway, so nothing that would commit is given up.
        Seen: 45 s without a commit after a one-broker restart, now about the timeout."""
        self._resume(lambda t: self._producer.send_offsets_to_transaction(offsets, group_metadata, t),
                     "send_offsets_to_transaction", timeout, limit=self._txn_timeout_s + 1.0)

    def commit(self, timeout: float) -> None:
        self._resume(self._producer.commit_transaction, "commit_transaction", timeout)

    def abort(self, timeout: float) -> None:
        self._resume(self._producer.abort_transaction, "abort_transaction", timeout)

    def _resume(self, call: Callable[[float], Any], what: str, timeout: float,
                limit: float | None = None) -> None:
        """Make a blocking transactional call, again while librdkafka says it is retriable,
        until ``timeout`` has passed; a call stuck past it is reported fatal (watchdog:
        :func:`services.worker.txn.guarded`). ``limit``: every call together may take at most
        this long, and one that is still running then is reported fatal too."""
        deadline = time.monotonic() + (timeout if limit is None else min(timeout, limit))
        pause = 0.01
        while True:
            try:
                if limit is None:
                    guarded(call, min(timeout, 30.0))
                else:
                    left = max(0.1, deadline - time.monotonic())
                    guarded(call, left, limit=left)
                return
            except KafkaException as exc:
                mapped = map_error(exc, what)
                # Only what librdkafka calls retriable is worth a second call: an operation
                # invalid in the producer's state (_STATE) would fail at once until the deadline.
                if not (isinstance(mapped, KafkaRetriableError) and mapped.retriable) \
                        or time.monotonic() >= deadline:
                    raise mapped from exc
                log.info("%s: %s; calling again", what, mapped)
                time.sleep(pause)  # an error returned at once must not turn into a hot loop
                pause = min(pause * 2, 1.0)


def _txn_denied(conf: Mapping[str, Any]) -> str:
    """The start-up error of a worker whose principal may not use its transactional id."""
    tid = str(conf.get("transactional.id"))
    who = principal_of(conf) or "this worker's principal"
    # producer_config: transactional.id = <group>-<worker id>, client.id = <worker id>-producer
    worker_id = str(conf.get("client.id", "")).removesuffix("-producer")
    group = tid.removesuffix(f"-{worker_id}") if worker_id and tid.endswith(f"-{worker_id}") else None
    grant = (f"fifolane acls apply --role worker --principal {principal_of(conf) or 'User:<name>'}"
             + (f" --group-id {group}" if group else ""))
    return f"the worker cannot start: {who} lacks WRITE on transactional id {tid!r}; grant them (`{grant}`, docs/security.md)"


class WorkerConsumer:
    """The worker's consumer (calls on the poll thread only), errors mapped."""

    def __init__(self, conf: dict[str, Any], factory: Callable[[dict[str, Any]], Any] = Consumer) -> None:
        self._conf, self._factory = dict(conf), factory
        self._subscription: tuple[list[str], dict[str, Any]] | None = None
        self._sought: set[tuple[str, int]] | None = None  # partitions sought inside poll_more()
        self._open(factory(conf))

    def _open(self, client: Any) -> None:
        self._consumer = client
        self.consume = client.consume  # the hot call; it reports errors in messages
        self.poll = client.poll

    def poll_more(self, first: Record, n: int) -> list[Record]:
        """``first`` (from ``poll``) and up to ``n - 1`` records more. A rebalance callback in
        this consume() may rewind ``first``'s partition (an abort seeks back to the last
        commit): then ``first`` comes again after the others, so it is left out here."""
        self._sought = set()
        try:
            more: list[Record] = self.consume(n - 1, 0) if n > 1 else []
        finally:
            sought, self._sought = self._sought, None
        return more if (first.topic(), first.partition()) in sought else [first, *more]

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        """Join the group; the rebalance callbacks hear only from the current client."""
        def current(callback: Callable[[Any, list[TopicPartition]], None]) -> Callable[..., None]:
            def call(client: Any, partitions: list[TopicPartition]) -> None:
                if client is self._consumer:
                    callback(client, partitions)
            return call
        self._subscription = (list(topics), callbacks)
        self._consumer.subscribe(topics, **{name: current(cb) for name, cb in callbacks.items()})

    def renew(self) -> None:
        """Replace a client that failed for good (fenced as the group's static member) with a new one
        that joins again, subscribed as before; the caller gave up the old one's partitions."""
        old = self._consumer
        self._open(self._factory(self._conf))
        try:
            old.close()  # a failed client leaves without a word: its callbacks are not heard
        except (KafkaException, RuntimeError) as exc:
            log.info("closing the failed consumer: %s", exc)
        self.rejoin()

    def leave(self) -> None:
        """Leave the group: the partitions are revoked (in the next ``consume()``), then a
        LeaveGroup makes the group rebalance, static member or not (services.worker.orphans)."""
        self._consumer.unsubscribe()

    def rejoin(self) -> None:
        """Join the group again, subscribed as before (after :meth:`renew` or :meth:`leave`)."""
        if self._subscription is not None:
            self.subscribe(self._subscription[0], **self._subscription[1])

    def member_id(self) -> str | None:
        return self._consumer.memberid()  # type: ignore[no-any-return]

    def group_metadata(self) -> Any:
        try:
            return self._consumer.consumer_group_metadata()
        except KafkaException as exc:
            raise map_error(exc, "consumer_group_metadata") from exc

    def committed(self, partitions: list[TopicPartition],
                  timeout: float) -> dict[tuple[str, int], tuple[int | None, str | None]]:
        """Committed offsets (None: nothing committed) and their metadata, read as committed
        by transactions."""
        try:
            got = self._consumer.committed(partitions, timeout=timeout)
        except KafkaException as exc:
            raise map_error(exc, "committed offsets") from exc
        out: dict[tuple[str, int], tuple[int | None, str | None]] = {}
        for tp in got:
            if tp.error is not None:
                raise map_error(tp.error, f"committed offset of {tp.topic}[{tp.partition}]")
            out[(tp.topic, tp.partition)] = (tp.offset if tp.offset >= 0 else None, tp.metadata)
        return out

    def commit(self, offsets: list[TopicPartition], wait: bool = True) -> None:
        try:  # not waited for: the outcome comes to on_commit (services.worker.clients)
            self._consumer.commit(offsets=offsets, asynchronous=not wait)
        except KafkaException as exc:
            raise map_error(exc, "offset commit") from exc

    def seek(self, tp: TopicPartition) -> None:
        if self._sought is not None:
            self._sought.add((tp.topic, tp.partition))
        try:
            self._consumer.seek(tp)
        except KafkaException as exc:
            raise map_error(exc, f"seek {tp.topic}[{tp.partition}]") from exc

    def assign_more(self, partitions: list[TopicPartition]) -> None:
        self._consumer.incremental_assign(partitions)

    def unassign_some(self, partitions: list[TopicPartition]) -> None:
        self._consumer.incremental_unassign(partitions)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._consumer.pause(partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._consumer.resume(partitions)

    def watermarks(self, tp: TopicPartition, timeout: float | None = None, cached: bool = False) -> tuple[int, int]:
        try:
            if cached:
                low, high = self._consumer.get_watermark_offsets(tp, cached=True)
            else:
                low, high = self._consumer.get_watermark_offsets(tp, timeout=timeout)
        except KafkaException as exc:
            raise map_error(exc, f"watermarks of {tp.topic}[{tp.partition}]") from exc
        return int(low), int(high)

    def partition_count(self, topic: str, timeout: float) -> int | None:
        """How many partitions ``topic`` has (None: not known now)."""
        try:
            found = self._consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as exc:
            log.info("partitions of %s not known now: %s", topic, exc)
            return None
        return None if found is None or found.error is not None else len(found.partitions)

    def position(self, tp: TopicPartition) -> int:
        try:
            return int(self._consumer.position([tp])[0].offset)
        except KafkaException as exc:
            raise map_error(exc, "position") from exc

    def close(self) -> None:
        try:
            self._consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("consumer close: %s", exc)
