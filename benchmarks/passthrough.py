"""Baselines as plain confluent-kafka loops (run as ``python -m benchmarks.passthrough``).

- ``ceiling``: batch consume -> produce -> commit every ``--commit-interval`` (and when the
  input is drained); no decoding, no state. The fastest a Python consume/produce loop goes.
- ``serial``: the partition-serial consumer of the Parallel Consumer README: one loop, one
  event at a time, sleeping the event's handler delay (see :func:`benchmarks.events.sleep_for`).

Both use the producer settings of the fifolane worker (idempotent, acks=all, its batching:
``services.worker.clients.PRODUCER_BATCHING``) and the consumer settings pinned for every
system (:data:`benchmarks.procs.CONSUMER_PINNED`).
SIGTERM ends the loop after a final commit.
"""

from __future__ import annotations

import argparse
import signal
import time
from typing import Any

from confluent_kafka import Consumer, Producer

from benchmarks.events import sleep_for
from benchmarks.procs import CONSUMER_PINNED
from services.worker.clients import PRODUCER_BATCHING

__all__ = ["main"]

_stop = False


def _on_term(_signum: int, _frame: Any) -> None:
    global _stop
    _stop = True


def _clients(args: argparse.Namespace) -> tuple[Consumer, Producer]:
    extra = dict(kv.split("=", 1) for kv in args.consumer_config)
    consumer = Consumer({
        "bootstrap.servers": args.bootstrap, "group.id": args.group, "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "isolation.level": "read_committed", "fetch.wait.max.ms": 50,
        **CONSUMER_PINNED, **extra,
    })
    producer = Producer({
        "bootstrap.servers": args.bootstrap, "enable.idempotence": True, "acks": "all",
        **PRODUCER_BATCHING,
    })
    return consumer, producer


def _produce(producer: Producer, topic: str, value: Any, key: Any) -> None:
    while True:
        try:
            producer.produce(topic, value, key)
            return
        except BufferError:
            producer.poll(0.05)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["ceiling", "serial"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--commit-interval", type=float, default=0.25)
    parser.add_argument("--max-sleep-ms", type=float, default=5.0)
    parser.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka consumer setting (repeatable)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    consumer, producer = _clients(args)
    consumer.subscribe([args.input])
    batch = 1000 if args.mode == "ceiling" else 1
    dirty = False
    next_commit = time.monotonic() + args.commit_interval
    while not _stop:
        msgs = consumer.consume(batch, timeout=0.1)
        for msg in msgs:
            if msg.error() is not None:
                continue
            if args.mode == "serial":
                time.sleep(sleep_for(msg.value() or b"", args.max_sleep_ms))
            _produce(producer, args.output, msg.value(), msg.key())
            dirty = True
        producer.poll(0)
        if dirty and (not msgs or time.monotonic() >= next_commit):
            producer.flush(30)
            consumer.commit(asynchronous=False)
            dirty = False
            next_commit = time.monotonic() + args.commit_interval
    if dirty:
        producer.flush(30)
        consumer.commit(asynchronous=False)
    consumer.close()


if __name__ == "__main__":
    main()
