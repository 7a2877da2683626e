"""Topic limits read again after Kafka refused a record as too large. No broker.

The worker measures every record it derives against its topic's ``max.message.bytes``
before producing it (services/worker/limits.py). An operator may lower (or raise) that limit
while the worker runs; the broker then refuses a record the kept limit let through, and the
transaction aborts. After such a refusal the worker reads the limits again: the replay and
later records are measured against the limit as it is now (dead-lettered as ``too-large`` at
once, with no bisection), and a raised limit takes what it would have refused before. The
same against a real broker: tests/integration/test_limit_lowered_at_run_time.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_kafka import FakeClients, FakeMsg
from test_worker_guarantees import _worker as worker_on

from fifolane.config import Settings
from fifolane.errors import KafkaRetriableError, TransactionAbortedError, WorkerError
from fifolane.serde import SchemaCatalog, make_codec
from listeners.model import ListenerSpec
from services.worker.limits import FRAMING, Limits, TopicConfigs
from services.worker.runtime import Worker

CATALOG = SchemaCatalog.load()
CODEC = make_codec(Settings(), CATALOG)


class _Topics:
    """A broker's topic configs that a test changes, and how often they were asked for."""

    def __init__(self, limits: dict[str, int]) -> None:
        self.limits = limits
        self.asked: list[list[str]] = []
        self.down = False

    def lookup(self, names: list[str]) -> dict[str, dict[str, str]]:
        self.asked.append(sorted(names))
        if self.down:
            raise WorkerError("the worker cannot start: no broker")
        return {n: {"max.message.bytes": str(self.limits[n])} if n in self.limits else {} for n in names}


def test_limits_are_kept_until_refreshed_then_read_again() -> None:
    """No broker round trip per record: the limits are read once per topic. ``refresh`` reads
    the topics measured so far again, in one look-up, and says which rooms changed (lowered
    and raised); a look-up that fails keeps the limits read before."""
    broker = _Topics({"state": 20_000, "dlq": 5_000, "in": 9_000})
    configs = TopicConfigs(broker.lookup)
    limits = Limits(1_000_000, configs.max_bytes, reread=configs.reread)
    assert (limits.room("state"), limits.room("dlq")) == (20_000 - FRAMING, 5_000 - FRAMING)
    broker.limits.update(state=10_000, dlq=60_000, **{"in": 1_000})
    for _ in range(3):
        assert (limits.room("state"), limits.room("dlq")) == (20_000 - FRAMING, 5_000 - FRAMING)
    assert broker.asked == [["state"], ["dlq"]]
    assert limits.refresh() == {"state": (20_000 - FRAMING, 10_000 - FRAMING),
                                "dlq": (5_000 - FRAMING, 60_000 - FRAMING)}
    assert broker.asked[2:] == [["dlq", "state"]]  # one look-up, of the topics measured only
    assert (limits.room("state"), limits.room("dlq")) == (10_000 - FRAMING, 60_000 - FRAMING)
    assert limits.refresh() == {}  # nothing changed since
    broker.down, broker.limits["state"] = True, 3_000
    assert limits.refresh() == {}
    assert limits.room("state") == 10_000 - FRAMING  # not Kafka's default


def test_a_notification_is_measured_against_the_room_as_it_is_now() -> None:
    """A listener's notifications are measured against its output topic's room as the worker's
    limits say now (ListenerRuntime.after_abort resizes them after every abort)."""
    from listeners.notifier import Active, resize

    spec = ListenerSpec(name="l1", filter="true")
    act = Active.of(spec, "out", 3, 10_000)
    header = sum(len(k) + len(v) + 2 for k, v in act.headers)
    assert act.room == 10_000 - header
    resize([act], {"out": 4_000}.__getitem__)
    assert act.room == 4_000 - header


class _Clients(FakeClients):
    def __init__(self, broker: _Topics, committed: dict[tuple[str, int], int | None]) -> None:
        super().__init__(committed)
        self.broker = broker

    def topic_configs(self, names: list[str], timeout: float = 30.0, **_access: Any) -> dict[str, dict[str, str]]:
        return self.broker.lookup(names)


def _res(rid: str, flight: str, version: int, customer: str = "c1") -> dict[str, Any]:
    return {"reservation_id": rid, "flight_number": flight, "customer_id": customer, "seats": 1,
            "amount": 10.0, "state": "NEW", "version": version}


def _msg(p: int, offset: int, rid: str, flight: str, *, size: int = 0) -> FakeMsg:
    """An upsert whose customer_id has ``size`` characters (a state record of about that many bytes)."""
    return FakeMsg(p, offset, flight.encode(), CODEC.encode("reservation", _res(rid, flight, 1, "c" * size or "c1")))


def _worker(tmp_path: Path, broker: _Topics, fast: bool) -> tuple[Worker, _Clients]:
    clients = _Clients(broker, {("in", 0): 100, ("in", 1): 200})
    w, _ = worker_on(tmp_path, None, clients, fast_path=fast)
    return w, clients


def _refuse_next_commit(clients: FakeClients) -> None:
    """The broker refuses a record of the transaction (as librdkafka reports it at the commit)."""
    producer = clients.fake_producer

    def commit(timeout: float) -> None:
        del producer.commit  # once
        producer.in_txn = False
        raise TransactionAbortedError("commit_transaction: Broker: Message size too large",
                                      code="MSG_SIZE_TOO_LARGE", abortable=True, refused=True)

    producer.commit = commit  # type: ignore[method-assign]


def _committed_state(clients: FakeClients) -> dict[str, int]:
    """The state records of committed transactions only: key -> customer_id length."""
    return {k.decode(): len(CODEC.decode(v).record["customer_id"])
            for t, v, k, _p, _h in clients.fake_producer.records if t == "state" and v is not None}


def _dead(clients: FakeClients) -> list[tuple[bytes, bytes]]:
    return [(dict(h)["fifolane.dlq.reason"], dict(h)["fifolane.dlq.offset"])
            for t, _v, _k, _p, h in clients.fake_producer.records if t == "dlq"]


@pytest.mark.parametrize("fast", [True, False], ids=["fast-path", "general-path"])
def test_a_limit_lowered_at_run_time_is_read_again_after_the_refusal(tmp_path: Path, fast: bool) -> None:
    """The state topic's limit goes from 20,000 to 5,000 bytes while the worker runs. The
    transaction with an 8,000-byte state record is refused by the broker: the worker reads
    the limits again, replays the transaction without bisecting it, and the replay
    dead-letters that record as too-large; the next oversized record is dead-lettered at once,
    with no further abort or look-up."""
    broker = _Topics({"state": 20_000, "dlq": 20_000, "in": 20_000, "dir": 20_000})
    w, clients = _worker(tmp_path, broker, fast)
    assert w.ckpt is not None
    w.take([_msg(0, 100, "R1", "F0", size=6_000)])  # fits the limit as it is
    w.checkpoint()
    asked = len(broker.asked)
    broker.limits["state"] = 5_000  # kafka-configs --alter, unknown to the worker
    batch = [_msg(0, 101, "R2", "F0"), _msg(0, 102, "R3", "F0", size=8_000), _msg(1, 200, "R4", "F1")]
    w.take(batch)
    _refuse_next_commit(clients)
    clients.fake_producer.records.clear()  # the aborted transaction's records: never read
    w.checkpoint()
    assert (w.stats.aborts, w.ckpt.bisecting, w.ckpt.room()) == (1, False, None)
    assert len(broker.asked) == asked + 1  # read again once, after the refusal
    assert clients.fake_producer.renewals == 1  # a new producer: new sequence numbers (checkpoint.py)
    assert sorted(clients.fake_consumer.seeks) == [("in", 0, 101), ("in", 1, 200)]
    assert {t.room for t in w.assignment.tables.values()} == {5_000 - FRAMING}  # type: ignore[union-attr]
    w.take(batch)  # the replay
    w.drain()
    w.checkpoint()
    w.take([_msg(1, 201, "R5", "F1", size=4_600), _msg(1, 202, "R6", "F1")])
    w.drain()
    w.checkpoint()
    assert (w.stats.aborts, w.ckpt.bisecting, len(broker.asked)) == (1, False, asked + 1)
    assert _committed_state(clients) == {"reservation/R2": 2, "reservation/R4": 2, "reservation/R6": 2}
    assert _dead(clients) == [(b"too-large", b"102"), (b"too-large", b"201")]
    assert dict(w.stats.dead_letter_reasons) == {"too-large": 2}
    assert (w.stats.processed, w.stats.dead_lettered) == (4, 2)
    assert clients.fake_producer.offsets[-1] == [("in", 0, 103), ("in", 1, 203)]


def test_a_limit_raised_at_run_time_takes_records_once_read_again(tmp_path: Path) -> None:
    """The state topic takes 5,000 bytes: an 8,000-byte state record is dead-lettered. The
    operator raises it to 50,000 and lowers the dead-letter topic's; the next refusal makes
    the worker read both again, and from then on a state record of 8,000 bytes is applied,
    not dead-lettered for a limit that no longer holds."""
    broker = _Topics({"state": 5_000, "dlq": 20_000, "in": 20_000, "dir": 20_000})
    w, clients = _worker(tmp_path, broker, True)
    assert w.ckpt is not None
    w.take([_msg(0, 100, "R1", "F0", size=8_000)])
    w.checkpoint()
    assert _dead(clients) == [(b"too-large", b"100")]
    broker.limits.update(state=50_000, dlq=3_000)
    w.take([_msg(0, 101, "R2", "F0")])
    _refuse_next_commit(clients)
    w.checkpoint()
    assert (w.stats.aborts, w.ckpt.bisecting) == (1, False)
    assert (w.limits.room("state"), w.limits.room("dlq")) == (50_000 - FRAMING, 3_000 - FRAMING)
    clients.fake_producer.records.clear()
    w.take([_msg(0, 101, "R2", "F0"), _msg(0, 102, "R3", "F0", size=8_000)])
    w.checkpoint()
    assert _committed_state(clients) == {"reservation/R2": 2, "reservation/R3": 8_000}
    assert _dead(clients) == []
    assert (w.stats.processed, w.stats.dead_lettered, w.stats.aborts) == (2, 1, 1)


def test_a_refusal_the_limits_do_not_explain_is_still_bisected(tmp_path: Path) -> None:
    """Read again, the limits are what they were (a batch over the limit, say): the worker
    falls back to bisecting its transactions, as before."""
    broker = _Topics({"state": 20_000, "dlq": 20_000, "in": 20_000, "dir": 20_000})
    w, clients = _worker(tmp_path, broker, True)
    assert w.ckpt is not None
    w.take([_msg(0, 100, "R1", "F0"), _msg(0, 101, "R2", "F0"), _msg(0, 102, "R3", "F0"), _msg(0, 103, "R4", "F0")])
    _refuse_next_commit(clients)
    w.checkpoint()
    assert (w.stats.aborts, w.ckpt.bisecting, w.ckpt.room()) == (1, True, 2)


def test_a_refusal_reported_as_a_refused_produce_is_found_out(tmp_path: Path) -> None:
    """librdkafka refuses every record of a failed transaction with _STATE: a produce that
    comes after the refusal, before the commit, says only that. The worker asks the
    transaction what failed it (its commit says so first), reads the limits again, and the
    replay dead-letters the record as too-large: no bisection."""
    broker = _Topics({"state": 20_000, "dlq": 20_000, "in": 20_000, "dir": 20_000})
    w, clients = _worker(tmp_path, broker, True)
    assert w.ckpt is not None
    broker.limits["state"] = 5_000
    clients.fake_producer.fail = KafkaRetriableError(
        "produce to state: Unable to produce message: Local: Erroneous state", code="_STATE")
    _refuse_next_commit(clients)  # what the transaction says when asked
    batch = [_msg(0, 100, "R1", "F0"), _msg(0, 101, "R2", "F0", size=8_000)]
    w.take(batch)
    assert (w.stats.aborts, w.ckpt.bisecting, clients.fake_producer.commits) == (1, False, 0)
    assert w.limits.room("state") == 5_000 - FRAMING
    clients.fake_producer.records.clear()
    w.take(batch)
    w.checkpoint()
    assert _committed_state(clients) == {"reservation/R1": 2}
    assert _dead(clients) == [(b"too-large", b"101")]
