"""Registry records from anyone: ListenerSpec.from_json / Progress / ListenerStatus never raise
anything but fifolane's errors, whatever bytes or JSON a record holds (issue 12, item 6)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fifolane.errors import ExpressionError, ListenerError
from listeners.model import ListenerSpec
from listeners.registry import (
    ListenerStatus,
    Progress,
    RegistryRecord,
    RegistryRecordError,
    RegistryState,
    parse_progress_key,
    parse_status_key,
    status_key,
)

FIELDS = ["name", "filter", "convert", "kinds", "include_current_state", "output_topic", "type",
          "lease", "created_at", "renewed_at", "format", "expires_at", "other"]
scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
           | st.sampled_from(["x", "true", "value.a > 1", '{"a": 1}', "30s", "99999999999d", "1e308s",
                              "created", "created,removed", "9999-12-31T23:59:59+00:00",
                              "9999-12-31T23:59:59-05:00", "0001-01-01T00:00:00+14:00",
                              "2025-01-01T00:00:00", "2025-13-01", ""]))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=8)
records = st.fixed_dictionaries({"name": st.sampled_from(["ok", "x" * 129, "a/b"]) | json_values},
                                optional={f: json_values for f in FIELDS if f != "name"})


def _parse(raw: bytes | str) -> ListenerSpec | None:
    try:
        return ListenerSpec.from_json(raw)
    except (ListenerError, ExpressionError):
        return None


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(records | json_values)
@example({"name": "x", "lease": "99999999999d"})
@example({"name": "x", "lease": "3650d", "created_at": "8999-12-31T00:00:00+00:00"})
@example({"name": "x", "created_at": "9999-12-31T23:59:59-05:00"})
@example({"name": "x", "kinds": 5})
@example({"name": "x", "filter": ["value.a"]})
@example({"name": "x", "filter": "value.a > " * 3000 + "1"})
def test_any_json_record_parses_or_is_refused_with_a_fifolane_error(data: Any) -> None:
    spec = _parse(json.dumps(data))
    if spec is not None:  # whatever was accepted can be shown, expired or not, and written back
        assert ListenerSpec.from_json(spec.to_json()) == spec
        spec.is_expired()
        assert spec.to_dict()["name"] == spec.name


@settings(max_examples=400)
@given(st.binary(max_size=200))
@example(b"\xff\xfe\x00")
@example(b"[" * 100_000)
@example(b'{"name": "x", "filter": "' + b"!" * 5000 + b'true"}')
@example('{"name": "\ud800"}'.encode("utf-8", "surrogatepass"))
def test_any_bytes_parse_or_are_refused_with_a_fifolane_error(raw: bytes) -> None:
    _parse(raw)


@pytest.mark.parametrize(("record", "words"), [
    ({"name": "x", "lease": "99999999999d"}, "longer than the limit of 10 years (3650d)"),
    ({"name": "x", "created_at": "9999-12-31T23:59:59+00:00", "lease": "1h"},
     "created_at '9999-12-31T23:59:59+00:00': must lie between 1970-01-01 and 9000-01-01"),
    ({"name": "x", "created_at": "9999-12-31T23:59:59-05:00"}, "must lie between"),
    ({"name": "x", "kinds": 5}, "invalid kinds 5: give a list"),
    ({"name": "x", "filter": ["value.a"]}, "invalid filter ['value.a']: give a CEL expression"),
    ({"name": "x", "output_topic": "no spaces"}, "a Kafka topic name has 1-249 characters"),
    ([1, 2], "must be a JSON object with a name (a string), not [1, 2]"),
    ({"name": None}, "must be a JSON object with a name (a string)"),
])
def test_bad_records_are_refused_with_what_is_wrong(record: Any, words: str) -> None:
    with pytest.raises(ListenerError) as info:
        ListenerSpec.from_json(json.dumps(record))
    assert words in str(info.value)


def test_the_lease_bound_applies_to_the_api_too() -> None:
    with pytest.raises(ListenerError, match=r"longer than the limit of 10 years"):
        ListenerSpec(name="x", lease=timedelta(days=3651))
    assert ListenerSpec(name="x", lease=timedelta(days=3650)).lease == timedelta(days=3650)


# --- snapshot progress and status records ---------------------------------------------------
progress_like = st.fixed_dictionaries({}, optional={
    f: json_values | st.integers(-5, 5) for f in ("listener", "partition", "instance", "cursor", "done", "sent")})
status_like = st.fixed_dictionaries({}, optional={
    f: json_values | st.just("suspended") for f in ("listener", "worker", "state", "reason", "instance", "at")})


@settings(max_examples=400)
@given(st.binary(max_size=100) | (progress_like | status_like | json_values).map(lambda d: json.dumps(d).encode()))
@example(b"[" * 100_000)
@example(b'{"listener": "a", "partition": 0, "instance": "i", "cursor": "\\u00e9"}')
def test_progress_and_status_records_parse_or_raise_a_registry_record_error(raw: bytes) -> None:
    for parse in (Progress.from_json, ListenerStatus.from_json):
        try:
            parse(raw)
        except RegistryRecordError as exc:
            assert isinstance(exc, ListenerError) and isinstance(exc, ValueError)


def test_status_round_trip_and_keys() -> None:
    at = datetime(2025, 6, 1, tzinfo=UTC)
    s = ListenerStatus("big", "w1", "suspended", "cost", "2025-01-01T00:00:00+00:00", at)
    assert ListenerStatus.from_json(s.to_json()) == s
    assert json.loads(s.to_json()) == {"listener": "big", "worker": "w1", "state": "suspended", "reason": "cost",
                                       "instance": "2025-01-01T00:00:00+00:00", "at": "2025-06-01T00:00:00+00:00"}
    assert status_key("big", "w1") == "big/status/w1" and parse_status_key("big/status/w1") == ("big", "w1")
    assert parse_status_key("big/status/w/snapshot/1") == ("big", "w/snapshot/1")
    for key in ("big", "big/snapshot/1", "big/status/", "/status/w1", "a/b/status/w1"):
        assert parse_status_key(key) is None, key
    assert parse_progress_key("big/snapshot/2") == ("big", 2)
    for key in ("big/snapshot/²", "big/status/w/snapshot/1", "big/snapshot/-1"):
        assert parse_progress_key(key) is None, key
    with pytest.raises(RegistryRecordError, match=r"unknown state 'paused' \(known: suspended, invalid, failing\)"):
        ListenerStatus.from_json(s.to_json().replace(b"suspended", b"paused"))


def test_registry_state_folds_status_records() -> None:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    spec = ListenerSpec(name="big", created_at=t0)
    state = RegistryState()

    def st_rec(worker: str, instance: str, offset: int) -> RegistryRecord:
        value = ListenerStatus("big", worker, "suspended", "cost", instance, t0).to_json()
        return RegistryRecord(status_key("big", worker), value, offset)

    state.apply(st_rec("w1", "2025-01-01T00:00:00+00:00", 0))  # before the registration: kept
    state.apply(st_rec("w2", "2024-01-01T00:00:00+00:00", 1))  # an earlier instance: stale
    state.apply(RegistryRecord(status_key("big", "w3"), b"{", 2))  # malformed: ignored
    state.apply(RegistryRecord("big", spec.to_json(), 3))
    assert list(state.listeners) == ["big"] and state.invalid == {}
    assert [s.worker for s in state.status["big"]] == ["w1"]
    state.apply(RegistryRecord(status_key("big", "w1"), None, 4))  # tombstone clears it
    assert state.status == {}
    state.apply(RegistryRecord("other", spec.to_json(), 5))  # a record whose name is not its key
    assert state.invalid == {"other": "the registration's name 'big' differs from its record key 'other'"}
