"""The flights app (examples/flights.py) in Quix Streams (run by the ``app`` suite in
``benchmarks/.venv-quix``; imports nothing from fifolane: Quix pins its own confluent-kafka).

Input: JSON ``{"type": "flight"|"reservation", "op": "upsert"|"delete", "record": {...}}``
keyed by flight number, so Quix's state (scoped by message key) is the flight's group
state, as in fifolane. Per reservation event the same state work as the fifolane handler:
3 reads (the reservation, which also serves the stale check fifolane does before the
handler; the flight's load; the flight) and 2 writes (the reservation; the load when it
changed). A delete keeps its version (a later stale version is still dropped). Each change
goes to the output topic as ``type/key -> {"key", "value"}`` (fifolane: its state topic); the state
store has its changelog topic, as Quix runs by default.
"""

from __future__ import annotations

import argparse
from typing import Any


def decide(res: dict[str, Any], prev: dict[str, Any] | None, capacity: int | None,
           sold: int) -> tuple[dict[str, Any], int, int]:
    """examples.flights.decide, copied: the booking rule."""
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


def handle(value: dict[str, Any], state: Any) -> list[dict[str, Any]]:
    """One event of one flight: the outputs (``{"key", "value"}``) of its state changes."""
    kind, op, rec = value["type"], value["op"], value["record"]
    if kind == "flight":
        old = state.get("flight")
        if old is not None and rec["version"] <= old["version"]:
            return []  # stale
        state.set("flight", {**rec, "deleted": op == "delete"})
        return [{"key": f"flight/{rec['flight_number']}", "value": None if op == "delete" else rec}]
    rid, group = rec["reservation_id"], rec["flight_number"]
    skey = f"reservation/{rid}"
    stored_prev = state.get(skey)
    if stored_prev is not None and rec["version"] <= stored_prev["version"]:
        return []  # stale: not newer than the applied version
    prev = None if stored_prev is None or stored_prev.get("deleted") else stored_prev
    load = state.get("flight_load")
    flight = state.get("flight")
    sold = load["seats_sold"] if load else 0
    capacity = flight["capacity"] if flight is not None and not flight.get("deleted") else None
    rejected = 0
    if op == "delete":
        state.set(skey, {"version": rec["version"], "deleted": True})
        new_sold = sold - (prev["seats"] if prev and prev["state"] == "CONFIRMED" else 0)
        outs: list[dict[str, Any]] = [{"key": skey, "value": None}]
    else:
        stored, new_sold, rejected = decide(rec, prev, capacity, sold)
        state.set(skey, stored)
        outs = [{"key": skey, "value": stored}]
    if new_sold != sold or rejected or load is None:
        new_load = _load(group, load, new_sold, capacity, rejected)
        state.set("flight_load", new_load)
        outs.append({"key": f"flight_load/{group}", "value": new_load})
    return outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--guarantee", choices=["exactly-once", "at-least-once"], required=True)
    parser.add_argument("--commit-interval", type=float, default=0.25)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--consumer-config", action="append", default=[], metavar="KEY=VALUE",
                        help="extra librdkafka consumer setting (the harness pins fetch settings)")
    args = parser.parse_args()

    from quixstreams import Application

    app = Application(
        broker_address=args.bootstrap, consumer_group=args.group, auto_offset_reset="earliest",
        processing_guarantee=args.guarantee, commit_interval=args.commit_interval,
        state_dir=args.state_dir, loglevel="WARNING", auto_create_topics=True,
        use_changelog_topics=True,
        consumer_extra_config=dict(kv.split("=", 1) for kv in args.consumer_config),
    )
    source = app.topic(args.input, value_deserializer="json")
    sink = app.topic(args.output, value_serializer="json")
    sdf = app.dataframe(source)
    sdf = sdf.apply(handle, stateful=True, expand=True)
    sdf.to_topic(sink, key=lambda out: out["key"])  # value: {"key", "value"}
    app.run()


if __name__ == "__main__":
    main()
