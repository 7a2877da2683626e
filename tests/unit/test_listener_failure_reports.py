"""Run-time evaluation errors are visible: a ``failing`` status record per listener and worker
(rate-limited), shown by ``listeners list/describe``; a converter's NaN/Infinity is such an
error, an entity's NaN/Infinity is written as null (listeners.failures, listeners.notifier)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner

from fifolane.cli.listeners import listeners as listeners_cli
from listeners import registry
from listeners.follower import RegistryRecord
from listeners.journal import SeqJournal
from listeners.matcher import Change, ListenerSet, Notification
from listeners.model import ListenerSpec
from listeners.notifier import Active, Notifier
from listeners.notify import change_parts
from listeners.registry_records import ListenerStatus, RegistryRecordError, status_key
from listeners.registry_state import RegistryState
from listeners.registry_view import RegistryView
from listeners.suspensions import Suspensions

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BAD = ListenerSpec(name="bad", filter="value.x / value.y > 1", created_at=T0)  # y == 0: an error


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _fail(ls: ListenerSet, n: int = 1) -> None:
    for i in range(n):
        assert ls.match(Change("t", f"k{i}", {"x": 1, "y": 0}, None, "created")) == []


def _setup(interval: float = 5.0) -> tuple[ListenerSet, Suspensions, Clock, list[tuple[Any, ...]]]:
    ls = ListenerSet()
    ls.add(BAD)
    active = {"bad": Active.of(BAD, "out", 1, 1 << 20)}
    sus = Suspensions("reg", None, ls, active)
    sus.worker = "w1"
    assert sus.reports is not None
    clock = Clock()
    sus.reports.interval, sus.reports._clock = interval, clock
    return ls, sus, clock, []


def _produce(out: list[tuple[Any, ...]]) -> Any:
    return lambda topic, value, key, partition: out.append((topic, key, json.loads(value), partition))


def test_a_failing_listener_is_reported_at_most_once_per_interval() -> None:
    ls, sus, clock, out = _setup()
    sus.flush(_produce(out))
    assert out == []  # nothing failed yet
    _fail(ls)
    sus.flush(_produce(out))
    sus.commit()
    assert len(out) == 1
    topic, key, value, partition = out[0]
    assert (topic, key, partition) == ("reg", b"bad/status/w1", 0)
    assert {k: value[k] for k in ("listener", "worker", "state", "instance", "errors")} == {
        "listener": "bad", "worker": "w1", "state": "failing", "instance": T0.isoformat(), "errors": 1}
    assert value["reason"] == ls.stats("bad").last_error and "ZeroDivisionError" in value["reason"]
    _fail(ls, 500)  # a flood of errors within the interval: counted, not written
    clock.now += 4.9
    sus.flush(_produce(out))
    assert len(out) == 1
    clock.now += 0.1
    sus.flush(_produce(out))
    sus.commit()
    assert [v["errors"] for _t, _k, v, _p in out] == [1, 501]
    clock.now += 60  # no new error: nothing to say
    sus.flush(_produce(out))
    assert len(out) == 2


def test_a_record_of_an_aborted_transaction_is_written_again() -> None:
    ls, sus, clock, out = _setup()
    _fail(ls)
    sus.flush(_produce(out))
    sus.rollback()
    sus.flush(_produce(out))  # at the next safe point, not an interval later
    sus.commit()
    assert [(v["state"], v["errors"]) for _t, _k, v, _p in out] == [("failing", 1), ("failing", 1)]


def test_a_listener_no_longer_active_is_not_reported() -> None:
    ls = ListenerSet()
    ls.add(BAD)
    sus = Suspensions("reg", None, ls, {})
    _fail(ls)
    out: list[tuple[Any, ...]] = []
    sus.flush(_produce(out))
    assert out == []


def test_status_records_carry_the_error_count_and_old_records_still_parse() -> None:
    st = ListenerStatus("bad", "w1", "failing", "boom", T0.isoformat(), T0, errors=7)
    assert ListenerStatus.from_json(st.to_json()) == st
    old = ListenerStatus("bad", "w1", "suspended", "cost", T0.isoformat(), T0)
    assert "errors" not in json.loads(old.to_json())  # the older format, unchanged
    assert ListenerStatus.from_json(old.to_json()).errors is None
    for bad in (-1, "3", True):
        raw = json.dumps({**json.loads(st.to_json()), "errors": bad})
        with pytest.raises(RegistryRecordError, match="'errors' must be a count"):
            ListenerStatus.from_json(raw)


def test_a_failing_status_is_not_a_suspension_for_workers() -> None:
    view = RegistryView(lambda _k, _p: None)
    st = ListenerStatus("bad", "w1", "failing", "boom", T0.isoformat(), T0, errors=7)
    view.apply([RegistryRecord(status_key("bad", "w1"), st.to_json(), 0)])
    assert view.suspended == {}


# -- JSON has no NaN or Infinity ---------------------------------------------------------------
def _notify(spec: ListenerSpec, value: dict[str, Any]) -> tuple[list[bytes], list[tuple[str, str]]]:
    produced: list[bytes] = []
    failed: list[tuple[str, str]] = []
    notifier = Notifier(SeqJournal(), lambda _topic, v, *_a: produced.append(v),
                        lambda name, msg: failed.append((name, msg)))  # fmt: skip
    act = Active.of(spec, "out", 1, 1 << 20)
    parts = change_parts("t", "k", "created", 0, 1, 1, 0)
    sent = notifier.send_all([Notification(spec.name, "created", value)], {spec.name: act}, None, 0, b"t/k",
                             parts, lambda *_a: False)  # fmt: skip
    assert sent == len(produced)
    return produced, failed


def test_a_converters_nan_is_an_error_of_its_listener_not_a_notification() -> None:
    spec = ListenerSpec(name="conv", convert='{"nan": 0.0/0.0, "inf": 1.0/0.0}')
    produced, failed = _notify(spec, {"nan": float("nan"), "inf": float("inf")})
    assert produced == []
    assert failed == [("conv", "converter '{\"nan\": 0.0/0.0, \"inf\": 1.0/0.0}' failed: NonFiniteError: "
                               "[\"nan\"] is nan, which JSON cannot carry; the change is not notified")]


def test_an_entitys_nan_is_written_as_null() -> None:
    produced, failed = _notify(ListenerSpec(name="raw"), {"a": float("-inf"), "b": [1.5, float("nan")]})
    assert failed == []
    assert [json.loads(v)["value"] for v in produced] == [{"a": None, "b": [1.5, None]}]


def test_converter_failed_counts_an_error_instead_of_a_notification() -> None:
    ls = ListenerSet()
    ls.add(ListenerSpec(name="conv", convert='{"v": value.x * 1.0}'))
    assert [n.value for n in ls.match(Change("t", "k", {"x": float("inf")}, None, "created"))] == [{"v": float("inf")}]
    ls.converter_failed("conv", "boom")
    ls.converter_failed("gone", "ignored")  # removed meanwhile: nothing to count
    st = ls.stats("conv")
    assert (st.notifications, st.errors, st.last_error) == (0, 1, "boom")
    assert ls.take_failing() == {"conv"} and ls.take_failing() == set()


# -- list and describe ---------------------------------------------------------------------------
def _state() -> RegistryState:
    state = RegistryState()
    spec = ListenerSpec(name="bad", filter="value.x > 1", created_at=T0)
    state.apply(RegistryRecord("bad", spec.to_json(), 0))
    at = datetime(2026, 1, 2, tzinfo=UTC)
    for i, w in enumerate(("w1", "w2")):
        st = ListenerStatus("bad", w, "failing", f"filter failed on {w}", T0.isoformat(), at, errors=3 + i)
        state.apply(RegistryRecord(status_key("bad", w), st.to_json(), 1 + i))
    stale = ListenerStatus("bad", "w3", "failing", "old", "2025-01-01T00:00:00+00:00", at, errors=1)
    state.apply(RegistryRecord(status_key("bad", "w3"), stale.to_json(), 3))
    return state


def test_describe_and_list_show_the_failing_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fifolane.cli.listeners.check_reachable", lambda *_a, **_k: None)  # no broker here
    monkeypatch.setattr(registry, "read_registry", lambda *_a, **_k: _state())
    runner = CliRunner()
    described = runner.invoke(listeners_cli, ["describe", "bad"])
    assert described.exit_code == 0
    lines = described.stdout.splitlines()
    assert "state                  failing on 2 worker(s)" in lines
    assert [ln for ln in lines if ln.startswith("failing ")] == [
        "failing                worker=w1 errors=3 last at 2026-01-02T00:00:00+00:00: filter failed on w1",
        "failing                worker=w2 errors=4 last at 2026-01-02T00:00:00+00:00: filter failed on w2",
    ]
    d = json.loads(runner.invoke(listeners_cli, ["describe", "bad", "--json"]).stdout)
    assert (d["state"], d["suspended"]) == ("failing on 2 worker(s)", [])
    assert d["failing"] == [
        {"worker": "w1", "errors": 3, "last_error": "filter failed on w1", "at": "2026-01-02T00:00:00+00:00"},
        {"worker": "w2", "errors": 4, "last_error": "filter failed on w2", "at": "2026-01-02T00:00:00+00:00"},
    ]
    listed = runner.invoke(listeners_cli, ["list"])
    assert listed.stdout.split()[:2] == ["bad", "failing"]
    assert json.loads(runner.invoke(listeners_cli, ["list", "--json"]).stdout)["failing"] == d["failing"]


def test_a_suspension_outranks_failing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("fifolane.cli.listeners.check_reachable", lambda *_a, **_k: None)  # no broker here
    state = _state()
    st = ListenerStatus("bad", "w2", "suspended", "over budget", T0.isoformat(), T0)
    state.apply(RegistryRecord(status_key("bad", "w2"), st.to_json(), 9))
    monkeypatch.setattr(registry, "read_registry", lambda *_a, **_k: state)
    d = json.loads(CliRunner().invoke(listeners_cli, ["describe", "bad", "--json"]).stdout)
    assert d["state"] == "suspended on 1 worker(s)"
    assert [f["worker"] for f in d["failing"]] == ["w1"] and [s["worker"] for s in d["suspended"]] == ["w2"]
