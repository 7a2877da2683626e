"""The query endpoint's HTTP layer (aiohttp, on its own thread and event loop).

Handlers parse the request, call :class:`services.worker.query.answers.Answers` and write
its JSON with the status code of docs/formats.md ("Query API"). Answers that are not final
(``behind``: below ``min_position``; ``busy``: a scan raced a commit) are asked again every
few milliseconds until the request's bounded wait (``wait_ms``, at most 30 s) runs out. The
poll loop never waits for a reader: readers only read published views.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from fifolane.query import API, BAD_REQUEST, STATUS_CODES, TIMEOUT, UNAUTHORIZED, UNAVAILABLE
from services.worker.query.answers import BEHIND, BUSY, Answer, Answers
from services.worker.query.reads import json_default

__all__ = ["BadParam", "QueryServer", "check_token", "int_param", "json_response", "quiet_bad_http", "refused"]

log = logging.getLogger(__name__)

MAX_WAIT_MS = 30_000
#: how long a scan waits for the next view when it raced a commit (no wait_ms given)
_BUSY_WAIT_S = 2.0
_RETRY_S = 0.002


def int_param(req: web.BaseRequest, name: str, default: int | None = None) -> int | None:
    raw = req.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadParam(f"{name} must be an integer, got {raw!r}") from None


def bool_param(req: web.BaseRequest, name: str) -> bool:
    raw = req.query.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0", ""):
        raise BadParam(f"{name} must be true or false, got {raw!r}")
    return raw in ("true", "1")


#: answers hold decoded Avro values as they are; the encoder writes their bytes, decimals
#: and times (services/worker/query/reads.json_default)
_encode = json.JSONEncoder(default=json_default).encode


class BadParam(Exception):
    """A request parameter that cannot be read (answered 400)."""


def json_response(status: str, body: dict[str, Any], code: int | None = None) -> web.Response:
    code = code or STATUS_CODES.get(status, 500)
    headers = {"Retry-After": "1"} if code == 503 else None
    return web.Response(status=code, body=_encode(body).encode(), content_type="application/json",
                        headers=headers)


def refused(exc: web.HTTPException, method: str, path: str) -> web.Response:
    """The JSON answer to a request the API has no answer for (``bad_request``, with the
    HTTP code of ``exc``): a path it does not have (404), a method other than GET and HEAD
    (405), a body over the size limit (413)."""
    error = {404: f"no such path: {path!r} (the API: docs/formats.md, 'Query API')",
             405: f"{method} is not answered here: only GET (and HEAD)"}.get(exc.status, f"{exc.reason}: {exc.text}")
    resp = json_response(BAD_REQUEST, {"status": BAD_REQUEST, "error": error}, code=exc.status)
    allow = exc.headers.get("Allow")
    if allow:
        resp.headers["Allow"] = allow
    return resp


class _BadHttp(logging.Filter):
    """Requests that are not HTTP (a malformed request line or header, a header over the
    size limit, TLS on a plain port) are the client's fault: aiohttp answers them with a
    plain-text 400 and logs an ERROR with a traceback for each, so any client could fill the
    log. They are logged at DEBUG, one line each."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            log.debug("refused a request that is not valid HTTP: %s", exc)
            return False
        return True


def quiet_bad_http() -> None:
    """Install :class:`_BadHttp` on aiohttp's server logger (once)."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _BadHttp) for f in server_log.filters):
        server_log.addFilter(_BadHttp())


def check_token(request: web.BaseRequest, token: str | None) -> web.Response | None:
    """The 401 answer to a request without the endpoint's bearer token (None: let it in).
    The scheme is case-insensitive (RFC 9110); the token is compared in constant time."""
    if token is None:
        return None
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
        return None
    return json_response(UNAUTHORIZED, {"status": UNAUTHORIZED,
                                        "error": "a valid 'Authorization: Bearer <token>' header is required"})


class QueryServer:
    """Serves :class:`Answers` over HTTP(S) on a thread (see the module docstring)."""

    def __init__(self, answers: Answers, routing_json: Callable[[], dict[str, Any]],
                 partitions_json: Callable[[], dict[str, Any]], *, host: str, port: int,
                 tls: ssl.SSLContext | None = None, token: str | None = None) -> None:
        self._answers = answers
        self._routing = routing_json
        self._partitions = partitions_json
        self._host = host
        self._port = port
        self._tls = tls
        self._token = token
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        #: requests answered (metrics and benchmarks)
        self.requests = 0

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> int:
        """Bind and serve; returns the bound port (``port=0``: any free one)."""
        quiet_bad_http()
        ready = threading.Event()
        failed: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._bind())
            except BaseException as exc:  # reported to start()
                failed.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._unbind())
            loop.close()

        self._thread = threading.Thread(target=main, name="query-http", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failed:
            raise failed[0]
        return self.port

    async def _bind(self) -> None:
        @web.middleware
        async def auth(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
            return await self._auth(request, handler)

        app = web.Application(middlewares=[auth])
        app.router.add_get(API + "/entities/{type}/{key:.+}", self._entity)
        app.router.add_get(API + "/groups/{group:.+}", self._group)
        app.router.add_get(API + "/routing", self._routing_handler)
        app.router.add_get(API + "/partitions", self._partitions_handler)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, ssl_context=self._tls, backlog=512)
        await site.start()
        server = site._server
        assert server is not None
        self.port = int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]

    async def _unbind(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    # -- handlers ----------------------------------------------------------------------------
    async def _auth(self, request: web.Request,
                    handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        self.requests += 1
        denied = check_token(request, self._token)
        if denied is not None:
            return denied
        try:
            return await handler(request)
        except BadParam as exc:
            return json_response(BAD_REQUEST, {"status": BAD_REQUEST, "error": str(exc)})
        except web.HTTPException as exc:  # the router's: no such path, another method
            if exc.status < 400:
                raise
            return refused(exc, request.method, request.path)

    async def _retrying(self, req: web.Request, ask: Callable[[], Answer]) -> web.Response:
        wait_ms = int_param(req, "wait_ms", None)
        if wait_ms is not None and not 0 <= wait_ms <= MAX_WAIT_MS:
            raise BadParam(f"wait_ms must be 0..{MAX_WAIT_MS}, got {wait_ms}")
        started = time.monotonic()
        while True:
            status, body = ask()
            if status not in (BEHIND, BUSY):
                return json_response(status, body)
            limit = (wait_ms / 1000 if wait_ms is not None else 0.0) if status == BEHIND \
                else max(_BUSY_WAIT_S, (wait_ms or 0) / 1000)
            if time.monotonic() - started >= limit:
                if status == BEHIND:
                    return json_response(TIMEOUT, {"status": TIMEOUT, **body, "waited_ms": wait_ms or 0,
                                                   "error": "the partition's committed position did not "
                                                            "reach min_position within wait_ms"})
                return json_response(UNAVAILABLE, {"status": UNAVAILABLE, **body,
                                                   "error": "the partition is written faster than a scan "
                                                            "page can be read: retry"})
            await asyncio.sleep(_RETRY_S)

    async def _entity(self, req: web.Request) -> web.Response:
        type_name, key = req.match_info["type"], req.match_info["key"]
        group = req.query.get("group")
        partition = int_param(req, "partition")
        min_position = int_param(req, "min_position")
        stale = bool_param(req, "stale")
        return await self._retrying(req, lambda: self._answers.entity(
            type_name, key, group=group, partition=partition, min_position=min_position, stale=stale))

    async def _group(self, req: web.Request) -> web.Response:
        q = req.query
        limit = int_param(req, "limit", 1000)
        assert limit is not None
        partition = int_param(req, "partition")
        min_position = int_param(req, "min_position")
        stale = bool_param(req, "stale")
        group = req.match_info["group"]
        return await self._retrying(req, lambda: self._answers.group(
            group, type_name=q.get("type"), prefix=q.get("prefix"), start=q.get("start"), end=q.get("end"),
            after=q.get("after"), limit=limit, partition=partition, min_position=min_position, stale=stale))

    async def _routing_handler(self, _req: web.Request) -> web.Response:
        return web.json_response(self._routing())

    async def _partitions_handler(self, _req: web.Request) -> web.Response:
        return web.json_response(self._partitions())

