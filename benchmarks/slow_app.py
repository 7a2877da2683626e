"""The slow-handler app: every event sleeps 0-5 ms (deterministic per event), then the
table update (``--app benchmarks.slow_app:app``)."""

from __future__ import annotations

import time

from benchmarks.events import sleep_for
from services.worker import App, Event, GroupState

__all__ = ["app"]

app = App("slow")


@app.handler("reservation")
def slow(event: Event, state: GroupState) -> None:
    """Sleep the event's delay (an I/O-bound handler), then apply it like the table handler."""
    time.sleep(sleep_for(event.raw))
    assert event.value is not None
    state.put(event.type, event.value)
