"""The query answers (with a fake worker) and the client's routing (with a fake transport)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from fifolane.client import StateClient
from fifolane.partitioner import partition_for
from fifolane.query import QueryError
from services.worker.query.answers import BEHIND, Answers
from services.worker.query.members import MemberInfo, Routing
from services.worker.query.views import View, Views
from services.worker.state import Row


class _Snap(dict[bytes, bytes]):
    def __getitem__(self, key: bytes) -> bytes:
        if key not in self:
            raise Exception("key not found")  # what rocksdict raises
        return dict.__getitem__(self, key)


class FakeLocal:
    def __init__(self) -> None:
        self.me = MemberInfo("w1", "http://w1")
        self.views = Views()
        self.standby_views = Views()
        self.directory_views = Views()
        self.directory = False
        self.group_index = True
        self.owners = {0: "w1", 1: "w2", 2: "w1"}
        self.restores: dict[int, tuple[int, int]] = {}

    def routing(self) -> Routing:
        return Routing(3, 0, self.owners, {}, {"w1": "http://w1", "w2": "http://w2"}, ("w1", "w2"))

    def active(self, p: int) -> bool:
        return self.views.has(p)

    def restoring(self, p: int) -> tuple[int, int] | None:
        return self.restores.get(p)

    def decode(self, value: bytes) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(value)
        return record

    def types(self) -> list[str]:
        return ["reservation"]


def _group_on(p: int) -> str:
    return next(g for g in (f"G{i}" for i in range(100)) if partition_for(g.encode(), 3) == p)


def test_answers_ok_moved_restoring_unavailable_behind_and_bad_requests() -> None:
    local = FakeLocal()
    g0, g1, g2 = _group_on(0), _group_on(1), _group_on(2)
    value = json.dumps({"reservation_id": "R1", "seats": 2}).encode()
    snap = _Snap({b"e:reservation/R1": Row(7, False, g0, value).pack()})
    local.views.publish(0, View(snap, 42, unpack=Row.unpack))
    answers = Answers(local)

    status, body = answers.entity("reservation", "R1", group=g0)
    assert status == "ok"
    assert body == {"status": "ok", "type": "reservation", "key": "R1", "partition": 0, "position": 42,
                    "owner": {"worker": "w1", "url": "http://w1"}, "group": g0, "version": 7,
                    "value": {"reservation_id": "R1", "seats": 2}}
    assert answers.entity("reservation", "R9", group=g0)[0] == "not_found"
    status, body = answers.entity("reservation", "R1", group=g1)
    assert (status, body["owner"], body["partition"]) == ("moved", {"worker": "w2", "url": "http://w2"}, 1)
    local.restores[2] = (500, 2000)
    status, body = answers.entity("reservation", "R1", group=g2)
    assert (status, body["progress"]) == ("restoring", {"done": 500, "total": 2000})
    local.restores.clear()
    status, body = answers.entity("reservation", "R1", group=g2)  # routing names me, no view: unavailable
    assert status == "unavailable" and "no worker serves this partition now" in body["error"]
    status, body = answers.entity("reservation", "R1", group=g0, min_position=43)
    assert status == BEHIND and body["position"] == 42
    status, body = answers.entity("flight", "F1")
    assert (status, body["error"]) == ("bad_request", "unknown entity type 'flight'; known: reservation")
    status, body = answers.group(g0, limit=0)
    assert (status, body["error"]) == ("bad_request", "limit must be 1..10000, got 0")
    status, body = answers.group(g0, prefix="R")
    assert body["error"] == "prefix, start and end are keys of one entity type: pass type too"


def _transport(log: list[str], answers: dict[str, list[tuple[int, dict[str, Any]]]]) -> httpx.MockTransport:
    def handle(req: httpx.Request) -> httpx.Response:
        host = req.url.host
        log.append(f"{host}{req.url.path}")
        if req.url.path == "/v1/routing":
            return httpx.Response(200, json={"input_partitions": 3, "directory_partitions": 0,
                                             "partitions": {"0": {"owner": "a", "url": "http://a"}},
                                             "members": [{"worker": "a", "url": "http://a"}]})
        code, body = answers[host].pop(0)
        return httpx.Response(code, json=body)
    return httpx.MockTransport(handle)


def test_client_follows_moved_and_waits_out_restoring() -> None:
    g0 = _group_on(0)
    ok = {"status": "ok", "type": "reservation", "key": "R1", "group": g0, "version": 3, "value": {"x": 1},
          "partition": 0, "position": 10, "owner": {"worker": "b", "url": "http://b"}}
    log: list[str] = []
    answers = {"a": [(421, {"status": "moved", "partition": 0, "owner": {"worker": "b", "url": "http://b"}})],
               "b": [(503, {"status": "restoring", "partition": 0, "progress": {"done": 1, "total": 9}}), (200, ok)]}
    with StateClient(["http://a"], transport=_transport(log, answers)) as client:
        e = client.get("reservation", "R1", group=g0)
        assert e is not None and (e.version, e.value, e.owner and e.owner.worker) == (3, {"x": 1}, "b")
        assert client.retries == {"moved": 1, "restoring": 1, "unavailable": 0}
        assert [x for x in log if "entities" in x] == ["a/v1/entities/reservation/R1", "b/v1/entities/reservation/R1",
                                                      "b/v1/entities/reservation/R1"]


def test_client_raises_on_timeout_answer_and_gives_up_after_its_timeout() -> None:
    g0 = _group_on(0)
    log: list[str] = []
    answers = {"a": [(504, {"status": "timeout", "position": 5, "min_position": 9, "error": "not reached"})]}
    with StateClient(["http://a"], transport=_transport(log, answers)) as client:
        with pytest.raises(QueryError, match="not reached") as info:
            client.get("reservation", "R1", group=g0, min_position=9)
        assert info.value.status == "timeout"
    answers = {"a": [(503, {"status": "unavailable", "error": "rebalance"})] * 100}
    with StateClient(["http://a"], transport=_transport(log, answers), timeout=0.2) as client:
        with pytest.raises(QueryError, match="still unavailable after 0s") as info:
            client.get("reservation", "R1", group=g0)
        assert info.value.status == "unavailable"


def test_client_reports_a_refused_request_at_once_not_after_its_timeout() -> None:
    """A plain-text 400 (the HTTP server's own answer to a key over its limits) is final,
    and so is a URL too long to send: neither is retried until the timeout."""
    g0 = _group_on(0)
    log: list[str] = []

    def handle(req: httpx.Request) -> httpx.Response:
        log.append(req.url.path)
        if req.url.path == "/v1/routing":
            return httpx.Response(200, json={"input_partitions": 3, "directory_partitions": 0,
                                             "partitions": {"0": {"owner": "a", "url": "http://a"}},
                                             "members": [{"worker": "a", "url": "http://a"}]})
        return httpx.Response(400, text="Bad Request: request line too long")

    with StateClient(["http://a"], transport=httpx.MockTransport(handle), timeout=30) as client:
        t0 = time.monotonic()
        with pytest.raises(QueryError, match="HTTP 400: Bad Request: request line too long") as info:
            client.get("reservation", "R" * 9000, group=g0)
        assert info.value.status == "bad_request" and time.monotonic() - t0 < 5
        assert sum("entities" in x for x in log) == 1
        with pytest.raises(QueryError, match="cannot be sent") as info:
            list(client.scan("F" * 70_000))
        assert info.value.status == "bad_request"


def test_a_write_without_entity_rows_takes_the_view_again_for_scans(tmp_path: Any) -> None:
    """A scan reads a live iterator only while the store is unchanged since its view's
    snapshot; a write that changes no entity (a marker) re-takes the view at the same
    position (Resolver.touched), so scans go on instead of answering busy."""
    from services.worker.query.positions import Resolver
    from services.worker.query.reads import Stale, live_iterator, scan_group
    from services.worker.query.views import view_of
    from services.worker.state import StoreManager

    stores = StoreManager(tmp_path, "g", group_index=False)
    store = stores.open(0)
    store.put(b"reservation/R1", Row(1, False, "G", b'{"x": 1}'), None)
    store.commit(None)
    views = Views()
    views.publish(0, view_of(store, 17))
    resolver = Resolver({}, "state", views, transactional=True)
    store.db.put(b"m:other", b"1")  # a write without entity rows
    with pytest.raises(Stale):
        live_iterator(views.get(0))  # type: ignore[arg-type]
    resolver.touched(0, store)
    view = views.get(0)
    assert view is not None and view.position == 17
    page = scan_group(view, "G", indexed=False)
    assert [k for k, _r in page.rows] == [b"reservation/R1"]
    del view, page
    stores.close_all()


def test_answers_write_avro_values_as_the_api_says() -> None:
    """Bytes as base64, decimals and UUIDs as strings, times in ISO 8601, nested anywhere;
    anything else that is not JSON data is an error, not a guess."""
    import datetime
    import decimal
    import uuid

    from services.worker.query.server import json_response

    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    value = {"b": b"\x00\xff", "d": decimal.Decimal("12.50"), "u": u,
             "t": [datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC), datetime.date(2026, 1, 2),
                   datetime.time(3, 4, 5)],
             "m": {"k": {"n": None, "f": 1.5, "x": [b"ab"]}}}
    r = json_response("ok", {"status": "ok", "value": value})
    assert r.status == 200 and r.content_type == "application/json"
    assert r.body is not None
    assert json.loads(bytes(r.body)) == {"status": "ok", "value": {
        "b": "AP8=", "d": "12.50", "u": str(u),
        "t": ["2026-01-02T03:04:05+00:00", "2026-01-02", "03:04:05"],
        "m": {"k": {"n": None, "f": 1.5, "x": ["YWI="]}}}}
    with pytest.raises(TypeError, match="set is not JSON data"):
        json_response("ok", {"value": {1, 2}})
