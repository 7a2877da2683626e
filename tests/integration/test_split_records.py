"""Split records (#17.3, SMILA's resequencer): a reservation (the root) with several seats
becomes one ticket per passenger (its children). Children carry the root's key and version;
a newer root supersedes all of an older root's children, an older root arriving late
changes nothing, and deleting the root deletes its children. Checked on the table and on
a listener of the child type, for the seed's orderings, against real Kafka."""

from __future__ import annotations

from typing import Any

import pytest
from kafka_fixtures import consume_all, wait_until
from worker_support import WorkerThread, read_table, reservation, send_events

from fifolane.config import Settings
from fifolane.testing.listener_check import materialize
from fifolane.testing.records import notifications_from
from listeners.model import ListenerSpec
from listeners.registry import register
from listeners.runtime import ListenerRuntime
from services.worker import App, Event, GroupState

pytestmark = pytest.mark.integration


def _app(store_root: bool) -> App:
    app = App("split")

    @app.handler("reservation")
    def split(event: Event, state: GroupState) -> None:
        if event.value is None:  # the root is deleted: so are its children
            if store_root:
                state.delete("reservation", event.key, event.version)
            state.put_children("ticket", event.key, event.version, [])
            return
        if store_root:
            state.put("reservation", event.value)
        state.put_children("ticket", event.key, event.version, [
            {"ticket_id": f"{event.key}/{n}", "flight_number": event.group, "reservation_id": event.key,
             "passenger": n} for n in range(1, event.value["seats"] + 1)])

    return app


#: (name, the root's events in arrival order: (version, seats or None for a delete), the
#: tickets left: key -> version)
CASES = [
    ("t1-3-then-t2-2", [(1, 3), (2, 2)], {"R/1": 2, "R/2": 2}),
    ("t2-2-then-t1-3", [(2, 2), (1, 3)], {"R/1": 2, "R/2": 2}),
    ("t1-3-then-delete-t2", [(1, 3), (2, None)], {}),
    ("delete-t2-then-t1-3", [(2, None), (1, 3)], {}),
    ("t1-2-then-t2-3-then-t1-late", [(1, 2), (2, 3), (1, 1)], {"R/1": 2, "R/2": 2, "R/3": 2}),
]


@pytest.mark.parametrize("store_root", [False, True], ids=["children-only", "with-root"])
def test_split_records_follow_the_root(settings: Settings, topics: Any, store_root: bool) -> None:
    register(settings, ListenerSpec(name="tickets", filter="true", type="ticket"))
    rt = ListenerRuntime(settings)
    events = []
    want: dict[str, int] = {}
    for i, (_name, ops, left) in enumerate(CASES):
        rid, flight = f"R{i}", f"F{i}"
        for version, seats in ops:
            record = reservation(rid, flight, version, seats=seats or 1)
            events.append(("reservation", record, "upsert" if seats else "delete"))
        want.update({f"ticket/{rid}{k[1:]}": v for k, v in left.items()})
    with WorkerThread(settings, _app(store_root), listeners=rt) as wt:
        wait_until(lambda: rt.names() == ["tickets"])
        send_events(settings, events)
        wait_until(lambda: wt.stats.processed + wt.stats.superseded == len(events) and wt.committed(),
                   timeout=60, message=lambda: str(wt.stats))
    rt.close()
    table = read_table(settings)
    tickets = {k: v for k, (v, rec) in table.items() if k.startswith("ticket/") and rec is not None}
    assert tickets == want
    view = materialize(notifications_from(consume_all(settings, settings.listener_output_topic)), "tickets")
    assert {f"ticket/{k}": rec["version"] for k, rec in view.items()} == want
