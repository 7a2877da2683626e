"""The views computed in plain Python from a reference table: the oracle for Spark."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

__all__ = ["per_state", "revenue_per_route", "seats_per_flight"]

STATES = ("NEW", "CONFIRMED", "REJECTED", "CANCELLED", "TICKETED")


def seats_per_flight(reservations: list[dict[str, Any]], flights: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    sold: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in reservations:
        if r["state"] == "CONFIRMED":
            sold[r["flight_number"]][0] += 1
            sold[r["flight_number"]][1] += r["seats"]
    out = set()
    by_number = {f["flight_number"]: f for f in flights}
    for number in set(by_number) | set(sold):
        f = by_number.get(number)
        count, seats = sold.get(number, [0, 0])
        cap = f["capacity"] if f else None
        out.add((number, f and f["origin"], f and f["destination"], f and f["departure"], cap, count, seats,
                 None if cap is None else cap - seats))
    return out


def revenue_per_route(reservations: list[dict[str, Any]], flights: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    by_number = {f["flight_number"]: f for f in flights}
    acc: dict[tuple[Any, ...], list[Any]] = defaultdict(lambda: [set(), 0, 0, 0.0])
    for r in reservations:
        f = by_number.get(r["flight_number"])
        if r["state"] != "CONFIRMED" or f is None:
            continue
        a = acc[(f["origin"], f["destination"], f["departure"])]
        a[0].add(f["flight_number"])
        a[1] += 1
        a[2] += r["seats"]
        a[3] += r["amount"]
    return {(*k, len(v[0]), v[1], v[2], round(v[3], 6)) for k, v in acc.items()}


def per_state(reservations: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (s, sum(1 for r in reservations if r["state"] == s),
         sum(r["seats"] for r in reservations if r["state"] == s),
         round(sum(r["amount"] for r in reservations if r["state"] == s), 6))
        for s in STATES
    ]
