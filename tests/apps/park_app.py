"""Parking test app: applies reservations and emits one effect record per call (like
``fault_app``), and fails for a reservation whose customer is ``poison`` until the file named
by ``PARK_HEAL_FILE`` exists (the operator "fixed" it)."""

from __future__ import annotations

import json
import os
import time

from services.worker import App, Event, GroupState, Output

__all__ = ["app"]

app = App("park")
EFFECT_TOPIC = os.environ.get("FAULT_EFFECT_TOPIC", "effects")
HEAL_FILE = os.environ.get("PARK_HEAL_FILE", "/nonexistent")
_WORKER = f"{os.environ.get('FAULT_WORKER', 'worker')}/{os.getpid()}"


@app.handler("reservation")
def handle(event: Event, state: GroupState) -> Output:
    start = time.time()
    if event.value is not None and event.value["customer_id"] == "poison" and not os.path.exists(HEAL_FILE):
        raise RuntimeError(f"cannot handle {event.key}: poison (until {HEAL_FILE} exists)")
    if event.op == "delete":
        state.delete(event.type, event.key, event.version)
    else:
        assert event.value is not None
        state.put(event.type, event.value)
    body = {"group": event.group, "seq": int(dict(event.headers).get("test.seq", b"-1")),
            "key": event.key, "version": event.version, "worker": _WORKER, "start": start, "end": time.time()}
    return Output(EFFECT_TOPIC, event.group, json.dumps(body))
