"""Listener expressions over Avro logical-type values (dates, times, UUIDs, decimals...), and
any exception while evaluating a listener counted as that listener's error, once per change."""

from __future__ import annotations

import datetime
import json
import uuid
from decimal import Decimal
from typing import Any

import cel
import pytest

from listeners import matcher as matcher_mod
from listeners.celvalues import cel_context, cel_value
from listeners.matcher import Change, ListenerSet, Notification
from listeners.model import ListenerSpec
from listeners.notify import encode_value

UTC = datetime.UTC
DAY = datetime.date(2026, 12, 1)
FLIGHT: dict[str, Any] = {"flight_number": "AF1000", "origin": "DXB", "destination": "FRA",
                          "departure": DAY, "capacity": 120, "version": 1}  # fmt: skip


def _set(*specs: ListenerSpec) -> ListenerSet:
    ls = ListenerSet()
    for s in specs:
        ls.add(s)
    return ls


def _created(new: dict[str, Any], old: dict[str, Any] | None = None) -> Change:
    return Change("flight", "AF1000", new, old, "created" if old is None else "modified")


def test_cel_value_conversions() -> None:
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert cel_value(DAY) == "2026-12-01"
    assert cel_value(datetime.time(13, 45)) == "13:45:00"
    assert cel_value(datetime.time(13, 45, 0, 250_000)) == "13:45:00.250000"
    assert cel_value(u) == "12345678-1234-5678-1234-567812345678"
    assert cel_value({"a": [DAY, {"b": u}], "s": {1}}) == {"a": ["2026-12-01", {"b": str(u)}], "s": [1]}
    ts = datetime.datetime(2026, 1, 1, tzinfo=UTC)
    assert cel_value(ts) is ts  # CEL takes these as they are
    assert cel_value(Decimal("1.5")) == Decimal("1.5")
    assert cel_value(bytearray(b"ab")) == b"ab"
    ctx = cel_context({"value": {"d": DAY, "t": datetime.time(1, 2), "u": u, "x": Decimal("2.5"),
                                 "ts": ts, "b": b"\x00"}})  # fmt: skip
    assert cel.evaluate('value.d == "2026-12-01" && value.t == "01:02:00" && value.x == 2.5', ctx) is True
    assert cel.evaluate('value.ts > timestamp("2025-12-31T00:00:00Z") && value.b == b"\\x00"', ctx) is True
    assert cel.evaluate('timestamp(value.d + "T00:00:00Z") == timestamp("2026-12-01T00:00:00Z")', ctx) is True


@pytest.mark.parametrize(
    ("filter_", "convert", "expected"),
    [
        ("true", "value", {**FLIGHT, "departure": "2026-12-01"}),
        ("true", '{"dep": value.departure}', {"dep": "2026-12-01"}),
        ("value.departure != null", '{"dep": value.departure}', {"dep": "2026-12-01"}),
        ('value.departure >= "2026-12-01"', '{"n": value["flight_" + "number"]}', {"n": "AF1000"}),
        ('value["depar" + "ture"] < "2026-12-02"', '{"d": value}', {"d": {**FLIGHT, "departure": "2026-12-01"}}),
    ],
)
def test_date_fields_in_filters_and_converters(filter_: str, convert: str, expected: dict[str, Any]) -> None:
    ls = _set(ListenerSpec(name="f", filter=filter_, convert=convert, type="flight"))
    out = ls.match(_created(FLIGHT))
    assert out == [Notification("f", "created", expected)]
    assert ls.stats("f").errors == 0
    assert json.loads(encode_value(out[0].value)) == json.loads(json.dumps(expected))


def test_old_with_a_date_in_a_converter() -> None:
    ls = _set(ListenerSpec(name="t", filter="old != null", convert='{"old": old, "new": value.departure}',
                           type="flight"))  # fmt: skip
    later = {**FLIGHT, "departure": datetime.date(2026, 12, 2), "version": 2}
    out = ls.match(_created(later, FLIGHT))
    assert out == [Notification("t", "modified", {"old": {**FLIGHT, "departure": "2026-12-01"},
                                                  "new": "2026-12-02"})]  # fmt: skip
    assert json.loads(encode_value(out[0].value))["old"]["departure"] == "2026-12-01"


def test_no_converter_keeps_the_state_itself() -> None:
    ls = _set(ListenerSpec(name="n", filter='value.departure == "2026-12-01"', type="flight"))
    out = ls.match(_created(FLIGHT))
    assert out == [Notification("n", "created", FLIGHT)] and out[0].value is FLIGHT
    assert json.loads(encode_value(FLIGHT))["departure"] == "2026-12-01"  # the same text as converted


def test_a_value_cel_still_refuses_is_the_listeners_error_not_the_workers() -> None:
    odd = {**FLIGHT, "weird": object()}  # nothing fastavro returns; stands for any such value
    ls = _set(ListenerSpec(name="bad", filter="value.weird != null", type="flight"),
              ListenerSpec(name="good", filter="value.capacity == 120", type="flight"),
              ListenerSpec(name="conv", filter="true", convert='{"w": value.weird}', type="flight"))
    out = ls.match(_created(odd))
    assert [(n.listener, n.kind) for n in out] == [("good", "created")]
    assert ls.stats("bad").errors == 1 and ls.stats("conv").errors == 1
    assert ls.stats("bad").last_error is not None and ls.stats("bad").last_error.startswith("ValueError: ")
    assert ls.take_failing() == {"bad", "conv"}


class _Boom(Exception):
    pass


def test_any_exception_building_the_context_is_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(self: Any, value: Any, with_old: bool, kind: str) -> Any:
        raise _Boom("no context")

    monkeypatch.setattr(matcher_mod.Contexts, "_build", boom)
    ls = _set(ListenerSpec(name="a", filter="value.capacity + 0 == 120", type="flight"),
              ListenerSpec(name="c", filter="true", convert='{"d": value.departure}', type="flight"))
    assert ls.match(_created(FLIGHT)) == []
    assert (ls.stats("a").errors, ls.stats("c").errors) == (1, 1)
    assert ls.stats("a").last_error == "_Boom: no context"
    assert ls.match_current("a", _created(FLIGHT)) is None
    assert ls.stats("a").errors == 2


def test_errors_count_once_per_change() -> None:
    # the filter fails on the old and on the new state: one error per change, not two
    ls = _set(ListenerSpec(name="e", filter="value.capacity / 0 == 1", type="flight"))
    for i in range(3):
        assert ls.match(_created({**FLIGHT, "version": i + 2}, FLIGHT)) == []
    assert ls.stats("e").errors == 3
    ls.converter_failed("e", "too large")  # the same change: not counted again
    assert ls.stats("e").errors == 3 and ls.stats("e").last_error == "too large"


def test_indexed_equalities_see_what_cel_sees() -> None:
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    rec = {**FLIGHT, "price": Decimal("1.5"), "id": u, "at": datetime.time(8, 30)}
    ls = _set(ListenerSpec(name="d", filter='value.departure == "2026-12-01"', type="flight"),
              ListenerSpec(name="p", filter="value.price == 1.5", type="flight"),
              ListenerSpec(name="u", filter=f'value.id == "{u}"', type="flight"),
              ListenerSpec(name="t", filter='value.at == "08:30:00" && value.capacity > 100', type="flight"),
              ListenerSpec(name="no", filter='value.departure == "2026-12-02"', type="flight"))
    assert sorted(n.listener for n in ls.match(_created(rec))) == ["d", "p", "t", "u"]
