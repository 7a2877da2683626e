"""Measure the CEL candidates and the listener matcher.

Run: ``.venv/bin/python benchmarks/cel_candidates.py`` (``--quick`` or ``FIFOLANE_BENCH_QUICK=1``
for a short run). Prints a table; no result is asserted anywhere.

Candidates:
- ``common-expression-language`` (import ``cel``): Rust (cel-interpreter) behind PyO3.
- ``cel-python`` (import ``celpy``): pure Python (lark parser + tree-walking evaluator).

For each: compile time, context build per field, evaluation on a ready context and the total
per change, for the typical filter below. Then :class:`listeners.matcher.ListenerSet`
throughput with 1, 100 and 10,000 equality listeners and with 100 distinct general filters.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

FILTER = 'value.amount > 500.0 && value.state == "CONFIRMED"'
QUICK = "--quick" in sys.argv or os.environ.get("FIFOLANE_BENCH_QUICK") == "1"


def per_call_us(fn: Callable[[], Any], n: int) -> float:
    """Best of 3 runs of ``n`` calls, in microseconds per call."""
    n = max(n // (10 if QUICK else 1), 10)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def entity(n_fields: int) -> dict[str, Any]:
    """A reservation-like map with ``amount`` and ``state`` plus filler fields."""
    value: dict[str, Any] = {"amount": 600.0, "state": "CONFIRMED"}
    for i in range(n_fields - 2):
        value[f"f{i}"] = f"text-{i}" if i % 2 else i
    return value


def bench_rust() -> dict[str, float]:
    import cel

    prog = cel.compile(FILTER)
    small, wide = entity(2), entity(22)
    c_small, c_wide = cel.Context({"value": small}), cel.Context({"value": wide})
    assert prog.execute(c_small) is True
    r = {
        "compile": per_call_us(lambda: cel.compile(FILTER), 5_000),
        "ctx_2_fields": per_call_us(lambda: cel.Context({"value": small}), 50_000),
        "ctx_22_fields": per_call_us(lambda: cel.Context({"value": wide}), 20_000),
        "eval_ready_ctx": per_call_us(lambda: prog.execute(c_small), 100_000),
        "eval_ready_ctx_wide": per_call_us(lambda: prog.execute(c_wide), 100_000),
        "total_2_fields": per_call_us(lambda: prog.execute(cel.Context({"value": small})), 50_000),
        "total_22_fields": per_call_us(lambda: prog.execute(cel.Context({"value": wide})), 20_000),
    }
    r["per_field"] = (r["ctx_22_fields"] - r["ctx_2_fields"]) / 20
    return r


def bench_python() -> dict[str, float]:
    import celpy

    env = celpy.Environment()
    prog = env.program(env.compile(FILTER))
    small, wide = entity(2), entity(22)
    act = {"value": celpy.json_to_cel(small)}
    assert bool(prog.evaluate(act)) is True
    r = {
        "compile": per_call_us(lambda: env.program(env.compile(FILTER)), 300),
        "ctx_2_fields": per_call_us(lambda: {"value": celpy.json_to_cel(small)}, 20_000),
        "ctx_22_fields": per_call_us(lambda: {"value": celpy.json_to_cel(wide)}, 5_000),
        "eval_ready_ctx": per_call_us(lambda: prog.evaluate(act), 3_000),
        "total_2_fields": per_call_us(
            lambda: prog.evaluate({"value": celpy.json_to_cel(small)}), 3_000
        ),
        "total_22_fields": per_call_us(
            lambda: prog.evaluate({"value": celpy.json_to_cel(wide)}), 2_000
        ),
    }
    r["per_field"] = (r["ctx_22_fields"] - r["ctx_2_fields"]) / 20
    return r


def bench_matcher() -> list[tuple[str, float, int]]:
    """(scenario, changes per second, notifications per 1,000 changes)."""
    from listeners.matcher import Change, ListenerSet
    from listeners.model import ListenerSpec

    def changes(n: int, flights: int) -> list[Change]:
        out = []
        for i in range(n):
            old = entity(10) | {"flight_number": f"LH{i % flights}", "amount": float(i % 1000)}
            new = old | {"amount": float((i * 7) % 1000)}
            meta = {
                "partition": 0,
                "offset": i,
                "timestamp": 0,
                "version": i,
                "type": "reservation",
            }
            out.append(Change("reservation", f"R{i}", new, old, "modified", meta))
        return out

    def run(name: str, ls: ListenerSet, stream: list[Change]) -> tuple[str, float, int]:
        for c in stream[:200]:  # warm-up
            ls.match(c)
        t0 = time.perf_counter()
        sent = sum(len(ls.match(c)) for c in stream)
        dt = time.perf_counter() - t0
        return name, len(stream) / dt, round(sent * 1000 / len(stream))

    n = 5_000 if QUICK else 50_000
    results = []
    for count in (1, 100, 10_000):
        ls = ListenerSet()
        for i in range(count):
            ls.add(ListenerSpec(name=f"eq{i}", filter=f'value.flight_number == "LH{i}"'))
        results.append(run(f"{count} equality listeners", ls, changes(n, 10_000)))
        ls = ListenerSet()
        for i in range(count):
            flt = f'value.flight_number == "LH{i}" && value.amount > 500.0'
            ls.add(
                ListenerSpec(
                    name=f"eq{i}", filter=flt, convert='{"id": key, "amount": value.amount}'
                )
            )
        results.append(run(f"{count} equality && condition, converter", ls, changes(n, 10_000)))
    ls = ListenerSet()
    for i in range(100):
        ls.add(
            ListenerSpec(
                name=f"g{i}", filter=f"value.amount > {float(i * 10)} && value.f{i % 8} != null"
            )
        )
    results.append(run("100 distinct general filters", ls, changes(n // 10, 10_000)))
    ls = ListenerSet()
    ls.add(ListenerSpec(name="one", filter=FILTER))
    results.append(run("1 general filter (the typical one)", ls, changes(n, 10_000)))
    ls = ListenerSet()
    ls.add(ListenerSpec(name="other", filter="true", type="seatmap"))
    results.append(run("listener on another type only", ls, changes(n, 10_000)))
    return results


def main() -> None:
    print(f"filter: {FILTER}\n")
    rust, py = bench_rust(), bench_python()
    print(f"{'µs':24}{'cel (Rust)':>14}{'celpy (Python)':>16}{'ratio':>8}")
    for k in (
        "compile",
        "per_field",
        "ctx_2_fields",
        "ctx_22_fields",
        "eval_ready_ctx",
        "total_2_fields",
        "total_22_fields",
    ):
        a, b = rust[k], py[k]
        print(f"{k:24}{a:14.2f}{b:16.2f}{b / a:8.0f}x")
    print(f"{'eval_ready_ctx_wide':24}{rust['eval_ready_ctx_wide']:14.2f}")
    print("\nmatcher (modified changes of 12-field entities, 10,000 flights):")
    for name, rate, per_k in bench_matcher():
        print(f"  {name:44}{rate:12,.0f} changes/s  {per_k:5d} notifications/1k changes")


if __name__ == "__main__":
    main()
