"""Checkpoints: commit outputs, state and input offsets together, or abort and replay.

A checkpoint drains the worker (every consumed event processed, superseded or
dead-lettered), then commits: exactly-once, one Kafka transaction with the input offsets;
at-least-once, a flush and then the offsets. RocksDB gets the staged writes only after that
commit (the batch is built while the commit is on the wire). Any failure aborts and
replays the input from the checkpoint's start (:func:`abort`, :func:`rewind`).

These are functions of the worker, called on its poll thread (``Worker.checkpoint`` and
friends delegate here), kept apart to keep the worker module readable.
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from services.worker.txn import Background, guarded

if TYPE_CHECKING:
    from services.worker.runtime import Worker

__all__ = ["abort", "checkpoint", "rewind"]

log = logging.getLogger(__name__)

_FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}


def checkpoint(w: Worker) -> None:
    """Drain, then commit outputs, state and input offsets together."""
    w._next_checkpoint = time.monotonic() + w.opts.commit_interval
    w.drain()
    if not w._txn_open:
        if w.listeners is not None:
            w.listeners.after_commit(w)
        w._write_stats()
        return
    consumer = w.consumer
    assert w.producer is not None and consumer is not None
    t0 = time.perf_counter()
    offsets = [TopicPartition(w.settings.input_topic, p, o) for p, o in w._next_offsets.items()]
    # The commit waits on the network (without the GIL): build the RocksDB batches
    # meanwhile; they are written only if the commit succeeds.
    group_metadata = consumer.consumer_group_metadata() if w.eos and offsets else None
    commit = Background(_commit_producer, w, offsets, group_metadata)
    batches = {p: store.prepare() for p, store in w.stores.stores.items()}
    try:
        commit.wait()
    except KafkaException as exc:
        # Exactly-once: the transaction is aborted. At-least-once: some records were
        # not delivered, so no offsets are committed. Both replay the input.
        abort(w, exc)
        return
    if not w.eos and offsets:
        try:
            consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:  # at-least-once: the events may be seen again
            log.warning("offset commit failed (events may be redelivered): %s", exc)
    w._txn_open = False
    t1 = time.perf_counter()
    _persist_state(w, batches)
    w._next_offsets.clear()
    w._txn_start.clear()
    if w.listeners is not None:
        # A safe point: nothing in flight, nothing staged, no open transaction.
        w.listeners.after_commit(w)
    t2 = time.perf_counter()
    ms = (t1 - t0) * 1000
    # Commit round trips block the loop: space checkpoints so they cost at most ~10% of
    # the time (a slow broker then means fewer, larger transactions, not a stalled worker).
    # Persisting to RocksDB is not counted: its cost is per write, not per checkpoint.
    w._next_checkpoint = time.monotonic() + min(max(w.opts.commit_interval, 9 * (t1 - t0)), 5.0)
    w.stats.commits += 1
    w.stats.last_commit_ms = ms
    w.stats.commit_ms_total += ms
    w.stats.persist_ms_total += (t2 - t1) * 1000
    log.debug("checkpoint: commit %.1f ms, persist %.1f ms, %d consumed so far", ms, (t2 - t1) * 1000,
              w.stats.consumed)
    w._write_stats()

def _commit_producer(w: Worker, offsets: list[TopicPartition], group_metadata: Any) -> None:
    """The producer's part of a checkpoint (runs off the poll thread): exactly-once, the
    transaction with the input offsets; at-least-once, delivery of every record.

    Only the producer is touched here. A checkpoint can run inside a rebalance callback,
    that is inside ``consume()``, and a consumer call from this thread would then wait for
    the poll thread, which waits for this one.
    """
    producer = w.producer
    assert producer is not None
    if w.eos:
        if offsets:
            guarded(producer.send_offsets_to_transaction, offsets, group_metadata, 30)
        _commit_with_retry(w)
        return
    left = producer.flush(30)
    if left:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{left} records not delivered"))
    failed, w._delivery_error = w._delivery_error, None
    if failed is not None:
        raise KafkaException(failed)

def _commit_with_retry(w: Worker) -> None:
    assert w.producer is not None
    for attempt in range(5):
        try:
            guarded(w.producer.commit_transaction, 30)
            return
        except KafkaException as exc:
            if exc.args[0].retriable() and attempt < 4:
                continue
            raise

def _persist_state(w: Worker, batches: dict[int, Any]) -> None:
    now = time.monotonic()
    refresh = now >= w._next_marker
    if refresh:
        # An older marker only makes the next restore re-read a little more; each refresh
        # costs a round trip per partition, so keep it rare.
        w._next_marker = now + 30.0
    consumer = w.consumer
    assert consumer is not None
    for p, store in w.stores.stores.items():
        marker = None
        if refresh:
            # We are this partition's only writer and everything we wrote is committed:
            # its high watermark is a safe restore start for the next owner of this store.
            try:
                marker = consumer.get_watermark_offsets(TopicPartition(w._state_topic, p), timeout=10)[1]
            except KafkaException as exc:  # leader moving: keep the older marker this time
                log.info("state topic offsets of partition %d not available now: %s", p, exc)
                w._next_marker = now
                marker = None
        store.apply(batches.get(p), marker)

def abort(w: Worker, exc: KafkaException) -> None:
    """Abort the open transaction (at-least-once: give up the checkpoint) and replay its
    input; recover from a fatal producer.

    A fatal error other than fencing (say INVALID_TXN_STATE after a broker failover)
    gets a new producer with the same transactional id. Being fenced by another
    instance with our id is the one case where this worker must stop.
    """
    err = exc.args[0]
    if err.code() in _FENCED:
        log.error("fenced by a newer instance with transactional id of worker %s: %s",
                  w.opts.worker_id, err)
        raise exc
    log.warning("%s, replaying the input since the last checkpoint: %s",
                "aborting the transaction" if w.eos else "records not delivered", err)
    producer = w.producer
    assert producer is not None
    fatal = err.fatal()
    if not fatal and w.eos:
        try:
            producer.abort_transaction(30)
        except KafkaException as abort_exc:
            fatal = abort_exc.args[0].fatal()
            if not fatal:
                raise
    if fatal:
        _new_producer(w, err)
    w._txn_open = False
    w.stats.aborts += 1
    rewind(w)

def _new_producer(w: Worker, err: KafkaError) -> None:
    now = time.monotonic()
    w._recoveries = [t for t in w._recoveries if now - t < 60] + [now]
    if len(w._recoveries) > 5:
        raise KafkaException(err)  # keeps failing: let the supervisor restart us
    log.warning("fatal producer error (%s): starting a new producer", err)
    old = w.producer
    w.producer = Producer(w.settings.kafka_config(**w._producer_conf))
    if w.eos:
        w.producer.init_transactions(60)
    if old is not None and err.code() != KafkaError._TIMED_OUT:
        with contextlib.suppress(KafkaException, RuntimeError):
            old.purge()

def rewind(w: Worker) -> None:
    """Forget uncommitted work and consume it again from the transaction's start."""
    assert w.consumer is not None
    # Handler calls still running would report events the scheduler no longer knows:
    # wait for them (as a drain would) and drop their results; the events are replayed.
    completions = w.calls.completions
    for _ in range(w.sched.in_flight):
        completions.get()
    for store in w.stores.stores.values():
        store.rollback()
    w.sched.clear()
    w.calls.forget_completions()
    for p, offset in w._txn_start.items():
        if p in w._assigned:
            w.consumer.seek(TopicPartition(w.settings.input_topic, p, offset))
    w._next_offsets.clear()
    w._txn_start.clear()
