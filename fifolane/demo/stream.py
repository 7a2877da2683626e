"""A realistic, deterministic booking stream: flights, reservations with out-of-order and
superseded updates, cancellations, deletes, and a handful of malformed records."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

__all__ = ["DemoStream", "count_superseded", "generate", "malformed"]

AIRPORTS = ["FRA", "JFK", "LHR", "CDG", "SFO", "NRT", "DXB", "SIN", "GRU", "SYD", "MUC", "BOS"]

Event = tuple[str, dict[str, Any], str]


@dataclass
class DemoStream:
    flights: list[Event] = field(default_factory=list)
    reservations: list[Event] = field(default_factory=list)

    @property
    def events(self) -> list[Event]:
        return self.flights + self.reservations


def generate(n_flights: int = 300, n_events: int = 200_000, seed: int = 42) -> DemoStream:
    rng = random.Random(seed)
    out = DemoStream()
    numbers = [f"{rng.choice(['LH', 'BA', 'AF', 'UA', 'EK'])}{1000 + i}" for i in range(n_flights)]
    for i, number in enumerate(numbers):
        origin, destination = rng.sample(AIRPORTS, 2)
        out.flights.append(("flight", {
            "flight_number": number, "origin": origin, "destination": destination,
            "departure": date(2026, 12, 1) + timedelta(days=i % 30),
            "capacity": rng.choice([120, 180, 240, 300]), "version": 1}, "upsert"))
    n_res = max(1, n_events // 4)
    versions: dict[int, int] = {}
    for _ in range(n_events):
        r = rng.randrange(n_res)
        flight = numbers[r % n_flights]
        v = versions.get(r, 0) + rng.choice([1, 1, 1, 2])
        versions[r] = v
        roll = rng.random()
        if roll < 0.05 and v > 2:
            v -= 2  # arrives late: superseded by what was already sent
        elif roll < 0.06 and v > 1:
            v = versions[r] - 1 if rng.random() < 0.5 else versions[r]  # late or duplicate
        op = "delete" if rng.random() < 0.03 else "upsert"
        state = "CANCELLED" if rng.random() < 0.05 else "NEW"
        seats = rng.randint(1, 6)
        out.reservations.append(("reservation", {
            "reservation_id": f"R{r:07d}", "flight_number": flight, "customer_id": f"C{rng.randrange(20_000):05d}",
            "seats": seats, "amount": round(seats * rng.uniform(80, 900), 2), "state": state,
            "version": v}, op))
    return out


def malformed(valid_value: bytes) -> list[tuple[bytes | None, bytes | None, str]]:
    """(key, value, expected dead-letter reason) for a handful of bad records."""
    return [
        (b"LH1000", b"\x00not avro at all", "undecodable"),
        (b"LH1000", valid_value[:11], "undecodable"),
        (b"LH1000", b"\xc3\x01" + struct.pack("<q", 424242) + valid_value[10:], "unknown-schema"),
        (None, valid_value, "missing-group"),
        (b"LH1000", None, "undecodable"),
    ]


def count_superseded(events: list[Event]) -> int:
    """Events not newer than one already sent for the same entity (dropped by workers)."""
    seen: dict[tuple[str, Any], int] = {}
    n = 0
    for type_name, record, _op in events:
        key = (type_name, record.get("reservation_id", record["flight_number"]))
        if key in seen and record["version"] <= seen[key]:
            n += 1
        else:
            seen[key] = record["version"]
    return n
