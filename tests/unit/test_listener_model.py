"""ListenerSpec: validation, leases, JSON round trip for the registry topic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fifolane.config import Settings
from fifolane.errors import ExpressionError, ListenerError
from listeners.durations import format_duration, parse_duration
from listeners.model import ListenerSpec

T0 = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("name", ["a", "orders.big-v2_1", "x" * 128])
def test_valid_names(name: str) -> None:
    assert ListenerSpec(name=name).name == name


@pytest.mark.parametrize("name", ["", "x" * 129, "has space", "slash/name", "ünï"])
def test_invalid_names(name: str) -> None:
    with pytest.raises(ListenerError, match="A-Z a-z 0-9"):
        ListenerSpec(name=name)


def test_expressions_are_compiled_at_validation() -> None:
    with pytest.raises(ExpressionError) as info:
        ListenerSpec(name="x", filter="value.amount >")
    assert info.value.position == 14
    with pytest.raises(ExpressionError, match="must return a map"):
        ListenerSpec(name="x", convert="value.amount > 1")


def test_kinds() -> None:
    assert ListenerSpec(name="x", kinds=("removed", "created")).kinds == ("created", "removed")
    assert ListenerSpec(name="x", kinds="modified, created").kinds == ("created", "modified")  # type: ignore[arg-type]
    with pytest.raises(ListenerError, match="created, modified, removed"):
        ListenerSpec(name="x", kinds=("updated",))
    with pytest.raises(ListenerError):
        ListenerSpec(name="x", kinds=())


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("5m", 300),
        ("1h", 3600),
        ("1h30m", 5400),
        ("500ms", 0.5),
        ("2d", 172800),
        (" 1M ", 60),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "30", "5 minutes", "1x", "0s", "-5s", "h"])
def test_parse_duration_errors(text: str) -> None:
    with pytest.raises(ListenerError, match="duration"):
        parse_duration(text)


def test_format_duration_round_trips() -> None:
    for text in ("30s", "5m", "1h", "90s", "2d", "1500ms"):
        assert format_duration(parse_duration(text)) == text


def test_lease_and_expiry() -> None:
    s = ListenerSpec(name="x", lease="5m", created_at=T0)  # type: ignore[arg-type]
    assert s.lease == timedelta(minutes=5)
    assert s.expires_at == T0 + timedelta(minutes=5)
    assert not s.is_expired(T0 + timedelta(minutes=4)) and s.is_expired(T0 + timedelta(minutes=5))
    r = s.renewed(T0 + timedelta(minutes=4))
    assert r.expires_at == T0 + timedelta(minutes=9) and r.created_at == T0
    assert ListenerSpec(name="y").expires_at is None and not ListenerSpec(name="y").is_expired()
    with pytest.raises(ListenerError, match="duration"):
        ListenerSpec(name="x", lease="soon")  # type: ignore[arg-type]


def test_json_round_trip() -> None:
    s = ListenerSpec(
        name="big-orders",
        filter='value.amount > 500.0 && value.state == "CONFIRMED"',
        convert='{"id": key, "amount": value.amount}',
        kinds=("created", "removed"),
        include_current_state=True,
        output_topic="views.big",
        type="reservation",
        lease="30s",  # type: ignore[arg-type]
        created_at=T0,
        renewed_at=T0 + timedelta(seconds=10),
    )
    raw = s.to_json()
    assert isinstance(raw, bytes)
    back = ListenerSpec.from_json(raw)
    assert back == s
    data = s.to_dict()
    assert data["lease"] == "30s" and data["expires_at"] == "2025-01-01T00:00:40+00:00"


def test_from_json_errors_and_forward_compatibility() -> None:
    with pytest.raises(ListenerError, match="JSON"):
        ListenerSpec.from_json(b"{nope")
    with pytest.raises(ListenerError, match="name"):
        ListenerSpec.from_json(b"[]")
    spec = ListenerSpec.from_json(
        b'{"name": "x", "filter": "true", "added_later": 1, "kinds": null, "created_at": "2025-01-01T00:00:00+00:00"}'
    )
    assert spec.kinds == ("created", "modified", "removed")
    assert spec.created_at == T0
    with pytest.raises(ListenerError, match=r"needs created_at"):  # not a time of each reader's own
        ListenerSpec.from_json(b'{"name": "x", "filter": "true"}')
    with pytest.raises(ExpressionError):
        ListenerSpec.from_json(b'{"name": "x", "filter": "nope.x"}')


def test_default_output_topic_comes_from_settings() -> None:
    settings = Settings(listener_output_topic="my.notifications")
    assert ListenerSpec(name="x").topic(settings) == "my.notifications"
    assert ListenerSpec(name="x", output_topic="other").topic(settings) == "other"
