"""A tiny in-memory Schema Registry for tests and demos (not for production).

It speaks the subset of the Confluent REST API fifolane uses: register a schema under a
subject, fetch a schema by id, list subjects. Use :meth:`FakeSchemaRegistry.transport` for
in-process httpx tests, or :meth:`FakeSchemaRegistry.serve` for a real HTTP endpoint on
127.0.0.1 that other processes (``fifolane produce``) can reach.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

__all__ = ["FakeSchemaRegistry"]

_REGISTER = re.compile(r"/subjects/([^/]+)/versions/?")
_BY_ID = re.compile(r"/schemas/ids/(\d+)/?")


class FakeSchemaRegistry:
    """Schemas by id and subjects by name, in memory; ids are global and start at 1."""

    def __init__(self) -> None:
        self.schemas: dict[int, str] = {}
        self.subjects: dict[str, list[int]] = {}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def handle(self, method: str, path: str, body: bytes) -> tuple[int, Any]:
        """One REST call: ``(status, JSON body)``."""
        with self._lock:
            self.requests.append((method, path))
            if method == "POST" and (m := _REGISTER.fullmatch(path)):
                schema = str(json.loads(body)["schema"])
                # Like the real registry: the same schema text keeps its id across subjects.
                schema_id = next((i for i, s in self.schemas.items() if s == schema), None)
                if schema_id is None:
                    schema_id = len(self.schemas) + 1
                    self.schemas[schema_id] = schema
                versions = self.subjects.setdefault(m.group(1), [])
                if schema_id not in versions:
                    versions.append(schema_id)
                return 200, {"id": schema_id}
            if method == "GET" and (m := _BY_ID.fullmatch(path)):
                found = self.schemas.get(int(m.group(1)))
                if found is None:
                    return 404, {"error_code": 40403, "message": "Schema not found"}
                return 200, {"schema": found}
            if method == "GET" and path.rstrip("/") == "/subjects":
                return 200, sorted(self.subjects)
            return 404, {"error_code": 404, "message": f"no route {method} {path}"}

    def transport(self) -> httpx.MockTransport:
        """An httpx transport answering from this registry (no sockets)."""

        def handler(request: httpx.Request) -> httpx.Response:
            status, body = self.handle(request.method, request.url.path, request.content)
            return httpx.Response(status, json=body)

        return httpx.MockTransport(handler)

    @contextmanager
    def serve(self) -> Iterator[str]:
        """Serve over HTTP on 127.0.0.1 (a free port) while the block runs; yields the URL."""
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                status, body = registry.handle(self.command, self.path, self.rfile.read(length))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        thread = threading.Thread(target=server.serve_forever, name="fake-registry", daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
