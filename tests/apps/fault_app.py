"""Fault-test app: applies reservations and emits one effect record per handler call.

The effect record (topic ``FAULT_EFFECT_TOPIC``, key = group) is JSON with the event's
``group`` and ``seq`` (header ``test.seq``), the ``worker`` incarnation
(``FAULT_WORKER``/pid) and the call's wall-clock ``start`` and ``end``. It is committed
with the event's state writes, so the committed effect topic shows which calls took
effect, in which order, and when they ran: what :mod:`fifolane.testing` checks.
"""

from __future__ import annotations

import json
import os
import random
import time

from services.worker import App, Event, GroupState, Output

__all__ = ["EFFECT_TOPIC", "app"]

app = App("fault")
EFFECT_TOPIC = os.environ.get("FAULT_EFFECT_TOPIC", "effects")
_WORKER = f"{os.environ.get('FAULT_WORKER', 'worker')}/{os.getpid()}"
_MAX_SLEEP = float(os.environ.get("FAULT_HANDLER_SLEEP", "0.002"))


@app.handler("reservation")
def handle(event: Event, state: GroupState) -> Output:
    start = time.time()
    time.sleep(random.uniform(0, _MAX_SLEEP))  # widen the window a second call could overlap
    if event.op == "delete":
        state.delete(event.type, event.key, event.version)
    else:
        assert event.value is not None
        state.put(event.type, event.value)
    body = {"group": event.group, "seq": int(dict(event.headers).get("test.seq", b"-1")),
            "key": event.key, "version": event.version, "op": event.op, "worker": _WORKER,
            "start": start, "end": time.time()}
    return Output(EFFECT_TOPIC, event.group, json.dumps(body))
