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
