"""Cost of listeners on the worker's hot path: ``python -m listeners.bench [--changes N]``.

Drives :meth:`ListenerRuntime.on_change` exactly as the table handler does (decoded new
record, encoded old row) with a stand-in worker whose ``produce`` only counts, for 0, 1 and 100
listeners, and prints changes per second of the sink alone. No Kafka needed. Compare with the
table handler's own rate (``benchmarks``) to get the throughput with listeners:
``1 / (1/handler_rate + 1/sink_rate)``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.serde import SchemaCatalog, make_codec
from listeners.model import ListenerSpec
from listeners.registry import RegistryRecord
from listeners.runtime import ListenerRuntime

__all__ = ["SCENARIOS", "StandInEvent", "StandInWorker", "measure", "main"]


@dataclass
class _Stats:
    aborts: int = 0


@dataclass
class StandInEvent:
    """The fields of a worker ``Event`` that :class:`ListenerRuntime` reads."""

    partition: int
    offset: int
    timestamp: int


@dataclass
class StandInWorker:
    """The part of a ``Worker`` a :class:`ListenerRuntime` uses (codec, stats.aborts, produce),
    for benchmarks and unit tests without Kafka. ``keep=False`` only counts what is sent."""

    codec: Any
    keep: bool = True
    stats: _Stats = field(default_factory=_Stats)
    sent: list[tuple[str, Any, Any, int]] = field(default_factory=list)
    count: int = 0

    def produce(self, topic: str, value: Any, key: Any, partition: int = -1,
                headers: Any = None) -> None:  # fmt: skip
        self.count += 1
        if self.keep:
            self.sent.append((topic, value, key, partition))


def _specs(n: int, kind: str) -> list[ListenerSpec]:
    if kind == "per-customer":  # indexed equality filters: one per customer
        return [ListenerSpec(name=f"c{i}", filter=f'value.customer_id == "c{i}"') for i in range(n)]
    return [
        ListenerSpec(name=f"l{i}", filter=f"value.amount > {float(i)}",
                     convert='{"id": value.reservation_id, "amount": value.amount}')
        for i in range(n)
    ]  # fmt: skip


SCENARIOS: dict[str, Callable[[], list[ListenerSpec]]] = {
    "0 listeners": lambda: [],
    "1 listener (filter + converter)": lambda: _specs(1, "general"),
    "100 listeners, per-customer equality (indexed)": lambda: _specs(100, "per-customer"),
    "100 listeners, distinct range filters + converters": lambda: _specs(100, "general"),
}


def measure(specs: list[ListenerSpec], changes: int = 50_000) -> tuple[float, int]:
    """Changes per second through ``on_change`` and notifications produced."""
    from services.worker.state import Row

    settings = Settings()
    catalog = SchemaCatalog.load(PROJECT_ROOT / "schemas")
    codec = make_codec(settings, catalog)
    worker = StandInWorker(codec, keep=False)
    rt = ListenerRuntime(settings, topic_partitions=lambda _t: 6)
    rt._owned = {0}  # noqa: SLF001 - stand-in for an assignment
    rt._epoch = {0: 1}  # noqa: SLF001
    rt.apply_records(worker, [RegistryRecord(s.name, s.to_json(), i) for i, s in enumerate(specs)])
    entities = 1000
    recs: list[dict[str, Any]] = []
    rows: list[Any] = []
    for i in range(entities):
        rec = {"reservation_id": f"R{i}", "flight_number": f"F{i % 50}",
               "customer_id": f"c{i % 500}", "seats": 1, "amount": float(i % 300),
               "state": "NEW", "version": 1}  # fmt: skip
        recs.append(rec)
        rows.append(Row(1, False, f"F{i % 50}", codec.encode("reservation", rec)))
    keys = [f"reservation/R{i}".encode() for i in range(entities)]
    t0 = time.perf_counter()
    for n in range(changes):
        i = n % entities
        rt.on_change(worker, StandInEvent(0, n, 0), keys[i], rows[i], rows[i], recs[i])
    dt = time.perf_counter() - t0
    return changes / dt, worker.count


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=50_000)
    args = ap.parse_args(argv)
    for label, make in SCENARIOS.items():
        rate, sent = measure(make(), args.changes)
        print(f"{label:<52} {rate:>12,.0f} changes/s  ({sent} notifications)")


if __name__ == "__main__":
    main()
