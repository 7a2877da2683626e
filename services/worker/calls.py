"""Running handlers: inline, on a thread pool (sync) or an asyncio loop (async), with retries.

Results (event, effects, error, retries, seconds) come back through a queue that the poll
thread drains; a handler's effects are applied only there.
"""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from fifolane.errors import AppError
from services.worker.app import Event, HandlerSpec, Output
from services.worker.effects import CallState, Effects, Write
from services.worker.records import RecordCache
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
        #: calls submitted whose result was not taken yet (submit, take: the poll thread's)
        self.outstanding = 0
        #: decoded records handlers read, by their bytes (services/worker/records.py)
        self._decode_value = codec.decoder()
        self._encoder = codec.encoder()  # CallState.put: encode without the codec's frames
        self.records = RecordCache(self._decode, catalog)
        self._pool: _HandlerThreads | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _decode(self, data: bytes) -> dict[str, Any]:
        record: dict[str, Any] = self._decode_value(data).record
        return record

    def decode_value(self, data: bytes) -> dict[str, Any]:
        """The record of an entity value (the handler's own copy)."""
        return self.records.read(data)

    def _state(self, event: Event, store: PartitionStore, seed: dict[bytes, Write] | None) -> CallState:
        state = CallState(event, store, self._encoder, self.catalog, self.records)
        if seed:  # a copy per attempt: the record a failed attempt changed is not the next one's
            state.effects.writes.update({k: Write(w.type, w.key, w.group, w.version, w.value, copy.deepcopy(w.record))
                                         for k, w in seed.items()})
        return state

    def _pristine(self, event: Event) -> dict[str, Any] | None:
        """A copy of a value a retry could not decode again (a later stage's event: its value
        is the earlier stage's write); None for the rest (the common case: no copy)."""
        return copy.deepcopy(event.value) if event.passed and event.value is not None else None

    def _as_it_came(self, event: Event, pristine: dict[str, Any] | None) -> None:
        """Before a retry: the event's value as it came, not as the failed attempt left it (a
        handler may change it in place: that change was committed once)."""
        if event.value is None:
            return
        if pristine is not None:
            event.value = copy.deepcopy(pristine)
        elif event.raw:
            event.value = self._decode(event.raw)

    def call_sync(self, event: Event, spec: HandlerSpec, store: PartitionStore, timed: bool = True,
                  seed: dict[bytes, Write] | None = None) -> Result:
        """Call a sync handler; ``timed=False`` (inline calls): its seconds are reported as 0.
        ``seed``: writes the call starts with (what its reads see first)."""
        attempt = 0
        t0 = time.perf_counter() if timed else 0.0
        pristine = self._pristine(event)
        while True:
            state = self._state(event, store, seed)
            try:
                result = spec.fn(event, state)
                if result is not None:
                    _collect(state, result)
                return event, state.effects, None, attempt, time.perf_counter() - t0 if timed else 0.0
            except BaseException as exc:  # noqa: BLE001 - any handler failure (SystemExit,
                # KeyboardInterrupt and CancelledError raised by a handler too) is retried,
                # then dead-lettered: it must not kill the handler thread or lose its completion
                if attempt >= self.retries:
                    return event, None, exc, attempt, time.perf_counter() - t0
                time.sleep(self.backoff * (2**attempt))
                attempt += 1
                self._as_it_came(event, pristine)

    async def call_async(self, event: Event, spec: HandlerSpec, store: PartitionStore,
                         seed: dict[bytes, Write] | None = None) -> Result:
        attempt = 0
        t0 = time.perf_counter()
        pristine = self._pristine(event)
        while True:
            state = self._state(event, store, seed)
            try:
                _collect(state, await spec.fn(event, state))
                return event, state.effects, None, attempt, time.perf_counter() - t0
            except BaseException as exc:  # noqa: BLE001 - as in call_sync
                if attempt >= self.retries:
                    return event, None, exc, attempt, time.perf_counter() - t0
                await asyncio.sleep(self.backoff * (2**attempt))
                attempt += 1
                self._as_it_came(event, pristine)

    def call_now(self, event: Event, spec: HandlerSpec, store: PartitionStore,
                 seed: dict[bytes, Write] | None = None) -> Result:
        """Call ``spec`` and wait for its result, sync or async (an entity leaving its group:
        services/worker/moveouts.py); ``seed`` as in :meth:`call_sync`."""
        if not spec.is_async:
            return self.call_sync(event, spec, store, False, seed)
        future = asyncio.run_coroutine_threadsafe(self.call_async(event, spec, store, seed), self._async_loop())
        try:
            return future.result()
        except BaseException as exc:  # noqa: BLE001 - as in _done: the call itself broke
            return event, None, exc, 0, 0.0

    def submit(self, event: Event, spec: HandlerSpec, store: PartitionStore,
               seed: dict[bytes, Write] | None = None) -> None:
        """Start a call in the background; its result arrives on :attr:`completions`.
        ``seed`` as in :meth:`call_sync`."""
        self.outstanding += 1
        if spec.is_async:
            fut = asyncio.run_coroutine_threadsafe(self.call_async(event, spec, store, seed), self._async_loop())
            fut.add_done_callback(lambda f: self._done(event, f))
            return
        if self._pool is None:
            self._pool = _HandlerThreads(self.concurrency, self.call_sync, self.completions)
        self._pool.calls.put((event, spec, store, True, seed))

    def _done(self, event: Event, fut: Future[Result]) -> None:
        try:
            result = fut.result()
        except BaseException as exc:  # noqa: BLE001 - the call itself was cancelled or broke
            result = (event, None, exc, 0, 0.0)
        self.completions.put(result)

    def _async_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="handler-loop", daemon=True).start()
            self._loop = loop
        return self._loop

    def take(self, timeout: float | None) -> Result:
        """The result of a call :meth:`submit` started, the first to finish (``timeout``:
        seconds to wait for one, None: none); :class:`queue.Empty` if there is none."""
        completions = self.completions
        result = completions.get_nowait() if timeout is None else completions.get(timeout=timeout)
        self.outstanding -= 1
        return result

    def forget_completions(self) -> None:
        """Wait for the calls still running (after an abort: their events are replayed) and
        drop every result not taken. Only calls :meth:`submit` started are waited for: an
        event whose lane is busy without one (a failure in its synchronous start) is not.
        Calls waiting for a handler thread (dispatched ahead) are dropped, never started."""
        if self._pool is not None:
            self.outstanding -= self._pool.drop_waiting()
        for _ in range(self.outstanding):
            self.completions.get()
        self.outstanding = 0
        while True:
            try:
                self.completions.get_nowait()
            except queue.Empty:
                return

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop = None


class _HandlerThreads:
    """``n`` threads that run sync handler calls and put the results on ``completions``.

    Lighter than a ThreadPoolExecutor (no Future, lock and callback per call): with slow
    handlers at high concurrency the per-call overhead, paid under the GIL, is what limits
    the speed-up. Calls beyond ``n`` wait in :attr:`calls` (the scheduler's ``ahead``).
    """

    def __init__(self, n: int, call: Any, completions: queue.SimpleQueue[Result]) -> None:
        self.calls: queue.SimpleQueue[tuple[Event, HandlerSpec, PartitionStore, bool, dict[bytes, Write] | None] | None] = \
            queue.SimpleQueue()
        self._call = call
        self._completions = completions
        self._threads = [threading.Thread(target=self._run, name=f"handler-{i}", daemon=True) for i in range(n)]
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        get, put, call = self.calls.get, self._completions.put, self._call
        while True:
            item = get()
            if item is None:
                return
            try:
                result = call(*item)
            except BaseException as exc:  # noqa: BLE001 - never lose a completion
                result = (item[0], None, exc, 0, 0.0)
            put(result)

    def drop_waiting(self) -> int:
        """Drop the calls no thread took yet; how many."""
        dropped = 0
        while True:
            try:
                dropped += self.calls.get_nowait() is not None
            except queue.Empty:
                return dropped

    def shutdown(self) -> None:
        """Drop calls not started yet, let running ones finish, then stop the threads."""
        self.drop_waiting()
        for _ in self._threads:
            self.calls.put(None)
        for t in self._threads:
            t.join()


def _collect(state: CallState, result: Any) -> None:
    if result is None:
        return
    if isinstance(result, (dict, str, bytes)) or not (isinstance(result, Output) or hasattr(result, "__iter__")):
        raise AppError(f"a handler may return None, an Output or Outputs, got {type(result).__name__}")
    outputs = [result] if isinstance(result, Output) else list(result)
    for out in outputs:
        if not isinstance(out, Output):
            raise AppError(f"a handler may return None, an Output or Outputs, got a {type(out).__name__} among them")
        state.effects.outputs.append(out)


