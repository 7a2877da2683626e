"""A closed-loop load of key reads against one query endpoint (its own process).

    python -m benchmarks.query_load URL KEYS.json --seconds 10 --concurrency 32

KEYS.json is a list of ``[type, key, group]``. ``concurrency`` keep-alive connections each
keep one request in flight for ``seconds``; prints one JSON object: reads, reads/s,
latency percentiles (ms) of answered reads, the count of each answer status, and which
process answered (the ``X-Fifolane-Reader`` header).

The client is a few lines of asyncio protocol over pre-built requests, not a general HTTP
client: it is the measuring instrument, and on a 2-core machine an aiohttp client spent
~250 us of CPU per read, as much as the reads it measured (like ``wrk``, it stays out of the
way of what it measures). It speaks HTTP/1.1 with Content-Length answers, as the endpoint
does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from typing import Any
from urllib.parse import quote, urlsplit

from services.worker.query.reader import run

__all__ = ["main"]

_SERVED = b"\r\nx-fifolane-reader: "


class _Conn(asyncio.Protocol):
    """One keep-alive connection with one request in flight."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.done: asyncio.Future[bytes] | None = None
        self.transport: Any = None  # an asyncio or uvloop transport
        self.need = -1  # bytes of the whole answer, once its head is read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if self.need < 0:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            at = head.find(b"\r\ncontent-length:")
            if at < 0:
                self._fail(ValueError("an answer without Content-Length"))
                return
            length = int(head[at + 17:head.find(b"\r\n", at + 2) if head.find(b"\r\n", at + 2) > 0 else None])
            self.need = end + 4 + length
        if len(buf) >= self.need:
            answer = bytes(buf[:self.need])
            del buf[:self.need]
            self.need = -1
            if self.done is not None and not self.done.done():
                self.done.set_result(answer)

    def _fail(self, exc: Exception) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError(str(exc) if exc else "connection closed"))

    def ask(self, request: bytes) -> asyncio.Future[bytes]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.done


async def _load(url: str, keys: list[list[str]], seconds: float, concurrency: int,
                token: str | None) -> dict[str, Any]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    requests = [(f"GET {parts.path}/v1/entities/{quote(t, safe='')}/{quote(k, safe='')}?group={quote(g, safe='')} "
                 f"HTTP/1.1\r\nHost: {host}:{port}\r\n{auth}\r\n").encode() for t, k, g in keys]
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    served: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    rng = random.Random(7)
    end = time.monotonic() + seconds

    async def one() -> None:
        conn: _Conn | None = None
        while time.monotonic() < end:
            t0 = time.perf_counter()
            try:
                if conn is None:
                    _t, conn = await loop.create_connection(_Conn, host, port)
                answer = await conn.ask(requests[rng.randrange(len(requests))])
                head, _, body = answer.partition(b"\r\n\r\n")
                status = str(json.loads(body).get("status"))
                low = head.lower()
                at = low.find(_SERVED)
                by = low[at + len(_SERVED):low.find(b"\r\n", at + 2)].decode() if at >= 0 else "worker"
                served[by] = served.get(by, 0) + 1
            except (OSError, ValueError) as exc:
                status = type(exc).__name__
                if conn is not None and conn.transport is not None:
                    conn.transport.close()
                conn = None
            latencies.append((time.perf_counter() - t0) * 1000)
            statuses[status] = statuses.get(status, 0) + 1
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(concurrency)))
    took = time.monotonic() - t0
    latencies.sort()

    def pct(q: float) -> float | None:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 3) if latencies else None
    return {"reads": len(latencies), "seconds": round(took, 3), "reads_per_s": round(len(latencies) / took, 1),
            "p50_ms": pct(0.50), "p90_ms": pct(0.90), "p99_ms": pct(0.99), "max_ms": pct(1.0),
            "statuses": statuses, "served_by": served, "concurrency": concurrency}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("keys")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--token", default=None)
    a = ap.parse_args(argv)
    with open(a.keys) as f:
        keys = json.load(f)
    result: dict[str, Any] = {}

    async def go() -> None:
        result.update(await _load(a.url, keys, a.seconds, a.concurrency, a.token))
    run(go())
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
