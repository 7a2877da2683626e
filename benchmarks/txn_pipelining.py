"""Produce -> visible latency of a transactional relay with one producer or two used in turn.

    .venv/bin/python -m benchmarks.txn_pipelining --bootstrap 127.0.0.1:9092 --producers 1
    .venv/bin/python -m benchmarks.txn_pipelining --bootstrap 127.0.0.1:9092 --producers 2

A plain producer sends ``--rate`` records/s to an input topic (6 partitions); the relay
consumes them, writes each to three output topics (6 partitions each, like the worker's
state, directory and notification topics) in a transaction with the input offsets, and
commits whenever its input goes idle. A read_committed consumer notes when each record
becomes visible on the first output. With two producers, the relay begins its next
transaction on the other one, so it does not wait for the coordinator to finish the
previous commit's markers (``AddPartitionsToTxn`` is refused with CONCURRENT_TRANSACTIONS
until then, and librdkafka retries it on a fixed 20 ms). benchmarks/README.md, "Latency".
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

PARTITIONS = 6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--producers", type=int, choices=(1, 2), default=1)
    ap.add_argument("--rate", type=float, default=9000.0)
    ap.add_argument("--seconds", type=float, default=8.0)
    a = ap.parse_args()
    bs, tag = a.bootstrap, uuid.uuid4().hex[:6]
    tin, outs = f"txnpipe-in-{tag}", [f"txnpipe-out{i}-{tag}" for i in range(3)]
    admin = AdminClient({"bootstrap.servers": bs})
    for fut in admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in [tin, *outs]]).values():
        fut.result()
    seen: dict[bytes, float] = {}
    stop = threading.Event()
    commits: list[float] = []

    def read() -> None:
        c = Consumer({"bootstrap.servers": bs, "group.id": f"read-{tag}", "isolation.level": "read_committed",
                      "fetch.wait.max.ms": 5, "auto.offset.reset": "earliest"})
        c.subscribe([outs[0]])
        while not stop.is_set():
            first = c.poll(0.05)
            if first is None:
                continue
            now = time.time()
            for m in [first, *c.consume(1000, timeout=0)]:
                if m.error() is None and m.key() is not None:
                    seen.setdefault(m.key(), now)
        c.close()

    def relay() -> None:
        c = Consumer({"bootstrap.servers": bs, "group.id": f"relay-{tag}", "enable.auto.commit": False,
                      "auto.offset.reset": "earliest", "fetch.wait.max.ms": 50,
                      "isolation.level": "read_committed"})
        c.subscribe([tin])
        producers = []
        for i in range(a.producers):
            p = Producer({"bootstrap.servers": bs, "transactional.id": f"txnpipe-{tag}-{i}", "linger.ms": 20})
            p.init_transactions(30)
            producers.append(p)
        k, p, in_txn, pos = 0, producers[0], False, {}
        while not stop.is_set():
            msgs = c.consume(1000, timeout=0)
            if not msgs:
                if in_txn:  # idle: commit now
                    t0 = time.perf_counter()
                    p.flush(30)
                    p.send_offsets_to_transaction([TopicPartition(tin, q, o) for q, o in pos.items()],
                                                  c.consumer_group_metadata(), 30)
                    p.commit_transaction(30)
                    commits.append(time.perf_counter() - t0)
                    in_txn, k = False, k + 1
                    p = producers[k % len(producers)]
                    continue
                m = c.poll(0.1)
                if m is None:
                    continue
                msgs = [m]
            if not in_txn:
                p.begin_transaction()
                in_txn = True
            for m in msgs:
                if m.error() is None:
                    for out in outs:
                        p.produce(out, m.value(), m.key())
                    pos[m.partition()] = m.offset() + 1
            p.poll(0)
        c.close()

    threads = [threading.Thread(target=read, daemon=True), threading.Thread(target=relay, daemon=True)]
    for t in threads:
        t.start()
    time.sleep(6)  # group joins, producer ids
    producer = Producer({"bootstrap.servers": bs, "linger.ms": 1, "enable.idempotence": True})
    sent: dict[bytes, float] = {}
    n = int(a.rate * a.seconds)
    t0 = time.monotonic()
    for i in range(n):
        wait = t0 + i / a.rate - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        key = f"k{i}".encode()
        sent[key] = time.time()
        producer.produce(tin, b"v" * 60, key)
        producer.poll(0)
    producer.flush(10)
    time.sleep(3)
    stop.set()
    for t in threads:
        t.join(10)
    # The first second is warm-up (the input producer's id, the first fetches).
    timed = list(sent.items())[int(a.rate):]
    lat = sorted((seen[k] - t) * 1000 for k, t in timed if k in seen)
    if not lat:
        raise SystemExit("nothing became visible")
    print(f"producers {a.producers}, {a.rate:,.0f}/s: {len(lat)}/{len(timed)} seen, "
          f"p50 {lat[len(lat) // 2]:.1f} ms, p90 {lat[int(len(lat) * 0.9)]:.1f} ms, "
          f"p99 {lat[int(len(lat) * 0.99)]:.1f} ms; {len(commits)} commits, "
          f"median {statistics.median(commits) * 1000:.1f} ms")


if __name__ == "__main__":
    main()
