"""Listeners that can never work are refused by the CLI before anything reaches the registry;
one that fails at run time shows up as failing in ``fifolane listeners describe`` (real Kafka,
an in-process worker)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from kafka_fixtures import consume_all, wait_until
from worker_support import WorkerThread, reservation, send_events

from fifolane.cli.listeners import listeners as listeners_cli
from fifolane.config import Settings
from listeners.registry import list_listeners
from listeners.runtime import ListenerRuntime

pytestmark = pytest.mark.integration

#: passes the registration checks, but a reservation of one seat divides by zero (a double
#: division: Infinity, which JSON cannot carry) and one of two seats makes a NaN
INF = '{"id": value.reservation_id, "per_other_seat": value.amount / double(value.seats - 1)}'
#: an int division by zero at run time
DIV = '{"id": value.reservation_id, "n": 10 / (value.seats - 1)}'


@pytest.fixture
def cli(cli_env: Settings, topics: dict[str, Any]) -> CliRunner:
    return CliRunner()


def test_the_cli_refuses_an_unknown_field_and_writes_nothing(settings: Settings, cli: CliRunner) -> None:
    res = cli.invoke(listeners_cli, ["add", "typo", "--type", "reservation", "--filter", "value.amout > 3.0"])
    assert res.exit_code == 2
    assert res.stderr == (
        "error: invalid filter: unknown field 'amout': reservation records have no such field; did you mean "
        "'amount'? (fields: amount, customer_id, flight_number, reservation_id, seats, state, version) "
        "(at offset 6)\n  value.amout > 3.0\n        ^\n")
    res = cli.invoke(listeners_cli, ["add", "typo", "--type", "reservatoin", "--filter", "true"])
    assert res.exit_code == 2 and res.stderr.startswith("error: unknown entity type 'reservatoin'; did you mean")
    assert consume_all(settings, settings.registry_topic, timeout=5.0) == []
    assert list_listeners(settings) == []


def test_a_converter_failing_at_run_time_shows_in_describe(settings: Settings, cli: CliRunner) -> None:
    for name, convert in (("inf", INF), ("div", DIV), ("good", None)):
        args = ["add", name, "--type", "reservation", "--filter", "value.amount > 1.0"]
        res = cli.invoke(listeners_cli, args + (["--convert", convert] if convert else []))
        assert res.exit_code == 0, res.output
    rt = ListenerRuntime(settings)
    with WorkerThread(settings, worker_id="w1", listeners=rt):
        wait_until(lambda: rt.names() == ["div", "good", "inf"], message=lambda: str(rt.names()))
        send_events(settings, [("reservation", reservation("R1", "F1", 1, seats=1, amount=50.0), "upsert")])

        def described(name: str) -> dict[str, Any] | None:
            res = cli.invoke(listeners_cli, ["describe", name, "--json"])
            assert res.exit_code == 0, res.output
            d: dict[str, Any] = json.loads(res.stdout)
            return d if d["failing"] else None

        inf = wait_until(lambda: described("inf"), interval=0.5, message="no failing status for 'inf'")
        div = wait_until(lambda: described("div"), interval=0.5, message="no failing status for 'div'")
        assert (inf["state"], div["state"]) == ("failing on 1 worker(s)", "failing on 1 worker(s)")
        assert [(f["worker"], f["errors"], f["last_error"]) for f in inf["failing"]] == [(
            "w1", 1, f"converter {INF!r} failed: NonFiniteError: [\"per_other_seat\"] is inf, which JSON cannot "
            "carry; the change is not notified")]
        assert [(f["worker"], f["errors"]) for f in div["failing"]] == [("w1", 1)]
        assert "ZeroDivisionError" in div["failing"][0]["last_error"]
        good = json.loads(cli.invoke(listeners_cli, ["describe", "good", "--json"]).stdout)
        assert (good["state"], good["failing"]) == ("active", [])
        listed = [json.loads(line) for line in cli.invoke(listeners_cli, ["list", "--json"]).stdout.splitlines()]
        assert [(r["name"], r["state"]) for r in listed] == [
            ("div", "failing on 1 worker(s)"), ("good", "active"), ("inf", "failing on 1 worker(s)")]
        assert (rt.stats("inf").errors, rt.stats("div").errors, rt.stats("good").errors) == (1, 1, 0)
    rt.close()
    notes = [json.loads(m.value()) for m in consume_all(settings, settings.listener_output_topic)]
    assert [(n["listener"], n["key"], n["kind"]) for n in notes] == [("good", "R1", "created")]
