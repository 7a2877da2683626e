"""Bad registry records against a real registry topic: `listeners list`, `describe` and `remove`
show and remove them instead of crashing, and status records show suspensions (issue 12, items
6 and 10)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from fifolane.cli.listeners import listeners as listeners_cli
from fifolane.config import Settings
from listeners.model import ListenerSpec
from listeners.registry import (
    ListenerStatus,
    ensure_registry_topic,
    progress_key,
    read_registry,
    register,
    status_key,
)

pytestmark = pytest.mark.integration

BAD = {
    "huge-lease": json.dumps({"name": "huge-lease", "filter": "true", "lease": "99999999999d",
                              "created_at": "2025-01-01T00:00:00+00:00"}).encode(),
    "far-future": json.dumps({"name": "far-future", "filter": "true", "lease": "1h",
                              "created_at": "9999-12-31T23:59:59+00:00"}).encode(),
    "garbage": b"\xff\x00 not json \xfe",
    "a-list": b'["name", "a-list"]',
}
ERRORS = {
    "huge-lease": "invalid duration '99999999999d': longer than the limit of 10 years (3650d)",
    "far-future": "invalid created_at '9999-12-31T23:59:59+00:00': must lie between 1970-01-01 and 9000-01-01",
    "garbage": "listener registration is not valid JSON",
    "a-list": "a listener registration must be a JSON object with a name (a string), not ['name', 'a-list']",
}


def _write(settings: Settings, records: list[tuple[str, bytes | None]]) -> None:
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True}))
    for key, value in records:
        producer.produce(settings.registry_topic, value, key.encode())
    assert producer.flush(30) == 0


@pytest.fixture
def cli(cli_env: Settings) -> Any:
    runner = CliRunner()
    return lambda *args: runner.invoke(listeners_cli, list(args))


def test_bad_registrations_are_listed_described_and_removed(settings: Settings, topics: Any, cli: Any) -> None:
    good = register(settings, ListenerSpec(name="good", filter="value.amount > 1.0"))
    ensure_registry_topic(settings)
    _write(settings, [*BAD.items(),
                      (progress_key("good", 0), b"{not json"),       # ignored with a warning
                      ("good/status/w9", b"[]")])                    # ignored with a warning

    res = cli("list")
    assert res.exit_code == 0, res.output
    rows = {line.split()[0]: line for line in res.output.splitlines()}
    assert sorted(rows) == ["a-list", "far-future", "garbage", "good", "huge-lease"]
    for name, error in ERRORS.items():
        assert rows[name].split(None, 2)[1] == "invalid" and error in rows[name], rows[name]
    assert rows["good"].split(None, 2)[1] == "active"
    as_json = {r["name"]: r for r in map(json.loads, cli("list", "--json").output.splitlines())}
    assert as_json["huge-lease"]["state"] == "invalid" and ERRORS["huge-lease"] in as_json["huge-lease"]["error"]
    assert as_json["good"]["state"] == "active" and as_json["good"]["filter"] == good.filter

    res = cli("describe", "far-future")
    assert res.exit_code == 1
    assert f"error                  {ERRORS['far-future']}" in res.output
    assert "fix                    fifolane listeners remove far-future, then add it again" in res.output
    res = cli("describe", "garbage", "--json")
    assert res.exit_code == 1 and json.loads(res.output)["state"] == "invalid"
    assert cli("describe", "good").exit_code == 0

    for name in BAD:
        res = cli("remove", name)
        assert res.exit_code == 0, res.output
        assert res.output.startswith(f"listener {name!r} removed (it was an invalid registration: ")
    state = read_registry(settings)
    assert (sorted(state.listeners), state.invalid, state.progress) == (["good"], {}, {})
    res = cli("remove", "garbage")
    assert res.exit_code == 2 and "unknown listener 'garbage'" in res.output


def test_add_refuses_a_lease_over_the_bound(cli: Any) -> None:
    res = cli("add", "x", "--filter", "true", "--lease", "99999999999d")
    assert res.exit_code == 2
    assert res.output.strip() == ("error: invalid duration '99999999999d': longer than the limit of 10 years "
                                  "(3650d); for a listener that never expires, leave the lease out")


def test_suspensions_are_shown_per_worker(settings: Settings, topics: Any, cli: Any) -> None:
    spec = register(settings, ListenerSpec(name="slow", filter="value.amount > 1.0"))
    instance = spec.created_at.isoformat()
    at = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)

    def status(worker: str, inst: str) -> tuple[str, bytes]:
        return status_key("slow", worker), ListenerStatus(
            "slow", worker, "suspended", f"evaluation took too long on {worker}", inst, at).to_json()

    _write(settings, [status("w1", instance), status("w2", instance),
                      status("w3", "2020-01-01T00:00:00+00:00")])  # w3: an earlier instance, stale
    res = cli("list")
    assert res.exit_code == 0 and res.output.split(None, 2)[1:2] == ["suspended"], res.output
    assert "suspended on 2 worker(s)" in res.output
    res = cli("describe", "slow")
    lines = [line for line in res.output.splitlines() if line.startswith("suspended ")]
    assert lines == [f"suspended              worker={w} since={at.isoformat()} reason: evaluation took too long "
                     f"on {w}" for w in ("w1", "w2")]
    _write(settings, [(status_key("slow", "w1"), None)])  # the worker resumed it: tombstone
    d = json.loads(cli("describe", "slow", "--json").output)
    assert d["state"] == "suspended on 1 worker(s)" and [s["worker"] for s in d["suspended"]] == ["w2"]
    _write(settings, [(status_key("slow", "w2"), None)])
    assert json.loads(cli("describe", "slow", "--json").output)["state"] == "active"
