"""Warm the benchmark broker's JVM before any suite measures on it.

A freshly started broker spends its first minutes compiling its hot paths (the JIT). On
this 2-core machine that compiling took 0.5 of a core during the first latency probe: the
broker's produce round trips grew, and every exactly-once commit with them (p50 163 -> 89
-> 65 ms over three probes in a row of one fresh broker, benchmarks/README.md "Latency").
Whatever system a suite ran first paid for the broker's start, and the others did not.

:func:`warm_broker` runs a neutral workload through the broker with plain librdkafka
clients, no system under test: an idempotent producer, a transactional relay that commits
its input offsets every few milliseconds, and a read_committed reader. It stops when the
broker's compiler threads have gone quiet (from /proc, when the broker is a local process),
or after ``max_s``. Every system then meets the same warm broker, as a deployed one is.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = ["compiler_seconds", "warm_broker"]

PARTITIONS = 6
#: The compiler threads may use at most this share of a core over a window to count as quiet.
QUIET_CORES = 0.05
WINDOW_S = 3.0


def compiler_seconds(pids: list[int]) -> float | None:
    """CPU seconds used so far by the JIT compiler threads of these JVMs (None without /proc)."""
    total = 0
    seen = False
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                if "CompilerThre" not in (task / "comm").read_text():
                    continue
                fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # the thread ended meanwhile
                continue
            seen = True
            total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / 100.0 if seen else None


def warm_broker(bootstrap: str, pids: list[int], *, min_s: float = 20.0, max_s: float = 120.0,
                on_progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """Run the warm-up workload until the compiler threads of ``pids`` are quiet (at least
    ``min_s``, at most ``max_s``; only ``min_s`` when the threads cannot be read)."""
    tag = uuid.uuid4().hex[:8]
    src = f"bench.warm.in.{tag}"
    outs = [f"bench.warm.out{i}.{tag}" for i in range(3)]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for fut in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in (src, *outs)]).values():
        fut.result(30)
    stop = threading.Event()
    counts: dict[str, int] = {}
    threads = [threading.Thread(target=fn, args=args, daemon=True) for fn, args in (
        (_produce, (bootstrap, src, stop, counts)),
        (_relay, (bootstrap, src, outs, tag, stop, counts, True)),
        (_relay, (bootstrap, src, outs[:1], tag, stop, counts, False)),
        (_read, (bootstrap, outs[:2], tag, stop, counts)),
        (_observe, (bootstrap, src, tag, stop, counts)),
    )]
    for t in threads:
        t.start()
    started = time.monotonic()
    history: list[tuple[float, float]] = []
    quiet = False
    try:
        while True:
            time.sleep(0.5)
            now = time.monotonic() - started
            if on_progress is not None:
                on_progress(now)
            jit = compiler_seconds(pids)
            if jit is not None:
                history.append((now, jit))
                old = [(t, s) for t, s in history if t <= now - WINDOW_S]
                if old and now >= min_s:
                    t0, s0 = old[-1]
                    if (jit - s0) / (now - t0) <= QUIET_CORES:
                        quiet = True
                        break
            elif now >= min_s:
                break
            if now >= max_s:
                break
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for fut in admin.delete_topics([src, *outs]).values():
            with contextlib.suppress(KafkaException):
                fut.result(30)
    return {"seconds": round(time.monotonic() - started, 1), "compiler_quiet": quiet,
            "compiler_cpu_s": history[-1][1] if history else None, **counts}


def _produce(bootstrap: str, topic: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """Small keyed events at a steady ~20,000/s (a paced load, as the latency probes send)."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 1})
    i = 0
    t0 = time.monotonic()
    while not stop.is_set():
        for _ in range(200):
            p.produce(topic, b"x" * 80, f"k{i % 50_000}".encode())
            i += 1
        p.poll(0)
        ahead = t0 + i / 20_000 - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
    p.flush(10)
    counts["produced"] = i


def _relay(bootstrap: str, src: str, outs: list[str], tag: str, stop: threading.Event,
           counts: dict[str, int], transactional: bool) -> None:
    """Consume, produce each record on to every output: exactly-once (short transactions
    with the input offsets, back to back) or at-least-once (idempotent, offsets committed
    after a flush)."""
    kind = "eos" if transactional else "alo"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-warm-{kind}-{tag}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed", "fetch.wait.max.ms": 20})
    conf = {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    p = Producer({**conf, "transactional.id": f"bench-warm-{tag}"} if transactional else conf)
    c.subscribe([src])
    if transactional:
        p.init_transactions(30)
    relayed = commits = 0
    try:
        while not stop.is_set():
            msgs = [m for m in c.consume(2000, timeout=0.05)
                    if m.error() is None and m.partition() is not None and m.offset() is not None]
            if not msgs:  # nothing, or only errors (e.g. a partition's end): nothing to commit
                continue
            if transactional:
                p.begin_transaction()
            offsets: dict[int, int] = {}
            for m in msgs:
                for out in outs:
                    p.produce(out, m.value(), m.key())
                offsets[m.partition()] = m.offset() + 1  # type: ignore[index,operator]
            tps = [TopicPartition(src, q, o) for q, o in offsets.items()]
            if transactional:
                p.send_offsets_to_transaction(tps, c.consumer_group_metadata(), 30)
                p.commit_transaction(30)
            else:
                p.flush(30)
                c.commit(offsets=tps, asynchronous=False)
            relayed += len(msgs)
            commits += 1
    finally:
        c.close()
    counts[f"relayed_{kind}"], counts[f"commits_{kind}"] = relayed, commits


def _read(bootstrap: str, topics: list[str], tag: str, stop: threading.Event, counts: dict[str, int]) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-warm-read-{tag}",
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed", "fetch.wait.max.ms": 5})
    c.subscribe(topics)
    n = 0
    try:
        while not stop.is_set():
            n += len(c.consume(1000, timeout=0.05))
    finally:
        c.close()
    counts["read"] = n


def _observe(bootstrap: str, src: str, tag: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """What benchmark harnesses and workers ask besides produce and fetch: group
    descriptions, end offsets and metadata, every 50 ms. (Not the groups' committed offsets:
    librdkafka 2.x crashed in ListConsumerGroupOffsets' response handler on a broker that
    was still loading its coordinators.)"""
    from confluent_kafka.admin import OffsetSpec

    admin = AdminClient({"bootstrap.servers": bootstrap})
    groups = [f"bench-warm-{kind}-{tag}" for kind in ("eos", "alo")]
    ends = {TopicPartition(src, q): OffsetSpec.latest() for q in range(PARTITIONS)}  # type: ignore[no-untyped-call]
    n = 0
    while not stop.wait(0.05):
        try:
            for fut in admin.describe_consumer_groups(groups).values():
                fut.result(10)
            for fut in admin.list_offsets(ends).values():
                fut.result(10)
            admin.list_topics(src, timeout=10)
        except KafkaException:  # a group not there yet: ask again next turn
            pass
        n += 1
    counts["observed"] = n
