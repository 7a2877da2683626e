"""Views whose position cannot be learned (the state topic's offsets fail to come) and
owners that serve no queries: the answers say so instead of "not found"; and the lag gauge
of a partition that left the worker goes away."""

from __future__ import annotations

import json
import sys
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from test_query_api import FakeLocal, _group_on, _Snap

from fifolane.cli.query import _no_address
from fifolane.client import StateClient
from fifolane.partitioner import partition_for
from fifolane.query import QueryError
from services.worker.metrics import Stats, _Collector, update_lag
from services.worker.query.answers import Answers
from services.worker.query.members import Routing
from services.worker.query.positions import Resolver
from services.worker.query.reader import Reader
from services.worker.query.views import View, Views
from services.worker.state import Row


class _Admin:
    """An AdminClient's list_offsets: raises ``error`` for every partition, or answers ``lso``."""

    def __init__(self, error: int | None = None, lso: int = 0,
                 text: str = "Broker: Leader epoch is older than broker epoch") -> None:
        self.error, self.lso, self.text, self.asked = error, lso, text, 0

    def list_offsets(self, specs: dict[TopicPartition, Any], **kw: Any) -> dict[TopicPartition, Future[Any]]:
        self.asked += 1
        out: dict[TopicPartition, Future[Any]] = {}
        for tp in specs:
            fut: Future[Any] = Future()
            if self.error is not None:
                fut.set_exception(KafkaException(KafkaError(self.error, self.text)))
            else:
                fut.set_result(SimpleNamespace(offset=self.lso))
            out[tp] = fut
        return out


def _view(rows: dict[bytes, bytes], position: int) -> View:
    return View(_Snap(rows), position, unpack=Row.unpack)


def _row(version: int, group: str) -> bytes:
    return Row(version, False, group, json.dumps({"reservation_id": "Q4", "v": version}).encode()).pack()


def test_a_fenced_admin_client_is_made_anew_and_the_position_moves_on() -> None:
    """librdkafka's admin client that lived through a broker restart answers list_offsets with
    FENCED_LEADER_EPOCH for good: the resolver makes a new one and publishes the position."""
    g0 = _group_on(0)
    views = Views()
    views.publish(0, _view({}, 10))
    resolver = Resolver({}, "state", views, transactional=True)
    stuck, fresh = _Admin(error=KafkaError.FENCED_LEADER_EPOCH), _Admin(lso=12)
    resolver._admin = stuck  # type: ignore[assignment]
    resolver._new_admin = lambda: fresh  # type: ignore[assignment,method-assign,return-value]
    resolver.applied(0, _view({b"e:reservation/Q4": _row(1, g0)}, -1), 1)

    assert resolver._resolve(check_started=True) is False
    assert (stuck.asked, resolver.renewals, resolver._admin) == (1, 1, fresh)
    assert resolver._resolve(check_started=True) is True
    assert views.position(0) == 12  # 10 + one record + the commit marker
    assert views.stale(0) is None


def test_a_view_whose_position_stays_unknown_is_stale_and_answers_unavailable() -> None:
    local = FakeLocal()
    g0 = _group_on(0)
    local.views.publish(0, _view({}, 10))  # the view before the commit: no Q4 in it
    answers = Answers(local)
    assert answers.entity("reservation", "Q4", group=g0)[0] == "not_found"

    resolver = Resolver({}, "state", local.views, transactional=True, stale_after_s=5.0)
    down = _Admin(error=KafkaError._TRANSPORT, text="Local: Broker transport failure")
    resolver._admin = down  # type: ignore[assignment]
    resolver._new_admin = lambda: down  # type: ignore[assignment,method-assign,return-value]
    resolver.applied(0, _view({b"e:reservation/Q4": _row(1, g0)}, -1), 1)
    assert resolver._resolve(check_started=True) is False
    since = resolver._pending[0].since
    resolver.check_stale(now=since + 4.9)
    assert local.views.stale(0) is None  # not yet: 4.9 s < 5 s
    assert answers.entity("reservation", "Q4", group=g0)[0] == "not_found"
    resolver.check_stale(now=since + 5.0)
    why = local.views.stale(0)
    assert why == "the position of its last 5 s of commits is not known (state topic offsets: Local: " \
                  "Broker transport failure)"
    status, body = answers.entity("reservation", "Q4", group=g0)
    assert (status, body) == ("unavailable", {
        "status": "unavailable", "partition": 0, "owner": {"worker": "w1", "url": "http://w1"},
        "type": "reservation", "key": "Q4",
        "error": f"this worker owns partition 0 but cannot read it up to date now: {why}; retry"})
    assert answers.group(g0)[0] == "unavailable"  # scans too
    assert answers.entity("reservation", "Q4", group=g0, min_position=11)[0] == "unavailable"

    resolver._admin = _Admin(lso=12)  # type: ignore[assignment]  # Kafka answers again
    assert resolver._resolve(check_started=True) is True
    assert local.views.stale(0) is None
    status, body = answers.entity("reservation", "Q4", group=g0, min_position=12)
    assert (status, body["position"], body["version"], body["value"]) == ("ok", 12, 1, {"reservation_id": "Q4", "v": 1})


def test_withdraw_forgets_staleness_and_a_stale_mark_needs_a_view() -> None:
    views = Views()
    views.mark_stale(3, "no view: ignored")
    assert views.stale(3) is None
    views.publish(3, _view({}, 1))
    views.mark_stale(3, "behind")
    assert views.stale(3) == "behind"
    views.withdraw(3)
    views.publish(3, _view({}, 2))
    assert views.stale(3) is None


def test_the_reader_sends_reads_of_a_stale_partition_to_the_worker(capsys: pytest.CaptureFixture[str]) -> None:
    reader = Reader.__new__(Reader)  # its control state only (no catalog, no HTTP)
    reader.stale = set()
    reader.local = SimpleNamespace(secondaries={}, remove=lambda p: None)  # type: ignore[assignment]
    reader._opening, reader._pending = {}, {}
    reader.control({"op": "stale", "p": 2, "why": "behind"})
    assert reader.stale == {2}
    reader.control({"op": "withdraw", "p": 2, "ack": 7})
    assert reader.stale == set()
    assert capsys.readouterr().out == '{"ack": 7}\n'
    reader.control({"op": "stale", "p": 1, "why": "behind"})
    assert reader.stale == {1}


def test_an_owner_without_a_query_address_is_named() -> None:
    local = FakeLocal()
    local.owners = {0: "w1", 1: "w3", 2: "w1"}  # w3: a member of the group without a members record
    status, body = Answers(local).entity("reservation", "P1", group=_group_on(1))
    assert (status, body) == ("unavailable", {
        "status": "unavailable", "partition": 1, "owner": {"worker": "w3", "url": None}, "type": "reservation",
        "key": "P1", "error": "worker w3 owns partition 1 but publishes no query address (started without "
                              "--query-port?)"})
    assert Routing(3, 0, {1: "w3"}).owner(1) is not None


def test_get_says_at_once_that_the_owner_serves_no_queries(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    import fifolane.cli.query as query_cli
    from fifolane.cli import _run

    g1 = _group_on(1)
    asked: list[str] = []

    def handle(req: httpx.Request) -> httpx.Response:
        asked.append(req.url.path)
        if req.url.path == "/v1/routing":
            return httpx.Response(200, json={"input_partitions": 3, "directory_partitions": 0, "partitions": {
                "1": {"owner": "w3", "url": None}}, "members": [{"worker": "w3", "url": None}]})
        return httpx.Response(503, json={"status": "unavailable", "partition": 1,
                                         "owner": {"worker": "w3", "url": None}, "error": "no address"})

    made: list[StateClient] = []

    def client(urls: Any, group_id: Any, token_file: Any, ca_file: Any, timeout: float) -> StateClient:
        made.append(StateClient(["http://w2"], timeout=timeout, transport=httpx.MockTransport(handle)))
        return made[0]

    monkeypatch.setattr(query_cli, "_client", client)
    monkeypatch.setattr(query_cli, "_NO_ADDRESS_S", 0.3)
    monkeypatch.setattr(sys, "argv", ["fifolane", "get", "reservation", "P1", "--group", g1])
    assert _run() == 2
    assert capsys.readouterr().err == ("error: worker w3 owns partition 1 but serves no queries: it was started "
                                       "without --query-port (restart it with --query-port to read its "
                                       "partitions)\n")
    assert made[0].timeout == 0.3  # one short attempt, not the 30 s of a rebalance


def test_a_revoked_partition_loses_its_lag_gauge() -> None:
    stats = Stats(worker_id="w1")
    stats.lag = {0: 965, 1: 3}
    consumer = SimpleNamespace(watermarks=lambda tp, cached: (0, 10), position=lambda tp: 4)
    update_lag(stats, consumer, "in", [1])
    assert stats.lag == {1: 6}
    assert stats.snapshot()["lag"] == {"1": 6}
    (family,) = [f for f in _Collector(stats).collect() if f.name == "fifolane_consumer_lag"]
    assert [(s.labels, s.value) for s in family.samples] == [({"worker": "w1", "partition": "1"}, 6.0)]
    update_lag(stats, consumer, "in", [])
    assert stats.lag == {}


def test_a_directory_owner_without_a_query_address_is_named() -> None:
    """A key looked up without --group goes through the entity directory: when that
    partition's owner serves no queries, the answer names it (the CLI says so at once)."""
    local = FakeLocal()
    local.directory = True
    local.routing = lambda: Routing(3, 3, {0: "w1", 1: "w1", 2: "w1"},  # type: ignore[method-assign]
                                    {0: "w3", 1: "w3", 2: "w3"}, {"w1": "http://w1"}, ("w1", "w3"))
    status, body = Answers(local).entity("reservation", "P1")
    d = partition_for(b"reservation/P1", 3)
    assert (status, body) == ("unavailable", {
        "status": "unavailable", "owner": {"worker": "w3", "url": None}, "directory_partition": d,
        "type": "reservation", "key": "P1",
        "error": f"worker w3 owns entity directory partition {d} but serves no queries (no --query-port)"})
    assert _no_address(QueryError("x", status=status, answer=body)) == (
        f"worker w3 owns entity directory partition {d} but serves no queries: it was started without "
        "--query-port (restart it with --query-port, or pass the entity's --group)")
