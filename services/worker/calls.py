"""Running handlers: inline, on a thread pool (sync) or an asyncio loop (async), with retries.

Results (event, effects, error, retries, seconds) come back through a queue that the poll
thread drains; a handler's effects are applied only there.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from services.worker.app import Event, HandlerSpec, Output
from services.worker.effects import CallState, Effects
from services.worker.state import PartitionStore

__all__ = ["HandlerCalls", "Result"]

Result = tuple[Event, Effects | None, BaseException | None, int, float]


class HandlerCalls:
    """Calls handlers with retries and exponential backoff; a failure after the last retry
    is returned (the worker dead-letters it), never raised."""

    def __init__(self, concurrency: int, retries: int, backoff: float, codec: Any, catalog: Any) -> None:
        self.concurrency = concurrency
        self.retries = retries
        self.backoff = backoff
        self.codec = codec
        self.catalog = catalog
        self.completions: queue.SimpleQueue[Result] = queue.SimpleQueue()
        self._pool: ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def decode_value(self, data: bytes) -> dict[str, Any]:
        record: dict[str, Any] = self.codec.decode(data).record
        return record

    def _state(self, event: Event, store: PartitionStore) -> CallState:
        return CallState(event, store, self.codec, self.catalog, self.decode_value)

    def call_sync(self, event: Event, spec: HandlerSpec, store: PartitionStore) -> Result:
        attempt = 0
        t0 = time.perf_counter()
        while True:
            state = self._state(event, store)
            try:
                _collect(state, spec.fn(event, state))
                return event, state.effects, None, attempt, time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
                if attempt >= self.retries:
                    return event, None, exc, attempt, time.perf_counter() - t0
                time.sleep(self.backoff * (2**attempt))
                attempt += 1

    async def call_async(self, event: Event, spec: HandlerSpec, store: PartitionStore) -> Result:
        attempt = 0
        t0 = time.perf_counter()
        while True:
            state = self._state(event, store)
            try:
                _collect(state, await spec.fn(event, state))
                return event, state.effects, None, attempt, time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001
                if attempt >= self.retries:
                    return event, None, exc, attempt, time.perf_counter() - t0
                await asyncio.sleep(self.backoff * (2**attempt))
                attempt += 1

    def submit(self, event: Event, spec: HandlerSpec, store: PartitionStore) -> None:
        """Start a call in the background; its result arrives on :attr:`completions`."""
        fut: Future[Result]
        if spec.is_async:
            fut = asyncio.run_coroutine_threadsafe(self.call_async(event, spec, store), self._async_loop())
        else:
            fut = self._thread_pool().submit(self.call_sync, event, spec, store)
        fut.add_done_callback(self._done)

    def _done(self, fut: Future[Result]) -> None:
        self.completions.put(fut.result())

    def _thread_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="handler")
        return self._pool

    def _async_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="handler-loop", daemon=True).start()
            self._loop = loop
        return self._loop

    def forget_completions(self) -> None:
        while True:
            try:
                self.completions.get_nowait()
            except queue.Empty:
                return

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


def _collect(state: CallState, result: Any) -> None:
    if result is None:
        return
    outputs = [result] if isinstance(result, Output) else list(result)
    for out in outputs:
        if not isinstance(out, Output):
            raise TypeError(f"a handler may return None or Output records, got {type(out).__name__}")
        state.effects.outputs.append(out)


