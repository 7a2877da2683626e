"""How the worker reads Kafka's errors: every confluent-kafka error becomes a fifolane error
(:func:`map_error`, from librdkafka's own classification; the list is in
:mod:`services.worker.kafka`'s docstring), and which failed delivery a transaction reports
(:class:`DeliveryReport`)."""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException, Message

from fifolane.errors import (
    KafkaClientError,
    KafkaRetriableError,
    ProducerFatalError,
    ProducerFencedError,
    RecordRefusedError,
    TransactionAbortedError,
)

__all__ = ["RECORD_ERRORS", "DeliveryReport", "consumer_error", "map_error"]

log = logging.getLogger(__name__)

#: Errors about one record (not about the cluster): producing it again fails again. (With
#: _INVALID_DIFFERENT_RECORD librdkafka fails the records batched with an invalid one.)
RECORD_ERRORS = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.INVALID_RECORD,
    KafkaError.INVALID_MSG, KafkaError.INVALID_MSG_SIZE, KafkaError._INVALID_ARG,
    KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION,
    KafkaError.TOPIC_EXCEPTION, KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError._INVALID_DIFFERENT_RECORD,
})  # fmt: skip
_FENCED = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED})


def _error_of(exc: KafkaException | KafkaError) -> KafkaError:
    if isinstance(exc, KafkaError):
        return exc
    arg = exc.args[0] if exc.args else None
    if isinstance(arg, KafkaError):
        return arg
    return KafkaError(KafkaError._FAIL, str(exc))


def consumer_error(err: KafkaError) -> KafkaError | None:
    """An error the consumer delivered in place of a record: ``err`` when it is fatal (the consumer
    is done for good: services.worker.rebalance renews it), else None (logged: the client retries)."""
    if err.fatal() or err.code() == KafkaError._FATAL:  # a consumer's fatal error: _FATAL, not flagged
        return err
    if err.code() != KafkaError._PARTITION_EOF:
        log.warning("consumer error: %s", err)
    return None


def map_error(exc: KafkaException | KafkaError, what: str) -> KafkaClientError:
    """The fifolane error for a confluent-kafka exception (or error) raised by ``what``."""
    err = _error_of(exc)
    code = err.code()
    name = err.name() or str(code)
    message = f"{what}: {err.str()} ({name})"
    cls: type[KafkaClientError] = KafkaRetriableError
    if err.fatal():
        cls = ProducerFencedError if code in _FENCED else ProducerFatalError
    elif err.txn_requires_abort():
        cls = TransactionAbortedError
    elif code in RECORD_ERRORS:
        cls = RecordRefusedError
    return cls(message, code=name, retriable=bool(err.retriable()), fatal=bool(err.fatal()),
               abortable=bool(err.txn_requires_abort()), refused=code in RECORD_ERRORS)


def _culprit(exc: KafkaClientError) -> bool:  # refused for what it is, not for a batch-mate
    return exc.refused and exc.code != "_INVALID_DIFFERENT_RECORD"


class DeliveryReport:
    """The first failed delivery since the last :meth:`take` (topic, error), the first refused
    one if any (its batch-mates, failed with it, are often reported before it)."""

    __slots__ = ("failed",)

    def __init__(self) -> None:
        self.failed: tuple[str, KafkaClientError] | None = None

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            topic = msg.topic() or "?"
            log.error("delivery to %s[%s] failed: %s", topic, msg.partition(), err)
            mapped = map_error(err, f"delivery to {topic}")
            mapped.topic = topic
            if self.failed is None or (_culprit(mapped) and not _culprit(self.failed[1])):
                self.failed = (topic, mapped)

    def take(self) -> tuple[str, KafkaClientError] | None:
        failed, self.failed = self.failed, None
        return failed
