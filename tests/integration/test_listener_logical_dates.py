"""A listener reading an Avro ``date`` field (the flight's ``departure``) registers, and the
worker keeps running and notifies it with the date as an ISO string; a listener failing on
the same changes is reported failing with one error per change (real Kafka, an in-process
worker)."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from click.testing import CliRunner
from kafka_fixtures import consume_all, wait_until
from worker_support import WorkerThread, send_events

from fifolane.cli.listeners import listeners as listeners_cli
from fifolane.config import Settings
from listeners.runtime import ListenerRuntime

pytestmark = pytest.mark.integration

#: divides by zero for a flight of 120 seats, on the old and on the new state alike
DIV = "10 / (value.capacity - 120) == 1"


def flight(number: str, day: datetime.date, version: int, capacity: int = 120) -> dict[str, Any]:
    return {"flight_number": number, "origin": "DXB", "destination": "FRA", "departure": day,
            "capacity": capacity, "version": version}  # fmt: skip


@pytest.fixture
def cli(cli_env: Settings, topics: dict[str, Any]) -> CliRunner:
    return CliRunner()


def test_date_listeners_are_notified_and_a_failing_one_does_not_stop_the_worker(
    settings: Settings, cli: CliRunner
) -> None:
    for name, args in (
        ("all", ["--filter", "true", "--convert", "value"]),
        ("dep", ["--filter", "value.departure != null", "--convert", '{"dep": value.departure}']),
        ("late", ["--filter", 'value.departure >= "2026-12-02"', "--convert", '{"old": old, "dep": value.departure}']),
        ("div", ["--filter", DIV]),
    ):
        res = cli.invoke(listeners_cli, ["add", name, "--type", "flight", *args])
        assert res.exit_code == 0, res.output
    refused = cli.invoke(listeners_cli, ["add", "ts", "--type", "flight", "--filter",
                                         'value.departure > timestamp("2026-01-01T00:00:00Z")'])  # fmt: skip
    assert refused.exit_code == 2 and "cannot compare value.departure (a string) and timestamp" in refused.stderr
    rt = ListenerRuntime(settings)
    with WorkerThread(settings, worker_id="w1", listeners=rt) as w:
        wait_until(lambda: rt.names() == ["all", "dep", "div", "late"], message=lambda: str(rt.names()))
        send_events(settings, [
            ("flight", flight("AF1000", datetime.date(2026, 12, 1), 1), "upsert"),
            ("flight", flight("AF1000", datetime.date(2026, 12, 2), 2), "upsert"),
            ("flight", flight("BA1001", datetime.date(2026, 12, 3), 1, capacity=90), "upsert"),
        ])  # fmt: skip

        def notes() -> list[dict[str, Any]]:
            return [json.loads(m.value()) for m in consume_all(settings, settings.listener_output_topic, timeout=2.0)]

        got = wait_until(lambda: (n if len(n := notes()) >= 8 else None), interval=0.5,
                         message=lambda: str(notes()))  # fmt: skip
        failing = wait_until(lambda: (d if (d := json.loads(cli.invoke(
            listeners_cli, ["describe", "div", "--json"]).stdout))["failing"] else None),
            interval=0.5, message="no failing status for 'div'")  # fmt: skip
        assert w.thread.is_alive() and w.error is None
        assert (rt.stats("all").errors, rt.stats("dep").errors, rt.stats("late").errors) == (0, 0, 0)
        # AF1000 twice (the old state and the new one fail, one error each change), BA1001 not at all
        assert rt.stats("div").errors == 2
        assert failing["state"] == "failing on 1 worker(s)"
        # The first record may come between the two changes (they may fall in two transactions);
        # the next waits for the 5 s interval: 1 or 2, never more, on w1 only.
        assert [f["worker"] for f in failing["failing"]] == ["w1"] and failing["failing"][0]["errors"] in (1, 2)
        assert "ZeroDivisionError" in failing["failing"][0]["last_error"]
    rt.close()
    got = [json.loads(m.value()) for m in consume_all(settings, settings.listener_output_topic)]
    by = sorted((n["listener"], n["key"], n["kind"], json.dumps(n["value"], sort_keys=True)) for n in got)
    f1 = {"flight_number": "AF1000", "origin": "DXB", "destination": "FRA", "capacity": 120}
    assert by == sorted([
        ("all", "AF1000", "created", json.dumps({**f1, "departure": "2026-12-01", "version": 1}, sort_keys=True)),
        ("all", "AF1000", "modified", json.dumps({**f1, "departure": "2026-12-02", "version": 2}, sort_keys=True)),
        ("all", "BA1001", "created", json.dumps({**f1, "flight_number": "BA1001", "capacity": 90,
                                                 "departure": "2026-12-03", "version": 1}, sort_keys=True)),
        ("dep", "AF1000", "created", json.dumps({"dep": "2026-12-01"})),
        ("dep", "AF1000", "modified", json.dumps({"dep": "2026-12-02"})),
        ("dep", "BA1001", "created", json.dumps({"dep": "2026-12-03"})),
        ("late", "AF1000", "created", json.dumps({"dep": "2026-12-02", "old": {
            **f1, "departure": "2026-12-01", "version": 1}}, sort_keys=True)),
        ("late", "BA1001", "created", json.dumps({"dep": "2026-12-03", "old": None}, sort_keys=True)),
    ])  # fmt: skip
