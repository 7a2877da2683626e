"""The query reader: a process beside the worker that serves key reads (``--query-readers``).

Why a process: under load the worker's poll thread holds the GIL nearly all the time, and
an HTTP read served by a thread of the worker waits for it; the reader has an interpreter
of its own. The worker starts it (services/worker/query/readers.py); it serves the public
query port, and the worker's own endpoint (services/worker/query/server.py) moves to a
private loopback port, its *upstream*.

What it reads: RocksDB secondary instances of the worker's stores. The worker writes a
store only after the commit that carries the rows (services/worker/state.py), so whatever
a secondary catches up to is committed state. The worker sends every view it publishes
(partition, position, RocksDB sequence number; services/worker/query/views.py); the reader
answers a partition only while its secondary stands exactly at the sequence of a published
view, with that view's position. So an answer is one a view of the worker would give: never
a half-restored store (a restoring partition has no view), never uncommitted writes, and a
position that is exact.

Everything else goes upstream unchanged: group scans, stale reads, routing, partitions,
and every entity read this process cannot answer ``ok`` or ``not_found`` (moved, restoring,
behind ``min_position``, a partition with no matching view yet, an entity found through the
directory). The client cannot tell the difference, except by the ``X-Fifolane-Reader``
header (``reader`` or ``worker``).

Control (the worker writes JSON lines to stdin):

- ``{"op": "me", "worker", "url", "upstream", "input_partitions", "directory_partitions"}``
- ``{"op": "view", "p", "path", "position", "seq"}``: a published view of partition p;
- ``{"op": "stale", "p", "why"}``: p's view is behind the worker's store; its reads go to
  the worker until p's next ``view``;
- ``{"op": "withdraw", "p", "ack"}``: stop reading p, close its secondary, answer
  ``{"ack": k}`` on stdout (the worker waits for it before it closes or wipes the store).

The reader writes ``{"port": N}`` once it listens. End of stdin (the worker is gone, even
by SIGKILL): it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import ssl
import sys
import threading
from pathlib import Path
from typing import Any, cast

import aiohttp
from aiohttp import web
from rocksdict import AccessType, BlockBasedOptions, Cache, Options, Rdict

from fifolane.config import Settings
from fifolane.partitioner import partition_for
from fifolane.query import API, BAD_REQUEST, NOT_FOUND, OK
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.serde.state_records import StateRecordReader
from services.worker.query.answers import Answers
from services.worker.query.members import MemberInfo
from services.worker.query.secondary import ReaderLocal, Secondary
from services.worker.query.server import (
    MAX_WAIT_MS,
    BadParam,
    check_token,
    int_param,
    json_response,
    quiet_bad_http,
    refused,
)
from services.worker.state import PartitionStore

__all__ = ["Reader", "main"]

log = logging.getLogger("services.worker.query.reader")


SERVED_BY = "X-Fifolane-Reader"
_ENTITIES = API + "/entities/"
_GROUPS_MAX = 100_000
#: request headers passed to the worker's endpoint, and answer headers passed back
_FORWARDED = {"authorization", "content-type", "accept"}
_RETURNED = {"content-type", "retry-after", "allow", "www-authenticate"}


class Reader:
    """The reader's state and HTTP handlers (see the module docstring)."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.args = a
        catalog = SchemaCatalog.load(a.schemas_dir)
        codec = make_codec(Settings(schema_registry_url=a.registry_url), catalog)
        records = StateRecordReader(codec)

        def read_value(value: bytes) -> tuple[int, str] | None:
            found = records.read(value, None)
            return None if found is None else (found.version, found.group)

        self._read_value = read_value
        self.local = ReaderLocal(sorted(t.name for t in catalog), codec.decode, a.group_index, a.directory)
        self.answers = Answers(self.local)
        self.upstream = ""
        self.token: str | None = Path(a.token_file).read_text().strip() if a.token_file else None
        self.work = Path(a.work_dir)
        self._cache = Cache(a.cache_mb << 20)
        self._opening: dict[int, int] = {}  # partition -> generation of the open under way
        #: group -> partition (murmur2 in Python is a fair part of a read), for this many partitions
        self._groups: dict[str, int] = {}
        self._groups_of = 0
        #: views published while the partition's secondary opens
        self._pending: dict[int, list[tuple[int, int]]] = {}
        self._generation = 0
        #: partitions whose view the worker said is stale (their reads go to the worker)
        self.stale: set[int] = set()
        self.session: aiohttp.ClientSession | None = None
        #: when the worker last said it is alive (loop time); reads are answered here only
        #: within the lease after it (services/worker/query/readers.py)
        self.alive_at = float("-inf")
        self._failed = False
        self.lease = a.lease
        self.loop: asyncio.AbstractEventLoop | None = None

    # -- secondaries ---------------------------------------------------------------------------
    def _options(self) -> Options:
        opts = Options(raw_mode=True)
        table = BlockBasedOptions()
        table.set_block_cache(self._cache)
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        opts.set_max_open_files(-1)  # a secondary instance keeps every table file open
        return opts

    def _open(self, p: int, path: str, generation: int) -> Secondary:
        where = str(self.work / f"p{p}.{generation}")
        # (PartitionStore.unpack reads a row, raw rows through the value reader; it does not
        # touch the store's db.)
        rows = PartitionStore(cast(Rdict, None), p, Path(path), self.local.group_index, self._read_value)
        return Secondary(p, path, lambda at: Rdict(path, self._options(), access_type=AccessType.secondary(at)),
                         where, rows.unpack)

    def on_view(self, p: int, path: str, position: int, seq: int) -> None:
        self.stale.discard(p)
        sec = self.local.secondaries.get(p)
        if sec is not None and sec.path == path:
            sec.publish(seq, position)
            return
        if sec is not None:
            self._close(p)
        if p in self._opening:
            self._pending[p].append((seq, position))
            return
        self._generation += 1
        gen = self._generation
        self._opening[p] = gen
        self._pending[p] = [(seq, position)]
        assert self.loop is not None
        fut = self.loop.run_in_executor(None, self._open, p, path, gen)
        fut.add_done_callback(lambda f: self._opened(p, gen, f))

    def _opened(self, p: int, gen: int, fut: asyncio.Future[Secondary]) -> None:
        try:
            sec = fut.result()
        except Exception as exc:  # noqa: BLE001 - reads of p go upstream
            log.warning("partition %d: cannot open a secondary of the store (%s); its reads go to the worker", p, exc)
            if self._opening.get(p) == gen:
                del self._opening[p]
                self._pending.pop(p, None)
            return
        if self._opening.get(p) != gen:
            sec.close()  # withdrawn while it opened
            return
        del self._opening[p]
        for seq, position in self._pending.pop(p, []):
            sec.publish(seq, position)
        self.local.add(sec)

    def _close(self, p: int) -> None:
        self.stale.discard(p)
        self._opening.pop(p, None)
        self._pending.pop(p, None)
        sec = self.local.remove(p)
        if sec is not None:
            sec.close()

    def control(self, msg: dict[str, Any]) -> None:
        op = msg.get("op")
        if op == "view":
            self.on_view(int(msg["p"]), str(msg["path"]), int(msg["position"]), int(msg["seq"]))
        elif op == "stale":
            self.stale.add(int(msg["p"]))
        elif op == "withdraw":
            self._close(int(msg["p"]))
            _say({"ack": msg["ack"]})
        elif op == "me":
            self.local.set_me(MemberInfo(str(msg["worker"]), msg.get("url")))
            assert self.loop is not None
            self.alive_at = self.loop.time()
            self.upstream = str(msg["upstream"])
        elif op == "routing":
            self.local.set_routing(int(msg["input_partitions"]), int(msg["directory_partitions"]))
        elif op == "alive":
            assert self.loop is not None
            self.alive_at = self.loop.time()
            _say({"pong": msg.get("n")})

    # -- HTTP ----------------------------------------------------------------------------------
    def _partition(self, req: web.BaseRequest) -> int | None:
        """The partition an entity read names (None: found through the directory upstream)."""
        partition = int_param(req, "partition")
        if partition is not None:
            return partition
        group = req.query.get("group")
        n = self.local.routing_partitions()
        if group is None:
            return None if self.local.directory else 0
        if not n:
            return None
        if n != self._groups_of:
            self._groups.clear()
            self._groups_of = n
        p = self._groups.get(group)
        if p is None:
            if len(self._groups) >= _GROUPS_MAX:
                self._groups.clear()
            p = self._groups[group] = partition_for(group.encode(), n)
        return p

    async def handle(self, req: web.BaseRequest) -> web.StreamResponse:
        """Every request: key reads (``/v1/entities/{type}/{key}``) may be answered here;
        everything else is forwarded. (aiohttp's low-level server: no router, no middleware
        on the path every read takes.)"""
        denied = check_token(req, self.token)
        if denied is not None:
            return denied
        assert self.loop is not None
        quiet = self.loop.time() - self.alive_at
        if self.upstream and quiet > self.lease:
            # The worker is frozen (SIGSTOP, a stalled machine): it may have lost its
            # partitions to another worker by now, and would not answer a forwarded request.
            resp = json_response("unavailable", {"status": "unavailable", "error": (
                f"the worker has not been heard from for {quiet:.0f} s (paused?): retry, or ask another worker")})
            resp.headers[SERVED_BY] = "reader"
            return resp
        path = req.path
        if not path.startswith("/"):  # "OPTIONS *", an absolute URL: not a path of the API
            resp = json_response(BAD_REQUEST, {"status": BAD_REQUEST, "error": (
                f"the request target must be a path of the API (docs/formats.md, 'Query API'), got {path!r}")})
            resp.headers[SERVED_BY] = "reader"
            return resp
        if req.method == "GET" and path.startswith(_ENTITIES):
            type_name, _, key = path[len(_ENTITIES):].partition("/")
            if type_name and key:
                return await self.entity(req, type_name, key)
        return await self.forward(req)

    async def entity(self, req: web.BaseRequest, type_name: str, key: str) -> web.StreamResponse:
        """A key read: answered here when the partition's secondary stands at a published
        view and the answer is ``ok`` or ``not_found``; otherwise by the worker."""
        try:
            q = req.query
            wait_ms = int_param(req, "wait_ms")
            if "stale" not in q and (wait_ms is None or 0 <= wait_ms <= MAX_WAIT_MS):
                p = self._partition(req)
                if p is not None and p not in self.stale:
                    self.local.refresh(p)
                    status, body = self.answers.entity(
                        type_name, key, group=q.get("group"), partition=p,
                        min_position=int_param(req, "min_position"))
                    if status in (OK, NOT_FOUND):
                        resp = json_response(status, body)
                        resp.headers[SERVED_BY] = "reader"
                        return resp
        except BadParam:
            pass  # the worker words the error
        except Exception:  # noqa: BLE001 - the worker answers; the reader says why once
            if not self._failed:
                log.exception("a key read failed in the reader; it and the next ones that fail go to the worker")
                self._failed = True
        return await self.forward(req)

    async def forward(self, req: web.BaseRequest) -> web.StreamResponse:
        """The request, answered by the worker's own endpoint: method, path, query, body and
        the headers that matter go there, its status, body and headers come back."""
        assert self.session is not None
        for _ in range(40):  # a reader (re)started listens before the worker tells it where it is: 2 s
            if self.upstream:
                break
            await asyncio.sleep(0.05)
        else:
            return json_response("unavailable", {"status": "unavailable", "error": "the worker is starting: retry"})
        headers = {k: v for k, v in req.headers.items() if k.lower() in _FORWARDED}
        try:
            data = await req.read() if req.can_read_body else None
        except web.HTTPException as exc:  # a body over the size limit (413)
            resp = refused(exc, req.method, req.path)
            resp.headers[SERVED_BY] = "reader"
            return resp
        try:
            async with self.session.request(req.method, self.upstream + req.path_qs, headers=headers,
                                            data=data, allow_redirects=False) as up:
                body = await up.read()
                out = web.Response(status=up.status, body=body if req.method != "HEAD" else None,
                                   headers={k: v for k, v in up.headers.items() if k.lower() in _RETURNED})
        except (TimeoutError, aiohttp.ClientError) as exc:
            return json_response("unavailable", {"status": "unavailable",
                                                 "error": f"the worker did not answer ({exc}): retry"})
        out.headers[SERVED_BY] = "worker"
        return out


def _say(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def _follow_stdin(loop: asyncio.AbstractEventLoop, reader: Reader, done: asyncio.Event) -> None:
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            log.warning("ignored a control line that is not JSON: %.80r", line)
            continue
        loop.call_soon_threadsafe(reader.control, msg)
    loop.call_soon_threadsafe(done.set)  # the worker is gone


async def _serve(a: argparse.Namespace) -> None:
    quiet_bad_http()
    reader = Reader(a)
    reader.loop = asyncio.get_running_loop()
    # No limit on connections to the worker: forwarded reads may wait (wait_ms, up to 30 s),
    # and a pool of 100 made every other forwarded request queue behind them.
    reader.session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=MAX_WAIT_MS / 1000 + 30))
    tls = None
    if a.tls_cert:
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(a.tls_cert, a.tls_key)
    http = web.Server(reader.handle, access_log=None)
    server = await reader.loop.create_server(http, a.host, a.port, ssl=tls, backlog=512,
                                             reuse_port=a.reuse_port or None)
    _say({"port": int(server.sockets[0].getsockname()[1])})
    done = asyncio.Event()
    threading.Thread(target=_follow_stdin, args=(reader.loop, reader, done), daemon=True).start()
    await done.wait()
    for p in list(reader.local.secondaries):
        reader._close(p)
    await reader.session.close()
    server.close()
    await http.shutdown(1.0)


def run(main: Any) -> None:
    """Run the reader's event loop: uvloop's where it is installed (its transports cost about
    half of asyncio's per request), asyncio's otherwise."""
    try:
        import uvloop
    except ImportError:  # (Windows has none)
        asyncio.run(main)
        return
    uvloop.run(main)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--reuse-port", action="store_true")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--token-file")
    ap.add_argument("--schemas-dir", required=True)
    ap.add_argument("--registry-url")
    ap.add_argument("--group-index", type=int, default=1)
    ap.add_argument("--directory", type=int, default=1)
    ap.add_argument("--work-dir", required=True)
    ap.add_argument("--cache-mb", type=int, default=32)
    ap.add_argument("--lease", type=float, default=2.0)
    a = ap.parse_args(argv)
    a.group_index, a.directory = bool(a.group_index), bool(a.directory)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    Path(a.work_dir).mkdir(parents=True, exist_ok=True)
    try:
        run(_serve(a))
    finally:
        shutil.rmtree(a.work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
