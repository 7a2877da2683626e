"""The seeds' example: seat reservations per flight, one flight at a time.

Run it with ``fifolane worker --app examples.flights:app``.

A reservation is CONFIRMED when the flight still has room for its seats, otherwise
REJECTED; a cancellation (state CANCELLED) or a delete gives its seats back. A rebooking (the
same reservation in another flight, at a higher version) gives the old flight its seats back:
the worker calls this handler with a delete there when the reservation leaves it. That is only
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

    Applies the same stale-drop (version per entity) as the worker. A reservation that comes
    in another flight than the one it is live on (a rebooking, or a delete sent there) first
    leaves its old flight, as the worker's move-out does: a delete there, which gives its seats
    back. (The worker runs flights concurrently, and the move-out reaches the old flight a
    moment later: with a full old flight, a booking there in that moment can differ.)
    Returns entity key (``type/key``) -> record for live entities.
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
        moved = table.get(ekey)
        if moved is not None and moved["flight_number"] != group:
            _leave(table, ekey, moved)
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


def _leave(table: dict[str, dict[str, Any]], ekey: str, res: dict[str, Any]) -> None:
    """The move-out of a reservation from its flight: what :func:`on_reservation` does with a
    delete there."""
    group = res["flight_number"]
    lkey = f"flight_load/{group}"
    load = table.get(lkey)
    sold = load["seats_sold"] if load else 0
    flight = table.get(f"flight/{group}")
    del table[ekey]
    new_sold = sold - (res["seats"] if res["state"] == "CONFIRMED" else 0)
    if new_sold != sold or load is None:
        table[lkey] = _load(group, load, new_sold, flight["capacity"] if flight else None, 0)
