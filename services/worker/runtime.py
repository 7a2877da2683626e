"""The worker: consume the input topic, run handlers per FIFO group, commit exactly once.

One poll thread owns the consumer, the producer, the stores and the scheduler. Handlers
that are not inline run on a thread pool (sync) or an asyncio loop (async); their results
come back through a queue and are applied on the poll thread, so every state change,
output and notification is produced from one thread, in group order.

Checkpoints: every ``commit_interval`` the worker stops taking new events, drains what it
has (every consumed event is then processed, superseded or dead-lettered), and commits
the produced records together with the input offsets in one Kafka transaction
(services/worker/checkpoint.py). Staged RocksDB writes are persisted after that commit.
A crash at any point therefore loses nothing and applies nothing twice: uncommitted work
is replayed from the input. The table handler's hot path is services/worker/fastpath.py.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from fifolane.config import Settings
from fifolane.serde import Decoded, SchemaCatalog, make_codec
from fifolane.serde.state_records import StateRecordReader, state_headers
from services.worker import checkpoint as checkpoints
from services.worker.app import App, Event, HandlerSpec, load_app, table_handler
from services.worker.calls import HandlerCalls, Result
from services.worker.clients import consumer_config, producer_config
from services.worker.dlq import dead_letter_headers
from services.worker.effects import Effects, Write
from services.worker.fastpath import ingest_batch
from services.worker.ingest import Rejected, to_event
from services.worker.metrics import Stats, serve_metrics, update_lag
from services.worker.options import WorkerOptions
from services.worker.rebalance import Rebalance
from services.worker.scheduler import GroupScheduler
from services.worker.state import PartitionStore, Row, StoreManager

__all__ = ["Worker", "load_app"]

log = logging.getLogger(__name__)

_EOF = KafkaError._PARTITION_EOF


class Worker:
    """A fifolane worker process (see the module docstring for the protocol)."""

    def __init__(self, settings: Settings, app: App | None = None,
                 options: WorkerOptions | None = None, *,
                 catalog: SchemaCatalog | None = None, listeners: Any = None) -> None:
        self.settings = settings
        self.app = app or App()
        self.opts = options or WorkerOptions(worker_id="worker")
        self.catalog = catalog or SchemaCatalog.load(settings.schemas_dir)
        self.codec = make_codec(settings, self.catalog)
        self.group_id = self.opts.group_id or f"fifolane-{self.app.name}"
        self.eos = self.opts.guarantee == "exactly-once"
        self.stats = Stats(worker_id=self.opts.worker_id)
        self.sched: GroupScheduler[Event] = GroupScheduler(self.opts.concurrency)
        state_dir = self.opts.state_dir or settings.home / "state" / self.opts.worker_id
        # Only app handlers read groups (GroupState.scan): a table-only worker keeps no index.
        reader = StateRecordReader(self.codec)

        def read_value(value: bytes) -> tuple[int, str] | None:
            found = reader.read(value, None)
            return None if found is None else (found.version, found.group)

        self.stores = StoreManager(Path(state_dir), self.group_id, group_index=bool(self.app.types),
                                   read_value=read_value)
        self.listeners = listeners  # optional change sink (cluster listeners)
        self.calls = HandlerCalls(self.opts.concurrency, self.opts.retries, self.opts.retry_backoff,
                                  self.codec, self.catalog)
        self._assigned: set[int] = set()
        self._next_offsets: dict[int, int] = {}  # input offsets to commit, per partition
        self._txn_start: dict[int, int] = {}  # first input offset of the open transaction
        self._txn_open = False
        self._stop = threading.Event()
        self._next_checkpoint = 0.0
        self._next_marker = 0.0
        self._next_stats = 0.0
        self._avg_call = 0.0  # seconds, EWMA over handler calls (pool and async handlers)
        self._recoveries: list[float] = []
        # librdkafka refuses larger records in produce() (MSG_SIZE_TOO_LARGE); its default is 1 MB.
        self._max_message_bytes = int(settings.librdkafka.get("message.max.bytes", 1_000_000)) - 1024
        self._delivery_error: KafkaError | None = None  # at-least-once: first failure since the last checkpoint
        self._producer_conf: dict[str, Any] = {}
        self.consumer: Consumer | None = None
        self.producer: Producer | None = None
        self.metrics_port: int | None = None
        self._state_topic = settings.state_topic
        self._dlq_topic = settings.dlq_topic
        # Entity types the fast path takes: handled by the built-in table handler, with key,
        # group and version in top-level fields -> (entity-key prefix, type header, fields).
        self._table_types: dict[str, tuple[bytes, bytes, str, str, str]] = {
            t.name: (f"{t.name}/".encode(), t.name.encode(), t.key_path, t.group_path, t.version_field)
            for t in self.catalog
            if self.app.handler_for(t.name).fn is table_handler
            and "." not in t.key_path + t.group_path + t.version_field
        }
        # Reads key, group and version of those types' upserts without decoding the record.
        # Change sinks get record=None and decode the value only if a listener needs it.
        self._scan = self.codec.scanner(self._table_types) if self._table_types else None

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        """Ask the poll loop to finish its checkpoint and leave the group."""
        self._stop.set()

    def _connect(self) -> None:
        s, o = self.settings, self.opts
        self.consumer = Consumer(s.kafka_config(**consumer_config(o, self.group_id)))
        pconf = producer_config(o, self.group_id, self._on_delivery_error)
        self._producer_conf = pconf
        self.producer = Producer(s.kafka_config(**pconf))
        if self.eos:
            # Fences a previous incarnation with the same id and aborts its open transaction.
            self.producer.init_transactions(60)
        if o.metrics_port is not None:
            self.metrics_port = serve_metrics(self.stats, o.metrics_port)
            log.info("metrics on :%d/metrics", self.metrics_port)
        rebalance = Rebalance(self)
        self.consumer.subscribe([s.input_topic], on_assign=rebalance.on_assign,
                                on_revoke=rebalance.on_revoke, on_lost=rebalance.on_lost)

    def run(self) -> None:
        """Process until :meth:`stop` (or SIGTERM via the CLI); always leaves cleanly."""
        # Objects from start-up (modules, schemas, clients) live as long as the process: keep
        # them out of the collector's scans, and collect young objects less often (the hot
        # path allocates several containers per event, nearly all freed at once).
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 20)
        self._connect()
        assert self.consumer is not None
        log.info("worker %s joined group %s (concurrency %d, %s)", self.opts.worker_id,
                 self.group_id, self.opts.concurrency, self.opts.guarantee)
        self._next_checkpoint = time.monotonic() + self.opts.commit_interval
        try:
            while not self._stop.is_set():
                self.poll_once()
            self.checkpoint()
        finally:
            self.close()

    def poll_once(self) -> None:
        """One turn of the loop: take a batch, run what is ready, checkpoint when due."""
        consumer = self.consumer
        assert consumer is not None
        sched = self.sched
        got = 0
        if sched.queued < self._buffer_limit():
            # What the client has fetched already; when that is nothing and nothing else is
            # waiting, block until the first record arrives (consume() would wait for a full
            # batch or the timeout: 100 ms of latency per batch at low rates).
            msgs = consumer.consume(1000, timeout=0)
            if not msgs and sched.idle():
                first = consumer.poll(0.1)
                if first is not None:
                    msgs = [first, *consumer.consume(999, timeout=0)]
            got = len(msgs)
            try:
                self._ingest_batch(msgs)
            except KafkaException as exc:  # the producer failed mid-batch: replay the batch
                self._abort(exc)
                return
        self._pump(block=got == 0 and sched.in_flight > 0)
        if time.monotonic() >= self._next_checkpoint:
            self.checkpoint()
        elif got == 0 and self._txn_open and sched.idle():
            # Caught up: nothing waits, so committing now costs no throughput and makes
            # the work visible without waiting for the interval.
            self.checkpoint()

    def _buffer_limit(self) -> int:
        """How many events may wait in group queues.

        A checkpoint drains them all, so they must be handled within about one commit
        interval (and well within the transaction timeout): with slow handlers the bound
        shrinks to what ``concurrency`` handlers get through in that time.
        """
        limit = self.opts.max_buffered
        if self._avg_call > 0:
            c = self.opts.concurrency
            limit = min(limit, max(4 * c, int(c * self.opts.commit_interval / self._avg_call)))
        return limit

    def close(self) -> None:
        if self.consumer is not None:
            try:
                self.consumer.close()  # revokes: our on_revoke checkpoints first
            except (KafkaException, RuntimeError) as exc:
                log.warning("consumer close: %s", exc)
            self.consumer = None
        if self.producer is not None:
            try:
                self.producer.flush(10)
            except KafkaException as exc:
                log.warning("producer flush on close: %s", exc)
            self.producer = None
        self.calls.shutdown()
        self.stores.close_all()
        if self.listeners is not None and hasattr(self.listeners, "close"):
            self.listeners.close()
        self._write_stats(force=True)

    # ------------------------------------------------------------------ ingest
    def _ingest_batch(self, msgs: list[Any]) -> None:
        """Take a consumed batch (the hot path: services/worker/fastpath.py)."""
        ingest_batch(self, msgs)

    def _ingest(self, msg: Any, decoded: Decoded | None = None) -> None:
        err = msg.error()
        if err is not None:
            if err.code() != _EOF:
                log.warning("consumer error: %s", err)
            return
        p = msg.partition()
        if p not in self._assigned:
            return  # prefetched for a partition we just gave up
        if not self._txn_open:
            self._begin()
        offset = msg.offset()
        self._next_offsets[p] = offset + 1
        self._txn_start.setdefault(p, offset)
        self.stats.consumed += 1
        event = to_event(msg, self.codec, decoded)
        if isinstance(event, Rejected):
            self._dead_letter(msg, event.reason, event.error)
            return
        spec = self.app.handler_for(event.type)
        if spec.inline and not self.sched.has_group(event.group):
            self._run_inline(event, spec)
        else:
            self.sched.submit(event)

    # ------------------------------------------------------------------ handlers
    def _run_inline(self, event: Event, spec: HandlerSpec) -> None:
        if spec.fn is table_handler:
            self._apply_table(event)
            return
        store = self.stores.stores[event.partition]
        if self._is_stale(store, event):
            return
        self._finish(self.calls.call_sync(event, spec, store), scheduled=False)

    def _start(self, event: Event) -> None:
        """Dispatch the head event of a group (called by the scheduler)."""
        store = self.stores.stores[event.partition]
        spec = self.app.handler_for(event.type)
        if spec.fn is table_handler:
            self._apply_table(event)
            self.sched.complete(event)
            return
        if self._is_stale(store, event):
            self.sched.complete(event)
            return
        if spec.inline:
            self._finish(self.calls.call_sync(event, spec, store))
        else:
            self.calls.submit(event, spec, store)

    def _is_stale(self, store: PartitionStore, event: Event) -> bool:
        row = store.get(event.entity_key)
        if row is not None and event.version <= row.version:
            self.stats.superseded += 1
            return True
        return False

    def _pump(self, block: bool) -> None:
        """Dispatch ready groups and apply finished handler calls until nothing moves."""
        sched = self.sched
        while True:
            sched.dispatch(self._start)
            try:
                completions = self.calls.completions
                result = completions.get(timeout=0.005) if block else completions.get_nowait()
            except queue.Empty:
                break
            self._finish(result)
            block = False
        self.stats.in_flight = sched.in_flight
        self.stats.ready_groups = sched.ready_groups
        self.stats.max_in_flight = sched.max_in_flight

    def _finish(self, result: Result, scheduled: bool = True) -> None:
        event, effects, exc, retries, took = result
        self.stats.handler_retries += retries
        self._avg_call += 0.05 * (took - self._avg_call)  # EWMA of a handler call
        refused = None if exc is not None or effects is None else self._too_large(effects)
        if exc is not None:
            log.warning("handler failed for %s %s (group %s, offset %d) after %d retries: %r",
                        event.type, event.key, event.group, event.offset, retries, exc)
            self._dead_letter_event(event, "handler-error", f"{type(exc).__name__}: {exc}")
        elif refused is not None:
            # Kafka would refuse it on every replay: none of the call's effects are applied.
            log.warning("handler result for %s %s (group %s, offset %d) refused: %s",
                        event.type, event.key, event.group, event.offset, refused)
            self._dead_letter_event(event, "handler-error", refused)
        else:
            assert effects is not None
            self._apply(event, effects)
            self.stats.processed += 1
        if scheduled:
            self.sched.complete(event)

    # ------------------------------------------------------------------ effects
    def _apply_table(self, event: Event) -> None:
        """The built-in table handler, without the generic machinery (events that
        :meth:`_ingest_batch` hands to the general path: deletes, busy groups)."""
        store = self.stores.stores[event.partition]
        ekey = event.entity_key
        old = store.get(ekey)
        if old is not None and event.version <= old.version:
            self.stats.superseded += 1
            return
        deleted = event.op == "delete"
        new = Row(event.version, deleted, event.group, None if deleted else event.raw)
        self._write(store, event, ekey, old, new, event.value)
        self.stats.processed += 1

    def _too_large(self, effects: Effects) -> str | None:
        """Why a record of ``effects`` cannot be produced (over the producer's
        ``message.max.bytes``), or None. Checked before anything is applied, so a handler
        result is applied whole or dead-lettered whole."""
        limit = self._max_message_bytes
        for out in effects.outputs:
            size = (_size(out.value) + _size(out.key)
                    + sum(len(name) + len(value) + 8 for name, value in out.headers))
            if size > limit:
                return (f"output record for topic {out.topic} is {size} bytes, over the producer's "
                        f"message.max.bytes ({limit}); send less, or raise it in FIFOLANE_LIBRDKAFKA "
                        "(and max.message.bytes of the topic)")
        for w in effects.writes.values():
            size = _size(w.value) + len(w.type) + len(w.key) + len(w.group) + 64
            if size > limit:
                return (f"{w.type} {w.key} encodes to {size} bytes, over the producer's "
                        f"message.max.bytes ({limit})")
        return None

    def _apply(self, event: Event, effects: Effects) -> None:
        store = self.stores.stores[event.partition]
        for ekey, w in effects.writes.items():
            old = store.get(ekey)
            if old is not None and w.version <= old.version:
                self.stats.writes_superseded += 1
                continue
            self._write(store, event, ekey, old, _row(w), w.record)
        produce = self._produce
        for out in effects.outputs:
            produce(out.topic, out.value, out.key, headers=list(out.headers))
            self.stats.outputs += 1

    def _write(self, store: PartitionStore, event: Event, ekey: bytes, old: Row | None,
               new: Row, record: dict[str, Any] | None) -> None:
        store.put(ekey, new, old)
        # A tombstone keeps the delete's version (and group) in headers; an upsert has them
        # in its value (docs/formats.md).
        headers = (state_headers(ekey[: ekey.find(b"/")], new.group.encode(), new.version)
                   if new.deleted or self.settings.state_headers else None)
        self._produce(self._state_topic, new.value, ekey, partition=event.partition, headers=headers)
        self.stats.state_writes += 1
        if self.listeners is not None:
            self.listeners.on_change(self, event, ekey, old, new, record)

    def _produce(self, topic: str, value: bytes | str | None, key: bytes | str | None,
                 partition: int = -1, headers: Any = None) -> None:
        producer = self.producer
        assert producer is not None
        while True:
            try:
                if headers is None:
                    producer.produce(topic, value, key, partition)
                else:
                    producer.produce(topic, value, key, partition, headers=headers)
                return
            except BufferError:
                producer.poll(0.05)  # local queue full: let deliveries drain

    def _on_delivery_error(self, err: KafkaError | None, msg: Any) -> None:
        """At-least-once only (exactly-once learns of failures from the commit): the
        checkpoint then commits no offsets and replays its input instead."""
        if err is not None:
            log.error("delivery to %s[%s] failed: %s", msg.topic(), msg.partition(), err)
            if self._delivery_error is None:
                self._delivery_error = err

    def _dead_letter(self, msg: Any, reason: str, error: str) -> None:
        headers = dead_letter_headers(msg.headers(), msg.topic() or "", msg.partition(), msg.offset(),
                                      reason, error, self.opts.worker_id)
        self._produce(self._dlq_topic, msg.value(), msg.key(), headers=headers)
        self.stats.dead_lettered += 1
        self.stats.dead_letter_reasons[reason] += 1

    def _dead_letter_event(self, event: Event, reason: str, error: str) -> None:
        headers = dead_letter_headers(event.headers, self.settings.input_topic, event.partition,
                                      event.offset, reason, error, self.opts.worker_id)
        self._produce(self._dlq_topic, event.raw, event.group.encode(), headers=headers)
        self.stats.dead_lettered += 1
        self.stats.dead_letter_reasons[reason] += 1

    # ------------------------------------------------------------------ for change sinks
    def produce(self, topic: str, value: bytes | str | None, key: bytes | str | None,
                partition: int = -1, headers: Any = None) -> None:
        """Send a record inside the current checkpoint's transaction (opened if needed).

        For change sinks (cluster listeners): records sent here commit atomically with the
        state changes and input offsets of the same checkpoint.
        """
        if not self._txn_open:
            self._begin()
        self._produce(topic, value, key, partition, headers)

    @property
    def assigned_partitions(self) -> list[int]:
        return sorted(self._assigned)

    # ------------------------------------------------------------------ checkpoints
    def _begin(self) -> None:
        if self.eos:
            assert self.producer is not None
            self.producer.begin_transaction()
        self._txn_open = True

    def drain(self) -> None:
        """Run until every consumed event is processed, superseded or dead-lettered."""
        while not self.sched.idle():
            self._pump(block=True)

    def checkpoint(self) -> None:
        """Drain, then commit outputs, state and input offsets together (see checkpoint.py)."""
        checkpoints.checkpoint(self)

    def _abort(self, exc: KafkaException) -> None:
        checkpoints.abort(self, exc)

    def _rewind(self) -> None:
        checkpoints.rewind(self)

    # ------------------------------------------------------------------ rebalancing
    def _release(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._assigned.discard(tp.partition)
            self._next_offsets.pop(tp.partition, None)
            self._txn_start.pop(tp.partition, None)
            self.stores.close(tp.partition)
        if self.listeners is not None:
            self.listeners.on_release(self, [tp.partition for tp in partitions])
        self.stats.assigned = sorted(self._assigned)

    # ------------------------------------------------------------------ reporting
    def _write_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if (self.opts.stats_file is None and self.metrics_port is None) or (now < self._next_stats and not force):
            return
        self._next_stats = now + 0.5
        if self.consumer is not None:
            update_lag(self.stats, self.consumer, self.settings.input_topic, self._assigned)
        if self.opts.stats_file is not None:
            self.stats.write(Path(self.opts.stats_file))


def _size(data: bytes | str | None) -> int:
    if data is None:
        return 0
    return len(data.encode()) if isinstance(data, str) else len(data)


def _row(w: Write) -> Row:
    return Row(w.version, w.value is None, w.group, w.value)
