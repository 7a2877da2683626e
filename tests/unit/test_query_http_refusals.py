"""The query endpoint's HTTP layer refuses what the API has no answer for in JSON, takes
the bearer scheme in any case, and keeps malformed HTTP out of the ERROR log."""

from __future__ import annotations

import json
import logging

import pytest
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.test_utils import make_mocked_request

from services.worker.query.server import check_token, quiet_bad_http, refused


def _body(resp: web.Response) -> dict[str, object]:
    assert resp.content_type == "application/json"
    assert isinstance(resp.body, bytes)
    body: dict[str, object] = json.loads(resp.body)
    return body


def test_no_such_path_is_a_json_404_that_says_what_to_read() -> None:
    resp = refused(web.HTTPNotFound(), "GET", "/v1/nothing")
    assert resp.status == 404
    body = _body(resp)
    assert body["status"] == "bad_request"
    assert "no such path: '/v1/nothing'" in str(body["error"]) and "docs/formats.md" in str(body["error"])


def test_another_method_is_a_json_405_with_allow() -> None:
    resp = refused(web.HTTPMethodNotAllowed("POST", ["GET", "HEAD"]), "POST", "/v1/routing")
    assert resp.status == 405
    assert resp.headers["Allow"] == "GET,HEAD"
    assert _body(resp) == {"status": "bad_request", "error": "POST is not answered here: only GET (and HEAD)"}


def test_a_body_too_large_is_a_json_413() -> None:
    resp = refused(web.HTTPRequestEntityTooLarge(max_size=1024, actual_size=4096), "POST", "/v1/routing")
    assert resp.status == 413
    body = _body(resp)
    assert body["status"] == "bad_request" and "1024" in str(body["error"])


@pytest.mark.parametrize(("header", "ok"), [
    ("Bearer s3cret", True), ("bearer s3cret", True), ("BEARER  s3cret", True),
    ("Bearer s3cre", False), ("Bearer s3cret2", False), ("Basic s3cret", False), ("s3cret", False),
    ("Bearer ü", False), ("", False),
])
def test_the_bearer_scheme_is_case_insensitive_and_the_token_exact(header: str, ok: bool) -> None:
    req = make_mocked_request("GET", "/v1/routing", headers={"Authorization": header} if header else {})
    answer = check_token(req, "s3cret")
    if ok:
        assert answer is None
    else:
        assert answer is not None and answer.status == 401
        assert _body(answer)["status"] == "unauthorized"
    assert check_token(req, None) is None  # no token configured: everyone is let in


def _record(exc: BaseException) -> logging.LogRecord:
    return logging.getLogger("aiohttp.server").makeRecord(
        "aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s", ("127.0.0.1",),
        (type(exc), exc, None))


def test_malformed_http_stays_out_of_the_error_log_and_real_errors_stay_in() -> None:
    quiet_bad_http()
    quiet_bad_http()  # installed once however often it is called
    server_log = logging.getLogger("aiohttp.server")
    assert sum(type(f).__name__ == "_BadHttp" for f in server_log.filters) == 1
    assert not server_log.filter(_record(BadHttpMessage("Invalid method encountered")))
    assert not server_log.filter(_record(LineTooLong("header line", "8190")))
    assert server_log.filter(_record(RuntimeError("a bug in a handler")))  # still logged
