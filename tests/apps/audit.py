"""Test app: applies reservations and emits one audit record per handled event.

The audit topic (env ``AUDIT_TOPIC``) shows exactly-once effects: after kills and
rebalances it must hold each event once, in group order.
"""

from __future__ import annotations

import json
import os
import random
import time

from services.worker import App, Event, GroupState, Output

app = App("audit")
AUDIT_TOPIC = os.environ.get("AUDIT_TOPIC", "audit")


@app.handler("reservation")
def handle(event: Event, state: GroupState) -> Output:
    time.sleep(random.uniform(0, 0.001))
    if event.op == "delete":
        state.delete(event.type, event.key, event.version)
    else:
        assert event.value is not None
        state.put(event.type, event.value)
    body = {"group": event.group, "key": event.key, "version": event.version, "op": event.op,
            "seq": int(dict(event.headers).get("test.seq", b"-1"))}
    return Output(AUDIT_TOPIC, event.group, json.dumps(body))
