"""The run-time guard of listener expressions (#12 item 10): CPU time per evaluation."""

from __future__ import annotations

from listeners.matcher import OVERRUNS, Change, ListenerSet
from listeners.model import ListenerSpec

CHANGE = Change("reservation", "R1", {"customer_id": "c1", "amount": 5.0}, None, "created")


def test_over_budget_only_after_repeated_overruns() -> None:
    ls = ListenerSet(budget=0.0)  # every CEL evaluation overruns
    ls.add(ListenerSpec(name="cel", filter="size(value.customer_id) > 0"))  # needs CEL
    ls.add(ListenerSpec(name="native", filter="value.amount > 1.0"))  # runs natively: not timed
    for i in range(OVERRUNS):
        assert ls.take_overruns() == set(), i
        ls.match(CHANGE)
    assert ls.take_overruns() == {"cel"}
    assert ls.stats("cel").overruns == OVERRUNS and ls.stats("native").overruns == 0


def test_cheap_expressions_never_overrun() -> None:
    ls = ListenerSet()
    ls.add(ListenerSpec(name="cel", filter="size(value.customer_id) > 0"))
    for _ in range(2000):
        ls.match(CHANGE)
    assert ls.take_overruns() == set() and ls.stats("cel").overruns == 0
