"""The worker: consume the input topic, run handlers per FIFO group, commit exactly once.

The :class:`Worker` is the poll loop and the wiring; the parts it wires own their state:

- :class:`services.worker.checkpoint.Checkpoint`: the producer, the open transaction, rewinds;
- :class:`services.worker.assignment.Assignment`: owned partitions, their restores, their
  :class:`services.worker.table.TableApplier` (every entity write goes through one);
- :class:`services.worker.fastpath.FastPath`: taking consumed batches;
- :class:`services.worker.scheduler.GroupScheduler` and
  :class:`services.worker.calls.HandlerCalls`: per-group order and handler calls;
- a :class:`services.worker.sink.ChangeSink` (cluster listeners), seeing a narrow context.

One poll thread owns all of it. Handlers that are not inline run on threads (sync) or an asyncio
loop (async); the poll thread applies their results, so every state change, output and
notification comes from one thread, in group order. It commits each partition up to its first
unfinished event (window.py) ``commit_interval`` after a transaction opened, and when idle.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from fifolane.config import Settings
from fifolane.errors import KafkaClientError, TransactionAbortedError
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.serde.state_records import StateRecordReader
from services.worker.app import App, Event, load_app, table_handler
from services.worker.assignment import Assignment, Topics
from services.worker.calls import HandlerCalls
from services.worker.checkpoint import Checkpoint, Outcome
from services.worker.clients import KafkaClients, needed_access, producer_config
from services.worker.events import Processing
from services.worker.fastpath import FastPath, TableType
from services.worker.kafka import Record, WorkerConsumer
from services.worker.limits import Limits, TopicConfigs, buffer_limit
from services.worker.linked import worker_consumer
from services.worker.liveness import Heartbeat
from services.worker.metrics import Stats, serve_metrics, update_lag
from services.worker.options import WorkerOptions
from services.worker.orphans import orphan_watch
from services.worker.pacing import PAUSE_S, SMALL, EarlySend, caught_up, settle_gc
from services.worker.parking import Parking
from services.worker.partitions import PartitionParts
from services.worker.query.service import attach as attach_query
from services.worker.rebalance import Rebalance, fatal_error
from services.worker.scheduler import GroupScheduler, lanes_ahead
from services.worker.sink import ChangeSink, Context
from services.worker.state import StoreManager

__all__ = ["Worker", "load_app", "settle_gc"]

log = logging.getLogger(__name__)


class Worker:
    """A fifolane worker process (see the module docstring).

    ``sink``: an optional change sink (``listeners``: its older name). ``clients``: makes the
    Kafka clients (:class:`services.worker.clients.KafkaClients`; unit tests pass fakes).
    """

    def __init__(self, settings: Settings, app: App | None = None,
                 options: WorkerOptions | None = None, *, catalog: SchemaCatalog | None = None,
                 sink: ChangeSink | None = None, listeners: ChangeSink | None = None,
                 clients: KafkaClients | None = None) -> None:
        self.settings = settings
        self.app = app or App()
        self.opts = options or WorkerOptions(worker_id="worker")
        self.catalog = catalog or SchemaCatalog.load(settings.schemas_dir)
        self.app.check(self.catalog)
        self.codec = make_codec(settings, self.catalog)
        self.group_id = self.opts.group_id or f"fifolane-{self.app.name}"
        self.eos = self.opts.guarantee == "exactly-once"
        self.stats = Stats(worker_id=self.opts.worker_id)
        self.sink: ChangeSink | None = sink if sink is not None else listeners
        self.sched: GroupScheduler[Event] = GroupScheduler(self.opts.concurrency, lanes_ahead(self.opts.concurrency, has_async=self.app.has_async, parks=self.opts.on_failure == "park"))
        self.calls = HandlerCalls(self.opts.concurrency, self.opts.retries, self.opts.retry_backoff, self.codec, self.catalog)
        self._stop = threading.Event()
        self._next_checkpoint = 0.0
        self._next_stats = 0.0
        self.metrics_port: int | None = None
        self._rebalance: Rebalance | None = None
        self._alive: Heartbeat | None = None  # one live process per --worker-id (liveness.py)
        self.topics = Topics(settings.input_topic, settings.directory_topic if self.opts.directory else None)
        state_dir = Path(self.opts.state_dir or settings.home / "state" / self.opts.worker_id)
        reader = StateRecordReader(self.codec)

        def read_value(value: bytes) -> tuple[int, str] | None:
            found = reader.read(value, None)
            return None if found is None else (found.version, found.group)

        # Only app handlers read groups (GroupState.scan): a table-only worker keeps no index.
        # Query readers' secondaries catch up through RocksDB's write-ahead log.
        self.stores = StoreManager(state_dir, self.group_id, group_index=bool(self.app.types), read_value=read_value,  # owner: one
                                   wal=self.opts.query_port is not None and self.opts.query_readers > 0, owner=self.opts.worker_id)  # process (storedirs.py)
        self._dir_stores = (StoreManager(state_dir, f"{self.group_id}.directory", cache_mb=16,
                                         write_buffer_mb=16, group_index=False)
                            if self.topics.directory else None)
        self._read_state = reader.read
        # Entity types the fast path takes: handled by the built-in table handler, with key,
        # group and version in top-level fields.
        self._table_types: dict[str, TableType] = {
            t.name: (f"{t.name}/".encode(), t.name.encode(), t.key_path, t.group_path, t.version_field)
            for t in self.catalog
            if self.app.handler_for(t.name).fn is table_handler and not self.app.stages_of(t.name)
            and "." not in t.key_path + t.group_path + t.version_field
        } if self.opts.fast_path else {}
        self.consumer: WorkerConsumer | None = None
        self.ckpt: Checkpoint | None = None
        self.assignment: Assignment | None = None
        self._fast: FastPath | None = None
        self.processing: Processing | None = None
        self.parking: Parking | None = None
        self._topic_configs = TopicConfigs(lambda names: self.clients.topic_configs(names, timeout=10))
        self.limits = Limits(int(settings.librdkafka.get("message.max.bytes", 1_000_000)), self._topic_configs.max_bytes,
                             settings.state_headers, reread=self._topic_configs.reread)  # read again after a refusal (bisect.py)
        self._retention_ms: int | None = None
        self.clients = clients or KafkaClients(settings.kafka_config())
        self.query = attach_query(self)  # the query endpoint (services/worker/query/)
        self._early = EarlySend()  # low rates: records leave before the commit (pacing.py)

    # ------------------------------------------------------------------ lifecycle
    def stop(self) -> None:
        """Ask the poll loop to finish its checkpoint and leave the group."""
        self._stop.set()

    def connect(self) -> None:
        """Make the clients and join the group (``run`` does this first)."""
        s, o = self.settings, self.opts
        clients = self.clients
        names, need = needed_access(s, self.topics, registry=self.sink is not None, parked=o.on_failure == "park")
        self._topic_configs.known.update(clients.topic_configs(names, need=need, group=self.group_id))
        self._alive = clients.alive(s.members_topic, self.group_id, o.worker_id) if o.static_membership else None  # before anything fences
        self.consumer = worker_consumer(clients, o, self.group_id, self.topics)  # after the checks: a
        producer = clients.producer(producer_config(o, self.group_id), transactional=self.eos)  # refusal makes none
        retention = self._topic_configs.known.get(s.state_topic, {}).get("delete.retention.ms")
        self._retention_ms = int(retention) if retention else None
        staged: list[Any] = [self.stores] + ([self._dir_stores] if self._dir_stores else []) + self.query.staged()
        self.ckpt = Checkpoint(producer, self.consumer, staged, eos=self.eos, stats=self.stats, stop=self._stop, reread_limits=self.limits.refresh)
        if self.eos:  # fences a previous incarnation with the same id, settles its transaction
            producer.init()
        self.parking = self._parking_of(s.parked_topic)
        parts = PartitionParts(settings=s, topics=self.topics, clients=clients, consumer=self.consumer,
                               ckpt=self.ckpt, stores=self.stores, directory_stores=self._dir_stores,
                               stats=self.stats, limits=self.limits, sink=self.sink, parking=self.parking,
                               read_state=self._read_state, wait_open_txn_s=o.transaction_timeout_ms / 1000 * 2,
                               tombstone_retention_ms=self._retention_ms)
        parts = self.query.start(parts)  # the same parts, with the query endpoint's hooks
        self.stores.marks = parts.changelog_end
        self.assignment = Assignment(self.topics, self.consumer, self.ckpt, stores=self.stores,
                                     directory_stores=self._dir_stores, restore=parts.restore,
                                     make_table=parts.make_table, make_directory=parts.make_directory,
                                     sink=self.sink, stats=self.stats, on_release=parts.released)
        self.processing = Processing(
            app=self.app, codec=self.codec, topics=self.topics, state_topic=s.state_topic,
            dlq_topic=s.dlq_topic, worker_id=o.worker_id, ckpt=self.ckpt, tables=self.assignment.tables,
            directories=self.assignment.directories, sched=self.sched, calls=self.calls,
            limits=self.limits, stats=self.stats, claim=parts.claim, parking=self.parking,
            park_failures=o.on_failure == "park")
        self._fast = FastPath(input_topic=self.topics.input, tables=self.assignment.tables,
                              table_types=self._table_types, codec=self.codec, busy=self.sched.queues,
                              ckpt=self.ckpt, stats=self.stats, sink=self.sink,
                              general=self.processing.take, refuse=self.processing.refuse,
                              directory_topic=self.topics.directory, directories=self.assignment.directories,
                              parking=self.parking)
        if self.sink is not None:
            self.sink.open(Context(self.ckpt, self.stores, self.codec, self.catalog, self.limits,
                                   self.dead_letter, o.worker_id))
        if o.metrics_port is not None:
            self.metrics_port = serve_metrics(self.stats, o.metrics_port, o.metrics_host)
            log.info("metrics on %s:%d/metrics", o.metrics_host, self.metrics_port)
        self._rebalance = rebalance = Rebalance(self.assignment, self.consumer, lambda: self.checkpoint(drain=True),
                                                self._abort_lost, self.stats,
                                                orphan_watch(clients, self.consumer, self.group_id, s.input_topic, o))
        self.consumer.subscribe([self.topics.input], on_assign=rebalance.on_assign,  # the directory: linked
                                on_revoke=rebalance.on_revoke, on_lost=rebalance.on_lost)

    def _parking_of(self, topic: str) -> Parking | None:
        """The parked topic: required with --on-failure park, read when it exists (under any policy)."""
        assert self.ckpt is not None
        if self.opts.on_failure == "park":
            self._topic_configs.load([topic])  # WorkerError says what to create
        return Parking(topic, self.ckpt.produce) if self._topic_configs.exists(topic) else None

    def run(self) -> None:
        """Process until :meth:`stop` (or SIGTERM via the CLI); always leaves cleanly."""
        if self._stop.is_set():
            return  # stopped before it started: nothing joined, nothing to leave
        settle_gc()
        try:  # close() also after a failed connect: no client may outlive the worker
            self.connect()
            log.info("worker %s joined group %s (concurrency %d, %s)", self.opts.worker_id, self.group_id, self.opts.concurrency, self.opts.guarantee)
            self._next_checkpoint = time.monotonic() + self.opts.commit_interval
            while not self._stop.is_set():
                self.poll_once()
            self.checkpoint(drain=True)
        finally:
            self.close()

    def poll_once(self) -> None:
        """One turn of the loop: take a batch, run what is ready, checkpoint when due."""
        consumer, ckpt, assignment = self.consumer, self.ckpt, self.assignment
        assert consumer and ckpt and assignment and self._fast and self.processing and self._rebalance
        self._rebalance.tick()  # a static member's watch for partitions nobody owns (orphans.py)
        if assignment.busy():
            assignment.advance()
            if not assignment.busy():  # partitions just became active
                self.processing.resume_releases()
        sched = self.sched
        got, asked = 0, 1
        room = ckpt.room()
        if sched.queued < buffer_limit(self.opts, self.processing.avg_call) and room != 0:  # limits.py
            # What the client has fetched; if nothing, and nothing waits, block for the first record
            # (consume() would wait for a full batch or the timeout: 100 ms a batch at low rates).
            n = 1000 if room is None else min(1000, room)
            msgs = consumer.consume(n, timeout=0)
            if not msgs and sched.idle():
                if ckpt.is_open and ckpt.eos:
                    # Idle (nothing fetched waits, pacing.py): commit now, not at the interval.
                    self.checkpoint(idle=True)
                    return
                first = consumer.poll(PAUSE_S)
                if first is None and ckpt.is_open:
                    # At-least-once output is visible uncommitted, so only a pause of the
                    # input (PAUSE_S with nothing) commits before the interval, not every empty fetch.
                    self.checkpoint()
                    return
                if first is not None:
                    msgs = consumer.poll_more(first, n)  # without first if a rebalance rewound it
            got, asked = len(msgs), n
            if got:
                aborts = self.stats.aborts
                self.take(msgs, n)
                if self.stats.aborts != aborts:  # the producer failed mid-batch: replayed
                    return
        try:
            self.processing.pump(block=got == 0 and sched.in_flight > 0)
            assignment.send_state()
        except KafkaClientError as exc:
            self._abort(exc)
            return
        if time.monotonic() >= self._next_checkpoint or ckpt.room() == 0:
            self.checkpoint()
        elif (not ckpt.eos and got < asked and ckpt.is_open and sched.idle() and self._caught_up()
              and self._early.due()):
            ckpt.producer.flush(0.001)  # caught up: at-least-once output shows once sent (pacing.py)

    def take(self, records: list[Record], asked: int = 0) -> None:
        """Take consumed records into the open transaction (what ``poll_once`` does with a
        batch of ``asked``); a Kafka failure aborts and rewinds."""
        assert self.ckpt and self._fast and self.processing and self._rebalance and self.assignment
        try:
            if not self.ckpt.is_open:  # the interval counts from here: a burst after a pause does not commit at once
                self._next_checkpoint = max(self._next_checkpoint, time.monotonic() + self.opts.commit_interval)
            self.ckpt.open()
            self._fast.take(records)
            self.assignment.send_state()
            if self.eos and self._early.after_batch(len(records), asked):
                self.ckpt.producer.flush(0.001)  # a low rate: send what is held now
        except KafkaClientError as exc:
            self._abort(exc)
            self.processing.consumer_failed = self.processing.consumer_failed or fatal_error(records)  # unread
        failed, self.processing.consumer_failed = self.processing.consumer_failed, None
        if failed is not None:  # fenced for good: a new consumer joins the group (rebalance.py)
            self._rebalance.renew(failed)

    def _caught_up(self) -> bool:  # whether the input holds at most a few records beyond what was taken (pacing.py)
        assert self.ckpt is not None and self.assignment is not None
        src = self.ckpt.add_source(self.settings.input_topic)  # where each partition resumes
        return caught_up(self.consumer, src.topic, self.assignment.tables, min(self.ckpt.taken, SMALL), src.base)

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()  # revokes: our on_revoke checkpoints first
            self.consumer = None
        if self._rebalance is not None:
            self._rebalance.close()  # the orphan watch's admin client
        if self.assignment is not None:
            for task in list(self.assignment.restoring.values()):
                task.cancel()
        self.calls.shutdown()
        self.query.close()
        self.stores.close_all()
        if self._dir_stores is not None:
            self._dir_stores.close_all()
        if self.sink is not None:
            self.sink.close()
        if self.ckpt is not None:
            self.ckpt.producer.close(flush=10)  # last: nothing may send after it
        if self._alive is not None:
            self._alive.stop(clean=self._stop.is_set())  # clean: a tombstone, a successor need not wait
        self._write_stats(force=True)

    # ------------------------------------------------------------------ checkpoints
    def drain(self) -> None:  # until every consumed event is processed, superseded or dead-lettered
        assert self.processing is not None
        self.processing.drain()

    def dead_letter(self, key: bytes | None, value: bytes | None, headers: Any, topic: str,
                    partition: int, offset: int, reason: str, error: str) -> None:
        """Send a record to the dead-letter topic in the open transaction (cut to fit)."""
        assert self.processing is not None
        self.processing.dead_letter(key, value, headers, topic, partition, offset, reason, error)

    def checkpoint(self, drain: bool = False, idle: bool = False) -> None:
        """Commit outputs, state and input offsets together (see checkpoint.py). Handler calls
        still running go on: the commit covers each partition up to its first unfinished event
        (window.py). ``drain``: wait for every call first (before partitions go, and when stopping)."""
        ckpt, processing = self.ckpt, self.processing
        assert ckpt is not None and processing is not None and self.assignment is not None
        self._next_checkpoint = time.monotonic() + self.opts.commit_interval
        try:
            if drain or processing.partial or ckpt.needs_drain() or ckpt.bisecting:  # bisecting: calls' effects with their input
                processing.drain()
            else:
                processing.settle()
            self.assignment.send_state()  # what the writes held back (table.py): in this transaction
        except KafkaClientError as exc:
            self._abort(exc)
            return
        if not ckpt.is_open:
            if self.sink is not None:
                self.sink.after_commit()
            self._write_stats()
            return
        t0 = time.perf_counter()
        self.query.committing()
        outcome = ckpt.commit(wait=drain)  # at-least-once offsets: waited for when partitions go
        if not outcome.committed:
            self._after_abort(outcome)
            return
        t1 = time.perf_counter()
        if self.parking is not None:
            self.parking.commit()
        if self.sink is not None:  # a safe point: nothing in flight, nothing staged, no open transaction
            self.sink.after_commit()
        # Commit round trips block the loop: space checkpoints so they cost at most ~10% of
        # the time (a slow broker then means fewer, larger transactions, not a stalled worker).
        self._next_checkpoint = time.monotonic() + min(max(self.opts.commit_interval, 9 * (t1 - t0)), 5.0)
        self._early.committed(idle=idle)
        self.stats.commits, self.stats.last_commit_ms = self.stats.commits + 1, (t1 - t0) * 1000
        self.stats.commit_ms_total += self.stats.last_commit_ms
        self._write_stats()

    def _abort(self, exc: KafkaClientError) -> None:
        """Give up the open transaction and replay its input."""
        assert self.ckpt is not None and self.processing is not None
        self.processing.forget()
        self._after_abort(self.ckpt.abort(exc))

    def _abort_lost(self) -> None:
        """Partitions lost: nothing open commits; events taken since the last commit go back."""
        assert self.ckpt is not None
        if self.ckpt.is_open or not self.sched.idle():
            self._abort(TransactionAbortedError("partitions lost", code="PARTITIONS_LOST"))

    def _after_abort(self, outcome: Outcome) -> None:
        assert self.assignment is not None and self.processing is not None
        self.processing.forget()
        self.assignment.resize(self.limits.room(self.settings.state_topic))  # limits read again after a refusal (bisect.py)
        if self.parking is not None:
            self.parking.rollback()
        if self.sink is not None:
            self.sink.after_abort()
        for topic, p in outcome.stale:
            self.assignment.restore_again(topic, p)

    def committed(self) -> bool:  # nothing consumed but uncommitted (read under the GIL; a hint for tests)
        return self.ckpt is not None and not self.ckpt.is_open and self.sched.idle()

    @property
    def assigned_partitions(self) -> list[int]:
        """Input partitions being processed (restored)."""
        return sorted(self.assignment.tables) if self.assignment is not None else []

    # ------------------------------------------------------------------ reporting
    def _write_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if (self.opts.stats_file is None and self.metrics_port is None) or (now < self._next_stats and not force):
            return
        self._next_stats = now + 0.5
        if self.consumer is not None and self.assignment is not None:
            starts = self.ckpt.add_source(self.settings.input_topic).base if self.ckpt is not None else None
            update_lag(self.stats, self.consumer, self.settings.input_topic, self.assignment.tables, starts)
            self.stats.restore_progress = {f"{t}[{p}]": [task.progress.done, task.progress.total]
                                           for (t, p), task in self.assignment.restoring.items()}
        if self.ckpt is not None:
            self.stats.bisecting = int(self.ckpt.bisecting)
            self.stats.producer_queue_full = self.ckpt.producer.queue_full
        if self.parking is not None:
            self.stats.parked_groups = len(self.parking.groups)
            self.stats.held = self.parking.held
        if self.sink is not None:
            self.stats.sink = self.sink.metrics()
        if self.opts.stats_file is not None:
            self.stats.write(Path(self.opts.stats_file))
