"""The client boundary maps every librdkafka error to one fifolane error (httpx style: a code
that is not mapped fails here)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from fifolane.errors import (
    KafkaClientError,
    KafkaRetriableError,
    ProducerFatalError,
    ProducerFencedError,
    RecordRefusedError,
    TransactionAbortedError,
)
from services.worker.kafka import RECORD_ERRORS, map_error

LEAVES = (KafkaRetriableError, TransactionAbortedError, RecordRefusedError, ProducerFatalError,
          ProducerFencedError)
CODES = sorted({v for k, v in vars(KafkaError).items() if not k.startswith("__") and type(v) is int})


@pytest.mark.parametrize("code", CODES)
def test_every_code_maps_to_a_leaf(code: int) -> None:
    for flags in ({}, {"fatal": True}, {"retriable": True}, {"txn_requires_abort": True}):
        err = map_error(KafkaException(KafkaError(code, "x", **flags)), "call")
        assert type(err) in LEAVES, (code, flags, type(err))
        assert isinstance(err, KafkaClientError) and err.code


def test_classification() -> None:
    def mapped(code: int, **flags: bool) -> KafkaClientError:
        return map_error(KafkaException(KafkaError(code, "x", **flags)), "produce")

    assert type(mapped(KafkaError.MSG_SIZE_TOO_LARGE)) is RecordRefusedError
    assert mapped(KafkaError.MSG_SIZE_TOO_LARGE).refused
    assert type(mapped(KafkaError.INVALID_RECORD, txn_requires_abort=True)) is TransactionAbortedError
    assert mapped(KafkaError.INVALID_RECORD, txn_requires_abort=True).refused  # bisect on it
    assert type(mapped(KafkaError.PRODUCER_FENCED, fatal=True)) is ProducerFencedError
    assert type(mapped(KafkaError.INVALID_PRODUCER_EPOCH, fatal=True)) is ProducerFatalError
    assert type(mapped(KafkaError._TIMED_OUT, retriable=True)) is KafkaRetriableError
    assert type(mapped(KafkaError._ALL_BROKERS_DOWN)) is KafkaRetriableError
    assert all(not mapped(c).refused for c in (KafkaError._TIMED_OUT, KafkaError.NOT_ENOUGH_REPLICAS))
    assert KafkaError.MSG_SIZE_TOO_LARGE in RECORD_ERRORS


class _Calls:
    """A producer whose abort_transaction fails with the given errors, then succeeds."""

    def __init__(self, errors: list[KafkaError]) -> None:
        self.errors = errors
        self.calls = 0
        self.produce = None

    def abort_transaction(self, timeout: float) -> None:
        self.calls += 1
        if self.errors:
            raise KafkaException(self.errors.pop(0))


def test_transactional_calls_are_repeated_only_when_librdkafka_says_retriable() -> None:
    from services.worker.kafka import TxnProducer

    # An abort in a state that has no transaction fails the same way every time: raised at
    # once (the checkpoint then starts a new producer), not called again until the deadline.
    fake = _Calls([KafkaError(KafkaError._STATE, "Operation not valid in state Ready")] * 1000)
    producer = TxnProducer({}, transactional=True, factory=lambda conf: fake)
    with pytest.raises(KafkaRetriableError, match="Operation not valid in state Ready") as info:
        producer.abort(5.0)
    assert (info.value.code, fake.calls) == ("_STATE", 1)
    # A time-out librdkafka calls retriable is resumed.
    fake = _Calls([KafkaError(KafkaError._TIMED_OUT, "retry call to resume", retriable=True)] * 2)
    TxnProducer({}, transactional=True, factory=lambda conf: fake).abort(5.0)
    assert fake.calls == 3
