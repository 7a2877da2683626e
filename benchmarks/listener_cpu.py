"""Cost of listeners on the worker's hot path: ``python -m benchmarks.listener_cpu [--changes N]``.

Drives :meth:`ListenerRuntime.on_change` exactly as the worker's table handler does (the
decoded new record, the encoded old row) with a stand-in sink context whose ``produce`` only
counts,
and prints the listener sink's cost alone: CPU time per change (process time, so other load on
the machine disturbs it less than wall time; ``--repeat N`` keeps the best of N) and
notifications per change. No Kafka needed. The worker pays on top of this for producing each
notification (about 2 us in ``Producer.produce``) and the broker for storing it.

Scenarios ``suite: ...`` replay the events and the registrations of the ``listeners``
benchmark suite (:mod:`benchmarks.suites.listeners`, registrations from
:mod:`benchmarks.registrations`): reservations over 1,000 flights, each
entity created and then modified once (half of the changes have an old row), with 1, 100 and
10,000 equality listeners on distinct flights and with 100 general filters. The others are
heavier synthetic loads (a converter per listener, many notifications per change).
``--only TEXT`` runs the scenarios whose label contains TEXT; ``--profile`` prints a cProfile
summary per scenario.
"""

from __future__ import annotations

import argparse
import importlib
import time
import zlib
from collections.abc import Callable
from typing import Any

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.serde import SchemaCatalog, make_codec
from listeners.follower import RegistryRecord
from listeners.model import ListenerSpec
from listeners.runtime import ListenerRuntime
from listeners.standin import QuietRegistry, StandInContext

__all__ = ["SCENARIOS", "measure", "main"]

PARTITIONS = 6


#: One change as the worker hands it over: (partition, offset, timestamp, entity key, old row,
#: new row, new record).
Change = tuple[int, int, int, bytes, Any, Any, dict[str, Any]]


def _specs(n: int, kind: str) -> list[ListenerSpec]:
    if kind == "per-customer":  # indexed equality filters: one per customer
        return [ListenerSpec(name=f"c{i}", filter=f'value.customer_id == "c{i}"') for i in range(n)]
    return [
        ListenerSpec(name=f"l{i}", filter=f"value.amount > {float(i)}",
                     convert='{"id": value.reservation_id, "amount": value.amount}')
        for i in range(n)
    ]  # fmt: skip


def _benchmarks(module: str) -> Any:
    """A module of the benchmark harness (the suite's workload)."""
    return importlib.import_module(f"benchmarks.{module}")


def _suite(kind: str, n: int) -> Callable[[], list[ListenerSpec]]:
    def make() -> list[ListenerSpec]:
        suite = _benchmarks("registrations")
        regs = suite.equality_specs(n) if kind == "equality" else suite.general_specs(n)
        return [ListenerSpec.from_json(value) for _name, value in regs]

    return make


#: label -> (registrations, workload: "suite" or "synthetic", share of the --changes to run)
SCENARIOS: dict[str, tuple[Callable[[], list[ListenerSpec]], str, float]] = {
    "0 listeners": (lambda: [], "suite", 1.0),
    "suite: 1 equality listener": (_suite("equality", 1), "suite", 1.0),
    "suite: 100 equality listeners (distinct flights)": (_suite("equality", 100), "suite", 1.0),
    "suite: 10,000 equality listeners (distinct flights)": (
        _suite("equality", 10_000), "suite", 1.0),
    "suite: 100 general filters": (_suite("general", 100), "suite", 1.0),
    "synthetic: 1 listener (filter + converter)": (lambda: _specs(1, "general"), "synthetic", 1.0),
    "synthetic: 100 per-customer equality": (lambda: _specs(100, "per-customer"), "synthetic",
                                             1.0),
    "synthetic: 100 range filters + converters (~80 notes/change)": (
        lambda: _specs(100, "general"), "synthetic", 0.05),
}  # fmt: skip


def _suite_changes(codec: Any, changes: int) -> list[Change]:
    """The ``listeners`` suite's events as table changes: first all creates, then one
    modification per entity (``benchmarks.events.events`` with ``entities = n // 2``)."""
    from services.worker.sink import Row

    out: list[Change] = []
    rows: dict[str, Any] = {}
    for offset, (group, rid, version, rec) in enumerate(_benchmarks("events").events(changes)):
        new = Row(version, False, group, codec.encode("reservation", rec))
        p = zlib.crc32(group.encode()) % PARTITIONS
        out.append((p, offset, 1000 + offset, f"reservation/{rid}".encode(), rows.get(rid), new, rec))
        rows[rid] = new
    return out


def _synthetic_changes(codec: Any, changes: int) -> list[Change]:
    """1,000 entities modified over and over (old row = new row)."""
    from services.worker.sink import Row

    entities = 1000
    base: list[tuple[bytes, Any, dict[str, Any]]] = []
    for i in range(entities):
        rec = {"reservation_id": f"R{i}", "flight_number": f"F{i % 50}",
               "customer_id": f"c{i % 500}", "seats": 1, "amount": float(i % 300),
               "state": "NEW", "version": 1}  # fmt: skip
        row = Row(1, False, f"F{i % 50}", codec.encode("reservation", rec))
        base.append((f"reservation/R{i}".encode(), row, rec))
    out: list[Change] = []
    for n in range(changes):
        ekey, row, rec = base[n % entities]
        out.append((0, n, 0, ekey, row, row, rec))
    return out


def _runtime(specs: list[ListenerSpec]) -> tuple[ListenerRuntime, StandInContext]:
    settings = Settings()
    codec = make_codec(settings, SchemaCatalog.load(PROJECT_ROOT / "schemas"))
    ctx = StandInContext(codec, keep=False)
    rt = ListenerRuntime(settings, topic_partitions=lambda _t: PARTITIONS, follower=QuietRegistry())  # type: ignore[arg-type]
    rt.open(ctx)
    rt.on_assign(list(range(PARTITIONS)))
    rt.ready()
    rt.apply_records([RegistryRecord(s.name, s.to_json(), i) for i, s in enumerate(specs)])
    return rt, ctx


def measure(specs: list[ListenerSpec], changes: int = 50_000, workload: str = "synthetic",
            profile: bool = False) -> tuple[float, int]:  # fmt: skip
    """Changes per CPU second through ``on_change`` and notifications produced."""
    rt, ctx = _runtime(specs)
    make = _suite_changes if workload == "suite" else _synthetic_changes
    stream = make(ctx.codec, changes)
    on_change = rt.on_change
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.process_time()
    for p, offset, ts, ekey, old, new, rec in stream:
        on_change(p, offset, ts, ekey, old, new, rec)
    dt = time.process_time() - t0
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    return len(stream) / dt, ctx.count


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--changes", type=int, default=100_000)
    ap.add_argument("--only", default="", help="run the scenarios whose label contains this")
    ap.add_argument("--repeat", type=int, default=1, help="best of N runs")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)
    for label, (make, workload, share) in SCENARIOS.items():
        if args.only not in label:
            continue
        changes = max(1000, int(args.changes * share))
        specs = make()
        best, sent = 0.0, 0
        for _ in range(args.repeat):
            rate, sent = measure(specs, changes, workload, args.profile)
            best = max(best, rate)
        print(f"{label:<62} {best:>11,.0f} changes/s {1e6 / best:>7.2f} us/change (CPU)  "
              f"({sent / changes:.3f} notifications/change)", flush=True)


if __name__ == "__main__":
    main()
