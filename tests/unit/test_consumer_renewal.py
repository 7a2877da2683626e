"""A consumer that failed for good (fenced as the group's static member: after a broker
failover, or by another worker with the same ``--worker-id``) is replaced by a new one that
joins the group again; a worker whose consumer keeps failing stops with a reason. Against
real Kafka: tests/integration/test_duplicate_worker_id.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition
from fake_kafka import FakeClients, FakeMsg
from kafka_fixtures import wait_until

from fifolane.config import Settings
from fifolane.errors import ProducerFencedError, WorkerError
from fifolane.serde import SchemaCatalog, make_codec
from services.worker.kafka import WorkerConsumer, consumer_error
from services.worker.options import WorkerOptions
from services.worker.rebalance import ConsumerFailures
from services.worker.runtime import Worker

CATALOG = SchemaCatalog.load()
CODEC = make_codec(Settings(), CATALOG)
FENCED = "Static consumer fenced by other consumer with same group.instance.id"


class _ErrorMsg(FakeMsg):
    def __init__(self, err: KafkaError) -> None:
        super().__init__(-1, -1, None, None)
        self._err = err

    def error(self) -> KafkaError:  # type: ignore[override]
        return self._err


def _msg(p: int, offset: int, rid: str, flight: str) -> FakeMsg:
    body = {"reservation_id": rid, "flight_number": flight, "customer_id": "c1", "seats": 1, "amount": 10.0,
            "state": "NEW", "version": 1}
    return FakeMsg(p, offset, flight.encode(), CODEC.encode("reservation", body))


def _worker(tmp_path: Path) -> tuple[Worker, FakeClients]:
    clients = FakeClients({("in", 0): 100, ("in", 1): 200})
    settings = Settings(home=tmp_path / "home", input_topic="in", state_topic="state", dlq_topic="dlq")
    w = Worker(settings, None, WorkerOptions(worker_id="w1", state_dir=tmp_path / "state"),
               catalog=CATALOG, clients=clients)
    w.connect()
    return w, clients


def _assign(w: Worker, clients: FakeClients, *ps: int) -> None:
    clients.fake_consumer.callbacks["on_assign"](None, [TopicPartition("in", p) for p in ps])
    wait_until(lambda: w.poll_once() or w.assigned_partitions == list(ps), timeout=10, message="restored")


def _state(clients: FakeClients, since: int = 0) -> list[bytes]:
    return [k for t, _v, k, _p, _h in clients.fake_producer.records[since:] if t == "state"]


def test_only_fatal_consumer_errors_are_failures() -> None:
    assert consumer_error(KafkaError(KafkaError._PARTITION_EOF, "eof")) is None
    assert consumer_error(KafkaError(KafkaError._TRANSPORT, "broker down")) is None  # the client retries
    fenced = KafkaError(KafkaError._FATAL, FENCED)  # a consumer's fatal error: _FATAL, not flagged fatal
    assert consumer_error(fenced) is fenced
    other = KafkaError(KafkaError._FAIL, "something else", fatal=True)
    assert consumer_error(other) is other


def test_a_fenced_consumer_gives_up_its_partitions_and_joins_again(tmp_path: Path) -> None:
    w, clients = _worker(tmp_path)
    _assign(w, clients, 0, 1)
    fc, fp = clients.fake_consumer, clients.fake_producer
    fc.batches.append([_msg(0, 100, "R1", "F0"), _ErrorMsg(KafkaError(KafkaError._FATAL, FENCED)),
                       _msg(1, 200, "R2", "F1")])
    w.poll_once()
    # The open transaction is aborted (its offsets would be refused: the group fenced this
    # member), nothing reaches the state topic, and no partition is kept: the group hands
    # them out again, to the new consumer or to another worker.
    assert fc.renewals == 1 and w.stats.consumer_renewals == 1
    assert w.stats.aborts == 1 and fp.aborts == 1 and fp.commits == 0
    assert w.assigned_partitions == [] and w.ckpt is not None and not w.ckpt.is_open
    assert w.stores.stores == {}
    aborted = len(fp.records)
    # The new consumer is assigned partition 0 again: processing resumes from the commit.
    _assign(w, clients, 0)
    fc.batches.append([_msg(0, 100, "R1", "F0"), _msg(0, 101, "R3", "F0")])
    w.poll_once()
    w.checkpoint()
    assert _state(clients, aborted) == [b"reservation/R1", b"reservation/R3"] and fp.commits == 1
    assert w.stats.processed == 2 and fc.renewals == 1 and w.stats.consumer_renewals == 1
    w.close()


def test_a_fatal_error_in_a_batch_an_abort_dropped_is_not_lost(tmp_path: Path) -> None:
    """librdkafka delivers the fatal error once: a produce that fails earlier in its batch
    aborts, and the records after it (the error among them) are never read one by one."""
    w, clients = _worker(tmp_path)
    _assign(w, clients, 0, 1)
    clients.fake_producer.fail = ProducerFencedError("produce: fenced by a newer instance")
    w.take([_msg(0, 100, "R1", "F0"), _msg(1, 200, "R2", "F1"), _ErrorMsg(KafkaError(KafkaError._FATAL, FENCED))])
    assert w.stats.aborts == 1 and clients.fake_producer.renewals == 1  # the producer, as before
    assert clients.fake_consumer.renewals == 1 and w.stats.consumer_renewals == 1  # and the consumer
    assert w.assigned_partitions == []
    w.close()


def test_a_consumer_that_keeps_failing_stops_the_worker_with_a_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that has run for a while: five fencings in two minutes stop it."""
    now = [1000.0]
    monkeypatch.setattr("services.worker.rebalance.time.monotonic", lambda: now[0])
    w, clients = _worker(tmp_path)
    now[0] += 61.0  # past its start
    for i in range(4):
        _assign(w, clients, 0)
        clients.fake_consumer.batches.append([_ErrorMsg(KafkaError(KafkaError._FATAL, FENCED))])
        w.poll_once()
        assert clients.fake_consumer.renewals == i + 1
        now[0] += 1.0
    _assign(w, clients, 0)
    clients.fake_consumer.batches.append([_ErrorMsg(KafkaError(KafkaError._FATAL, FENCED))])
    with pytest.raises(WorkerError, match=r"fenced 5 times in 4 s .*another worker runs with the same "
                                          r"--worker-id in this consumer group. Give each worker its own"):
        w.poll_once()
    w.close()


def test_a_worker_fenced_twice_soon_after_its_start_is_the_newcomer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Started next to a running worker with the same id: the second fencing within a
    minute of the start stops it (the running worker needs five)."""
    now = [1000.0]
    monkeypatch.setattr("services.worker.rebalance.time.monotonic", lambda: now[0])
    young = ConsumerFailures()
    fenced = KafkaError(KafkaError._FATAL, FENCED)
    now[0] += 5.0
    young.note(fenced)  # one: a mishap, maybe (a failover)
    now[0] += 7.0
    with pytest.raises(WorkerError, match=r"^the Kafka consumer was fenced 2 times in the 12 s since this worker "
                                          r"started .*it was there first: this one stops"):
        young.note(fenced)
    late = ConsumerFailures()
    now[0] += 59.0
    late.note(fenced)  # 59 s after its start
    now[0] += 2.0
    late.note(fenced)  # 61 s: only one fell in its first minute
    broken = ConsumerFailures()
    broken.note(KafkaError(KafkaError._FATAL, "broken"))
    broken.note(KafkaError(KafkaError._FATAL, "broken"))  # not a fencing: the newcomer rule is not for it


def test_failures_far_apart_are_mishaps(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("services.worker.rebalance.time.monotonic", lambda: now[0])
    failures = ConsumerFailures(limit=3, window_s=60.0)
    fenced = KafkaError(KafkaError._FATAL, FENCED)
    for _ in range(5):  # one a minute and more: a failover now and then
        failures.note(fenced)
        now[0] += 61.0
    failures.note(fenced)
    now[0] += 30.0
    failures.note(fenced)  # the last three span 91 s
    now[0] += 1.0
    with pytest.raises(WorkerError, match="fenced 3 times in 31 s"):
        failures.note(fenced)
    other = ConsumerFailures(limit=2)
    other.note(KafkaError(KafkaError._FATAL, "broken"))
    with pytest.raises(WorkerError, match="failed for good 2 times in 0 s: broken$"):
        other.note(KafkaError(KafkaError._FATAL, "broken"))


class _Client:
    """The part of confluent-kafka's Consumer that WorkerConsumer.renew touches."""

    made: list[_Client] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf, self.topics, self.callbacks, self.closed = conf, None, {}, False
        _Client.made.append(self)

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.topics, self.callbacks = topics, callbacks

    def consume(self, n: int, timeout: float = 0) -> list[Any]:
        return [self]

    def poll(self, timeout: float) -> Any:
        return self

    def close(self) -> None:
        self.closed = True
        self.callbacks["on_revoke"](self, [TopicPartition("in", 0)])  # a close revokes what is left


def test_renew_replaces_the_client_and_hears_only_the_new_one() -> None:
    _Client.made.clear()
    heard: list[tuple[str, Any, list[int]]] = []
    consumer = WorkerConsumer({"group.id": "g", "group.instance.id": "w1"}, factory=_Client)
    consumer.subscribe(["in"], on_assign=lambda c, ps: heard.append(("assign", c, [tp.partition for tp in ps])),
                       on_revoke=lambda c, ps: heard.append(("revoke", c, [tp.partition for tp in ps])))
    old = _Client.made[0]
    old.callbacks["on_assign"](old, [TopicPartition("in", 0)])
    consumer.renew()
    assert len(_Client.made) == 2
    new = _Client.made[1]
    assert old.closed and not new.closed
    assert new.conf == old.conf and new.topics == ["in"]
    assert consumer.consume(1) == [new] and consumer.poll(0) is new  # the hot calls go to the new client
    new.callbacks["on_assign"](new, [TopicPartition("in", 1)])
    old.callbacks["on_assign"](old, [TopicPartition("in", 2)])  # late word from the old one: not heard
    assert heard == [("assign", old, [0]), ("assign", new, [1])]  # the old one's close revoked nothing here


def test_a_static_workers_group_watch_closes_its_admin_client_with_the_worker(tmp_path: Path) -> None:
    """The watch for partitions nobody owns (services/worker/orphans.py) makes an admin client
    when it first looks at the group; the worker's close() drops it (its threads end then, not
    at the interpreter's exit, where OpenSSL's exit handler could crash a client still running)."""
    clients = FakeClients({("in", 0): 100})
    settings = Settings(home=tmp_path / "home", input_topic="in", state_topic="state", dlq_topic="dlq")
    w = Worker(settings, None, WorkerOptions(worker_id="w1", state_dir=tmp_path / "state", static_membership=True),
               catalog=CATALOG, clients=clients)
    w.connect()
    assert w._rebalance is not None and w._rebalance.orphans is not None
    w._rebalance.orphans._ask(0.0)  # what the watch does 10 s after the start
    assert w._rebalance.orphans._admin is not None
    w.close()
    assert w._rebalance.orphans._admin is None and w._rebalance.orphans._asked is None
