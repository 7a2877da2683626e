"""The three-stage benchmark apps: reservations go NEW -> CONFIRMED -> TICKETED.

``staged`` declares one handler per stage (lanes per group and stage: the stages of one
group run at once). ``serial`` does the same work in one handler per event, both stages one
after another (the baseline: a group's next event starts only after its previous one passed
every stage). Each stage sleeps a deterministic 0-5 ms derived from the entity, its version
and the stage, so both apps sleep exactly the same total."""

from __future__ import annotations

import time

from benchmarks.events import sleep_for
from services.worker import App, Event, GroupState

__all__ = ["NEXT", "serial", "stage_sleep", "staged"]

#: The stage an entity moves to from each handled stage.
NEXT = {"NEW": "CONFIRMED", "CONFIRMED": "TICKETED"}


def stage_sleep(key: str, version: int, stage: str) -> float:
    """The delay of one stage of one entity version (seconds, 0-5 ms)."""
    return sleep_for(f"{key}/{version}/{stage}".encode())


def _move(event: Event, state: GroupState, stage: str) -> None:
    assert event.value is not None
    time.sleep(stage_sleep(event.key, event.version, stage))
    state.put("reservation", {**event.value, "state": NEXT[stage]})


staged = App("stages")
staged.handler("reservation", stage="NEW")(lambda e, s: _move(e, s, "NEW"))
staged.handler("reservation", stage="CONFIRMED")(lambda e, s: _move(e, s, "CONFIRMED"))

serial = App("stages-serial")


@serial.handler("reservation")
def _both(event: Event, state: GroupState) -> None:
    """Both stages in one call: NEW's work, then CONFIRMED's."""
    assert event.value is not None
    time.sleep(stage_sleep(event.key, event.version, "NEW"))
    time.sleep(stage_sleep(event.key, event.version, "CONFIRMED"))
    state.put("reservation", {**event.value, "state": "TICKETED"})
