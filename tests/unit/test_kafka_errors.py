"""The client boundary maps every librdkafka error to one fifolane error (httpx style: a code
that is not mapped fails here)."""

from __future__ import annotations

import threading
from typing import Any

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


class _Hangs:
    """A transactional client whose send_offsets_to_transaction never returns (librdkafka
    #5511: after a broker restart it can wait for good, whatever its timeout)."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def produce(self, *args: object, **kw: object) -> None:
        raise AssertionError("not sent here")

    def send_offsets_to_transaction(self, offsets: object, metadata: object, timeout: float) -> None:
        self.released.wait(60)


def test_a_send_offsets_that_hangs_is_given_up_after_the_transaction_timeout() -> None:
    from services.worker.kafka import TxnProducer

    fake = _Hangs()
    producer = TxnProducer({"transaction.timeout.ms": 1000}, transactional=True, factory=lambda conf: fake)
    try:
        # the transaction timeout (1 s) and a second: the coordinator has aborted it by then;
        # not the 30 + 15 s of the general watchdog
        with pytest.raises(ProducerFatalError) as info:
            producer.send_offsets([], None, 30.0)
        assert str(info.value) == "send_offsets_to_transaction: the call did not return within 2s (_TIMED_OUT)"
        assert info.value.code == "_TIMED_OUT"
    finally:
        fake.released.set()


class _Busy(_Hangs):
    """A transactional client whose send_offsets_to_transaction is refused, retriable, forever."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def send_offsets_to_transaction(self, offsets: object, metadata: object, timeout: float) -> None:
        self.calls += 1
        raise KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "loading", retriable=True))


def test_retriable_refusals_of_send_offsets_are_retried_only_within_the_transaction_timeout() -> None:
    from services.worker.kafka import TxnProducer

    fake = _Busy()
    producer = TxnProducer({"transaction.timeout.ms": 1000}, transactional=True, factory=lambda conf: fake)
    with pytest.raises(KafkaRetriableError, match="^send_offsets_to_transaction: .*loading") as info:
        producer.send_offsets([], None, 30.0)
    assert info.value.retriable
    # called again on a growing pause (10 ms doubling to 1 s) until 2 s, not until the 30 s asked
    assert 3 <= fake.calls <= 10


class _Queue:
    """A client whose produce() refuses ``full`` times with a full queue, or always with ``error``."""

    def __init__(self, full: int = 0, error: KafkaError | None = None) -> None:
        self.full, self.error = full, error
        self.records: list[tuple[object, ...]] = []
        self.polls = 0

    def produce(self, topic: str, value: bytes, key: bytes, partition: int, **kw: object) -> None:
        if self.error is not None:
            raise KafkaException(self.error)
        if self.full:
            self.full -= 1
            raise BufferError("Local: Queue full")
        self.records.append((topic, value, key, partition, kw.get("headers"), "on_delivery" in kw))

    def poll(self, timeout: float) -> int:
        self.polls += 1
        return 0


def test_send_is_the_clients_produce_and_every_failure_of_it_is_produced_again_carefully() -> None:
    """Hot loops call ``send`` (the client's own produce) and, on SEND_FAILED, ``produce``,
    which waits for room in the queue and raises a fifolane error."""
    from services.worker.kafka import SEND_FAILED, TxnProducer

    def send_then_produce(producer: TxnProducer, value: bytes) -> None:
        try:
            producer.send("t", value, b"k", 0)
        except SEND_FAILED as exc:  # as the table applier and Checkpoint.produce do
            producer.produce("t", value, b"k", 0, full=type(exc) is BufferError)

    client = _Queue(full=3)
    producer = TxnProducer({}, transactional=True, factory=lambda conf: client)
    send_then_produce(producer, b"1")  # refused once by send, then twice more while produce waits
    # queue_full counts records that met a full queue, once each (not the waits)
    assert (client.records, client.polls, producer.queue_full) == ([("t", b"1", b"k", 0, None, False)], 2, 1)
    client.full = 1  # refused by send only: produce finds room at once
    send_then_produce(producer, b"1b")
    assert (len(client.records), producer.queue_full) == (2, 2)
    client.full = 2  # met by produce itself (a record of a path without send): counted once
    producer.produce("t", b"1c", b"k", 0)
    assert (len(client.records), producer.queue_full) == (3, 3)
    producer.report_each(True)  # bisecting: every record reports its delivery
    send_then_produce(producer, b"2")
    producer.report_each(False)
    send_then_produce(producer, b"3")
    assert [r[5] for r in client.records] == [False, False, False, True, False]
    refused = _Queue(error=KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large"))
    producer = TxnProducer({}, transactional=True, factory=lambda conf: refused)
    with pytest.raises(RecordRefusedError, match="produce to t"):
        send_then_produce(producer, b"4")


def test_topic_configs_that_do_not_come_in_time_are_kafkas_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker frozen while the worker starts: describe_configs does not answer within the
    timeout. The worker goes on with Kafka's defaults (it once exited with TimeoutError)."""
    import concurrent.futures
    from types import SimpleNamespace

    import services.worker.clients as kafka

    class _Late:
        def result(self, timeout: float | None = None) -> object:
            raise concurrent.futures.TimeoutError()

    class _Access:
        def __init__(self, base: object, timeout: float) -> None:
            self.principal = None
            self.admin = SimpleNamespace(describe_configs=lambda resources, request_timeout: {
                r: _Late() for r in resources})

        def topics(self, names: list[str]) -> dict[str, object]:
            return {n: SimpleNamespace(exists=True, allows=lambda op: True) for n in names}

        def group_allows(self, group: str, op: str) -> bool:
            return True

        def close(self) -> None:
            self.admin = None

    monkeypatch.setattr(kafka, "KafkaAccess", _Access)
    got = kafka.KafkaClients({}).topic_configs(["a", "b"], timeout=0.1)
    assert got == {"a": {}, "b": {}}


class _Msg:
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0


def test_a_transaction_reports_the_refused_record_not_its_batch_mates() -> None:
    """librdkafka fails the records batched with an invalid one (_INVALID_DIFFERENT_RECORD),
    often before the invalid one: the report keeps the culprit, and a batch-mate alone still
    counts as a refusal (the transaction holds a refused record: bisected, not retried)."""
    from services.worker.kafka import DeliveryReport

    report = DeliveryReport()
    report(KafkaError(KafkaError._INVALID_DIFFERENT_RECORD), _Msg("a"))  # type: ignore[arg-type]
    report(KafkaError(KafkaError._INVALID_DIFFERENT_RECORD), _Msg("b"))  # type: ignore[arg-type]
    report(KafkaError(KafkaError.INVALID_RECORD), _Msg("c"))  # type: ignore[arg-type]
    report(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Msg("d"))  # type: ignore[arg-type]
    taken = report.take()
    assert taken is not None and taken[0] == "c" and taken[1].code == "INVALID_RECORD"
    assert report.take() is None
    report(KafkaError(KafkaError._INVALID_DIFFERENT_RECORD), _Msg("a"))  # type: ignore[arg-type]
    mate = report.take()
    assert mate is not None and mate[1].refused and isinstance(mate[1], RecordRefusedError)


def test_a_topic_description_that_times_out_is_asked_again_within_the_time_out() -> None:
    """A worker starting while a broker is frozen: the first describe times out (CI: the
    worker exited with 'cannot describe topic ... Local: Timed out'); the next one answers."""
    from concurrent.futures import Future
    from types import SimpleNamespace

    from fifolane.access import KafkaAccess
    from fifolane.errors import ConfigError

    def answer(result: Any) -> Future[Any]:
        f: Future[Any] = Future()
        if isinstance(result, BaseException):
            f.set_exception(result)
        else:
            f.set_result(result)
        return f

    timed_out = KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed while waiting for response from broker"))
    replies = [{"a": answer(timed_out), "b": answer(SimpleNamespace(authorized_operations=None))},
               {"a": answer(SimpleNamespace(authorized_operations=None))}]
    asked: list[list[str]] = []

    class _Admin:
        def describe_topics(self, topics: Any, **kw: Any) -> dict[str, Future[Any]]:
            asked.append(sorted(topics.topic_names))
            return replies.pop(0)

    access = KafkaAccess({"bootstrap.servers": "127.0.0.1:1"}, timeout=10)
    access.admin, access._logged_in = _Admin(), True  # type: ignore[assignment]
    found = access.topics(["a", "b"])
    assert asked == [["a", "b"], ["a"]]
    assert found["a"].exists and found["b"].exists
    access.timeout = 0.5  # no time left for another try: said as before
    replies.append({"a": answer(timed_out)})
    with pytest.raises(ConfigError, match=r"cannot describe topic 'a': .*Timed out|Failed while waiting"):
        access.topics(["a"])
