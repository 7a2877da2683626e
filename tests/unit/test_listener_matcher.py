"""ListenerSet: view semantics, kinds, converters, errors, equality index, filter dedupe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from fifolane.errors import ExpressionError, ListenerError
from listeners.matcher import Change, ListenerSet, Notification
from listeners.model import ListenerSpec

BIG = 'value.amount > 500.0 && value.state == "CONFIRMED"'


def change(
    new: dict[str, Any] | None,
    old: dict[str, Any] | None,
    type_: str = "reservation",
    key: str = "R1",
) -> Change:
    table_change = "created" if old is None else ("removed" if new is None else "modified")
    meta = {"partition": 0, "offset": 7, "timestamp": 1, "version": 3, "type": type_}
    return Change(type_, key, new, old, table_change, meta)


def res(amount: float, state: str = "CONFIRMED", **extra: Any) -> dict[str, Any]:
    return {"amount": amount, "state": state, **extra}


def kinds_of(out: list[Notification], name: str) -> list[str]:
    return [n.kind for n in out if n.listener == name]


# (description, old, new, expected listener kind or None) for the filter BIG.
VIEW_TABLE = [
    ("create inside", None, res(600), "created"),
    ("create outside", None, res(100), None),
    ("enter", res(100), res(600), "created"),
    ("stay", res(600), res(700), "modified"),
    ("leave by update", res(600), res(600, "CANCELLED"), "removed"),
    ("stay outside", res(100), res(200), None),
    ("delete inside", res(600), None, "removed"),
    ("delete outside", res(100), None, None),
]


@pytest.mark.parametrize(
    ("what", "old", "new", "expected"), VIEW_TABLE, ids=[r[0] for r in VIEW_TABLE]
)
def test_view_semantics(what: str, old: Any, new: Any, expected: str | None) -> None:
    ls = ListenerSet()
    ls.add(ListenerSpec(name="big", filter=BIG))
    out = ls.match(change(new, old))
    assert kinds_of(out, "big") == ([expected] if expected else [])
    for n in out:
        assert n.value == (None if n.kind == "removed" else new)


@pytest.mark.parametrize(
    ("what", "old", "new", "expected"), VIEW_TABLE, ids=[r[0] for r in VIEW_TABLE]
)
def test_view_semantics_with_kinds_restriction(
    what: str, old: Any, new: Any, expected: str | None
) -> None:
    ls = ListenerSet()
    ls.add(ListenerSpec(name="big", filter=BIG, kinds=("created", "removed")))
    out = ls.match(change(new, old))
    want = [expected] if expected in ("created", "removed") else []
    assert kinds_of(out, "big") == want


def test_converter_projects_created_and_modified_only() -> None:
    ls = ListenerSet()
    ls.add(
        ListenerSpec(
            name="p", filter=BIG, convert='{"id": key, "amount": value.amount, "kind": kind}'
        )
    )
    assert ls.match(change(res(600), None)) == [
        Notification("p", "created", {"id": "R1", "amount": 600.0, "kind": "created"})
    ]
    # Table change "modified", listener kind "created": the converter sees the listener kind.
    assert ls.match(change(res(600), res(100)))[0].value == {
        "id": "R1",
        "amount": 600.0,
        "kind": "created",
    }
    assert ls.match(change(res(700), res(600)))[0].value == {
        "id": "R1",
        "amount": 700.0,
        "kind": "modified",
    }
    assert ls.match(change(None, res(700))) == [Notification("p", "removed", None)]


def test_type_restriction_and_no_work_for_other_types() -> None:
    ls = ListenerSet()
    ls.add(ListenerSpec(name="r", filter="value.amount > 1.0", type="reservation"))
    assert kinds_of(ls.match(change(res(5), None)), "r") == ["created"]
    before = ls.evaluations
    assert ls.match(change({"seats": 3}, None, type_="seatmap")) == []
    assert ls.evaluations == before  # nothing evaluated (no context built) for an unwatched type


def test_runtime_errors_are_counted_and_others_still_match() -> None:
    ls = ListenerSet()
    ls.add(ListenerSpec(name="bad", filter="value.missing > 1"))
    ls.add(ListenerSpec(name="badconv", filter="true", convert='{"x": value.nope}'))
    ls.add(ListenerSpec(name="good", filter=BIG))
    out = ls.match(change(res(600), None))
    assert [n.listener for n in out] == ["good"]
    assert ls.stats("bad").errors == 1 and "missing" in (ls.stats("bad").last_error or "")
    assert ls.stats("badconv").errors == 1
    assert ls.stats("good").errors == 0 and ls.stats("good").notifications == 1


def test_runtime_errors_are_logged_first_and_then_now_and_then(caplog: Any) -> None:
    """Registered fine, failing on every change: the worker says so (once, then every
    10,000th), instead of a silent listener."""
    ls = ListenerSet()
    ls.add(ListenerSpec(name="bad", filter="value.missing > 1"))
    with caplog.at_level("WARNING", logger="listeners.matcher"):
        for i in range(3):
            ls.match(change(res(i), None))
    assert ls.stats("bad").errors == 3
    lines = [r.getMessage() for r in caplog.records if "'bad'" in r.getMessage()]
    assert len(lines) == 1 and "evaluation failed (1 time(s)" in lines[0] and "missing" in lines[0]


def test_transition_filters_use_event_semantics() -> None:
    ls = ListenerSet()
    ls.add(
        ListenerSpec(name="t", filter="old != null && value != null && old.state != value.state")
    )
    ls.add(ListenerSpec(name="c", filter='kind == "created"'))
    assert kinds_of(ls.match(change(res(1), None)), "c") == ["created"]
    out = ls.match(change(res(1, "CANCELLED"), res(1)))
    assert kinds_of(out, "t") == ["modified"] and kinds_of(out, "c") == []


def test_identical_filters_are_evaluated_once() -> None:
    ls = ListenerSet()
    for i in range(50):
        # Same filter, written differently: normalised to one text.
        ls.add(ListenerSpec(name=f"l{i}", filter=BIG if i % 2 else BIG.replace(" ", "  ")))
    ls.match(change(res(600), None))
    assert ls.evaluations == 1
    ls.match(change(res(700), res(600)))
    assert ls.evaluations == 3  # once on the old state, once on the new one
    ls.add(ListenerSpec(name="typed", filter=BIG, type="reservation"))
    out = ls.match(change(res(800), res(700)))
    assert ls.evaluations == 5 and len(out) == 51


def test_equality_index_evaluates_only_the_candidate() -> None:
    ls = ListenerSet()
    for i in range(10_000):
        flt = (
            f'value.flight_number == "LH{i}"'
            if i % 2
            else f'"LH{i}" == value.flight_number && value.seats > 0'
        )
        ls.add(ListenerSpec(name=f"f{i}", filter=flt))
    out = ls.match(change({"flight_number": "LH42", "seats": 3}, None))
    assert [(n.listener, n.kind) for n in out] == [("f42", "created")]
    assert ls.evaluations == 1  # only the remaining conjunct of f42
    out = ls.match(change({"flight_number": "LH43", "seats": 3}, None))
    assert [n.listener for n in out] == ["f43"] and ls.evaluations == 1  # pure equality: no CEL run


def test_equality_index_old_and_new_in_different_buckets() -> None:
    ls = ListenerSet()
    ls.add(ListenerSpec(name="a", filter='value.flight_number == "LH1"'))
    ls.add(ListenerSpec(name="b", filter='value.flight_number == "LH2" && value.seats > 0'))
    out = ls.match(
        change({"flight_number": "LH2", "seats": 1}, {"flight_number": "LH1", "seats": 1})
    )
    assert sorted((n.listener, n.kind) for n in out) == [("a", "removed"), ("b", "created")]
    # A missing indexed field counts as "not matching", not as an error.
    assert ls.match(change({"other": 1}, None)) == [] and ls.stats("a").errors == 0


def test_equality_index_follows_cel_types() -> None:
    ls = ListenerSet()
    ls.add(ListenerSpec(name="one", filter="value.n == 1"))
    ls.add(ListenerSpec(name="t", filter="value.n == true"))
    assert [n.listener for n in ls.match(change({"n": 1.0}, None))] == ["one"]  # CEL: 1 == 1.0
    assert [n.listener for n in ls.match(change({"n": True}, None))] == ["t"]  # CEL: true != 1
    assert ls.match(change({"n": "1"}, None)) == []


def test_add_replace_remove() -> None:
    ls = ListenerSet()
    ls.add(ListenerSpec(name="a", filter='value.f == "x"'))
    ls.add(ListenerSpec(name="a", filter='value.f == "y"'))  # replaces
    assert len(ls) == 1 and ls.match(change({"f": "x"}, None)) == []
    assert [n.listener for n in ls.match(change({"f": "y"}, None))] == ["a"]
    assert ls.remove("a") is True and ls.remove("a") is False
    assert ls.match(change({"f": "y"}, None)) == [] and "a" not in ls
    with pytest.raises(ListenerError):
        ls.stats("a")


@dataclass
class _Plain:
    """Any object with the ListenerLike attributes can be added (no ListenerSpec validation)."""

    name: str
    filter: str
    convert: str | None = None
    kinds: tuple[str, ...] = ("created", "modified", "removed")
    type: str | None = None


def test_invalid_registrations_refused_on_add() -> None:
    ls = ListenerSet()
    with pytest.raises(ExpressionError) as info:
        ls.add(_Plain("x", "value.a >"))
    assert info.value.position == 9
    with pytest.raises(ListenerError, match="kinds"):
        ls.add(_Plain("x", "true", kinds=("updated",)))
    assert len(ls) == 0
    ls.add(_Plain("x", "true"))
    assert len(ls) == 1


def test_context_holds_only_needed_fields() -> None:
    ls = ListenerSet()
    ls.add(ListenerSpec(name="a", filter="size(value) == 2"))  # needs the whole map
    assert [n.kind for n in ls.match(change({"x": 1, "y": 2}, None))] == ["created"]
    ls.remove("a")
    ls.add(ListenerSpec(name="b", filter="value.x == 1 && value.y == 2"))
    ls.add(ListenerSpec(name="c", filter="has(value.z)"))
    out = ls.match(change({"x": 1, "y": 2, "z": 0, "big": list(range(1000))}, None))
    assert sorted(n.listener for n in out) == ["b", "c"]


def test_match_current_state() -> None:
    ls = ListenerSet()
    ls.add(
        ListenerSpec(
            name="p", filter=BIG, convert='{"a": value.amount}', include_current_state=True
        )
    )
    snap = Change("reservation", "R9", res(900), None, "created", {})
    assert ls.match_current("p", snap) == Notification("p", "created", {"a": 900.0})
    assert ls.match_current("p", Change("reservation", "R8", res(1), None, "created", {})) is None
