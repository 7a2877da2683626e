"""Multi-stage test app: reservations go NEW -> CONFIRMED -> TICKETED, one handler per stage.

Each stage handler sleeps a little (``STAGES_HANDLER_SLEEP`` seconds at most, 5 ms by
default), moves the reservation to the next state and emits one effect record (topic
``FAULT_EFFECT_TOPIC``, key = group) with the ``group``, ``stage``, ``key``, ``version``,
the event's ``seq`` (header ``test.seq``), the ``worker`` incarnation and the call's
wall-clock ``start`` and ``end``: committed with the stage's writes, so the committed effect
topic shows which stage calls took effect, in which order, and when they ran.
"""

from __future__ import annotations

import json
import os
import random
import time

from services.worker import App, Event, GroupState, Output

__all__ = ["app"]

app = App("stages")
EFFECT_TOPIC = os.environ.get("FAULT_EFFECT_TOPIC", "effects")
_WORKER = f"{os.environ.get('FAULT_WORKER', 'worker')}/{os.getpid()}"
_MAX_SLEEP = float(os.environ.get("STAGES_HANDLER_SLEEP", "0.005"))
NEXT = {"NEW": "CONFIRMED", "CONFIRMED": "TICKETED"}


def _stage(event: Event, state: GroupState) -> Output:
    start = time.time()
    time.sleep(random.uniform(0, _MAX_SLEEP))
    assert event.value is not None and event.stage is not None
    state.put("reservation", {**event.value, "state": NEXT[event.stage]})
    body = {"group": event.group, "stage": event.stage, "key": event.key, "version": event.version,
            "seq": int(dict(event.headers).get("test.seq", b"-1")), "worker": _WORKER,
            "start": start, "end": time.time()}
    return Output(EFFECT_TOPIC, event.group, json.dumps(body))


app.handler("reservation", stage="NEW")(_stage)
app.handler("reservation", stage="CONFIRMED")(_stage)
