"""The CLI against a real broker (with automatic topic creation, as the local dev cluster
has it): produce refuses a missing input topic without creating it, a wrong bootstrap
server is one clear line within seconds, topics create warns about a 1-partition input."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka_fixtures import wait_until

from fifolane.config import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
FLIGHT = {"flight_number": "LX1", "origin": "ZRH", "destination": "JFK", "departure": "2026-12-01",
          "capacity": 3, "version": 1}


def _cli(settings: Settings, *args: str, bootstrap: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    env.update({
        "FIFOLANE_BOOTSTRAP_SERVERS": bootstrap or settings.resolved_bootstrap(),
        "FIFOLANE_HOME": str(settings.home),
        **{f"FIFOLANE_{role.upper()}_TOPIC": getattr(settings, f"{role}_topic")
           for role in ("input", "state", "registry", "dlq", "listener_output", "directory", "parked",
                        "members")},
    })
    return subprocess.run([sys.executable, "-c", "from fifolane.cli import main; main()", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


def _topics(settings: Settings) -> set[str]:
    return set(AdminClient(settings.kafka_config()).list_topics(timeout=10).topics)


def test_produce_refuses_a_missing_input_topic_and_does_not_create_it(settings: Settings, tmp_path: Path) -> None:
    events = tmp_path / "flights.jsonl"
    events.write_text(json.dumps(FLIGHT) + "\n")
    result = _cli(settings, "produce", "flight", str(events))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: the input topic {settings.input_topic} does not exist on {settings.resolved_bootstrap()}: "
        f"run `fifolane topics create` first (or set FIFOLANE_INPUT_TOPIC to the topic to use)")
    assert settings.input_topic not in _topics(settings)  # not auto-created behind our back


def test_produce_after_topics_create_reports_deliveries(settings: Settings, tmp_path: Path) -> None:
    events = tmp_path / "flights.jsonl"
    events.write_text(json.dumps(FLIGHT) + "\n" + json.dumps({**FLIGHT, "capacity": float("nan")}) + "\n")
    assert _cli(settings, "topics", "create", "--partitions", "2").returncode == 0
    result = _cli(settings, "produce", "flight", str(events))
    assert result.returncode == 1, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if "compiled modules" not in ln]
    assert lines == [
        f"{events}: line 2: invalid JSON: NaN is not a finite number (JSON has no NaN or Infinity); "
        f"use a number or null",
        f"delivered 1 of 1 flight event(s) sent to {settings.input_topic} (source cli-{socket.gethostname()}); "
        f"1 line(s) skipped, not sent (reported above)",
    ]


@pytest.mark.parametrize("command", [("topics", "describe"), ("topics", "create"), ("produce", "flight")])
def test_a_wrong_bootstrap_server_is_one_clear_line_within_seconds(
        settings: Settings, tmp_path: Path, command: tuple[str, ...]) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    events = tmp_path / "flights.jsonl"
    events.write_text(json.dumps(FLIGHT) + "\n")
    args = (*command, str(events)) if command[0] == "produce" else command
    started = time.monotonic()
    result = _cli(settings, *args, bootstrap=f"127.0.0.1:{port}")
    took = time.monotonic() - started
    assert result.returncode == 2
    lines = [ln for ln in result.stderr.splitlines() if "compiled modules" not in ln]
    assert len(lines) == 1, result.stderr  # no %3|...|FAIL| flood
    assert lines[0].startswith(f"error: cannot reach Kafka at 127.0.0.1:{port}: no broker answered within 5s "
                               f"(Connect to ipv4#127.0.0.1:{port} failed: Connection refused); ")
    assert "FIFOLANE_BOOTSTRAP_SERVERS" in lines[0]
    assert took < 15


def test_topics_create_warns_about_an_input_topic_of_another_partition_count(settings: Settings) -> None:
    admin = AdminClient(settings.kafka_config())
    admin.create_topics([NewTopic(settings.input_topic, 1, 1)])[settings.input_topic].result(30)
    result = _cli(settings, "topics", "create")
    assert result.returncode == 0, result.stderr
    assert f"exists  input            {settings.input_topic} (1 partitions" in result.stdout
    warning = [ln for ln in result.stderr.splitlines() if ln.startswith("warning: the input topic")]
    assert len(warning) == 1
    assert warning[0].startswith(
        f"warning: the input topic {settings.input_topic} exists with 1 partition(s), not the configured "
        f"{Settings.model_fields['partitions'].default} (FIFOLANE_PARTITIONS), and ")
    assert "--partitions 1 (or FIFOLANE_PARTITIONS=1)" in warning[0]
    confirmed = _cli(settings, "topics", "create", "--partitions", "1")
    assert confirmed.returncode == 0 and "warning: the input topic" not in confirmed.stderr


def test_topics_create_warns_about_a_members_topic_that_heartbeats_would_grow(settings: Settings) -> None:
    """A members topic made before the heartbeats (or by hand) rolls its segments weekly: the
    heartbeats (one a second per worker) would pile up until then, since compaction cleans
    only rolled segments. `topics create` makes it with hourly segments, and says how to fix
    an older one (never altering it silently)."""
    admin = AdminClient(settings.kafka_config())
    admin.create_topics([NewTopic(settings.members_topic, 1, 1, config={"cleanup.policy": "compact"})]
                        )[settings.members_topic].result(30)
    result = _cli(settings, "topics", "create")
    assert result.returncode == 0, result.stderr
    warning = [ln for ln in result.stderr.splitlines() if ln.startswith("warning: the members topic")]
    assert warning == [f"warning: the members topic {settings.members_topic} rolls its segments every 7 day(s): "
                       "the workers' heartbeats (one a second each) are compacted only in rolled segments, so it "
                       "grows until then; fix: kafka-configs.sh --alter --entity-type topics --entity-name "
                       f"{settings.members_topic} --add-config segment.ms=3600000"], result.stderr
    admin.delete_topics([settings.members_topic])[settings.members_topic].result(30)
    wait_until(lambda: settings.members_topic not in _topics(settings), timeout=30, interval=0.2)
    made = _cli(settings, "topics", "create")
    assert made.returncode == 0 and "warning: the members topic" not in made.stderr, made.stderr
    assert f"created members          {settings.members_topic}" in made.stdout, made.stdout
