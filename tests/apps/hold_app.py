"""Hold test app: stores reservations, and every handler call waits while the file named by
``HOLD_FILE`` exists (a slow handler whose calls the test ends)."""

from __future__ import annotations

import os
import time

from services.worker import App, Event, GroupState

__all__ = ["app"]

app = App("hold")
HOLD_FILE = os.environ.get("HOLD_FILE", "/nonexistent")


@app.handler("reservation")
def handle(event: Event, state: GroupState) -> None:
    while os.path.exists(HOLD_FILE):
        time.sleep(0.05)
    if event.op == "delete":
        state.delete(event.type, event.key, event.version)
    else:
        assert event.value is not None
        state.put(event.type, event.value)
