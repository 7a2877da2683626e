"""The seeds' example: seat reservations per flight, one flight at a time.

Run it with ``fifolane worker --app examples.flights:app``.

A reservation is CONFIRMED when the flight still has room for its seats, otherwise
REJECTED; a cancellation (state CANCELLED) or a delete gives its seats back. That is only
correct if the reservations of one flight are handled one at a time and in arrival order:
exactly what the FIFO group (``flight_number``) guarantees, while different flights are
handled concurrently. Seats sold are kept in a ``flight_load`` entity of the flight's group.

:func:`reference` computes the same result sequentially from the input, for checking.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from services.worker import App, Event, GroupState

__all__ = ["app", "decide", "reference"]

app = App("flights")


def decide(res: dict[str, Any], prev: dict[str, Any] | None, capacity: int | None,
           sold: int) -> tuple[dict[str, Any], int, int]:
    """The booking rule: the reservation as stored, the flight's new seats sold, and the
    seats refused by this decision."""
    held = prev["seats"] if prev is not None and prev["state"] == "CONFIRMED" else 0
    sold -= held
    if res["state"] == "CANCELLED":
        return res, sold, 0
    if capacity is not None and sold + res["seats"] <= capacity:
        return {**res, "state": "CONFIRMED"}, sold + res["seats"], 0
    return {**res, "state": "REJECTED"}, sold, res["seats"]


def _load(group: str, load: dict[str, Any] | None, sold: int, capacity: int | None,
          rejected: int) -> dict[str, Any]:
    return {"flight_number": group, "seats_sold": sold, "capacity": capacity or 0,
            "rejected_seats": (load["rejected_seats"] if load else 0) + rejected,
            "version": (load["version"] if load else 0) + 1}


# inline: the rule is pure CPU work, so it runs on the worker's poll thread (no thread hop;
# under the GIL threads would not make it faster). Per-flight order is kept all the same.
# A handler that waits on I/O would leave inline off and use --concurrency instead.
@app.handler("reservation", inline=True)
def on_reservation(event: Event, state: GroupState) -> None:
    load = state.get("flight_load", event.group)
    sold = load["seats_sold"] if load else 0
    prev = state.get("reservation", event.key)
    flight = state.get("flight", event.group)
    capacity = flight["capacity"] if flight else None
    rejected = 0
    if event.op == "delete":
        state.delete("reservation", event.key, event.version)
        new_sold = sold - (prev["seats"] if prev and prev["state"] == "CONFIRMED" else 0)
    else:
        assert event.value is not None
        stored, new_sold, rejected = decide(event.value, prev, capacity, sold)
        state.put("reservation", stored)
    if new_sold != sold or rejected or load is None:
        state.put("flight_load", _load(event.group, load, new_sold, capacity, rejected))


def reference(events: Iterable[tuple[str, dict[str, Any], str]]) -> dict[str, dict[str, Any]]:
    """The expected table after ``(type, record, op)`` events, handled one by one in order.

    Applies the same stale-drop (version per entity) as the worker. Returns entity key
    (``type/key``) -> record for live entities.
    """
    table: dict[str, dict[str, Any]] = {}
    versions: dict[str, int] = {}
    for type_name, record, op in events:
        key_field = "reservation_id" if type_name == "reservation" else "flight_number"
        ekey = f"{type_name}/{record[key_field]}"
        if ekey in versions and record["version"] <= versions[ekey]:
            continue  # stale: dropped before the handler
        versions[ekey] = record["version"]
        if type_name == "flight":
            if op == "delete":
                table.pop(ekey, None)
            else:
                table[ekey] = record
            continue
        group = record["flight_number"]
        lkey = f"flight_load/{group}"
        load = table.get(lkey)
        sold = load["seats_sold"] if load else 0
        prev = table.get(ekey)
        flight = table.get(f"flight/{group}")
        capacity = flight["capacity"] if flight else None
        rejected = 0
        if op == "delete":
            table.pop(ekey, None)
            new_sold = sold - (prev["seats"] if prev and prev["state"] == "CONFIRMED" else 0)
        else:
            stored, new_sold, rejected = decide(record, prev, capacity, sold)
            table[ekey] = stored
        if new_sold != sold or rejected or load is None:
            table[lkey] = _load(group, load, new_sold, capacity, rejected)
    return table
