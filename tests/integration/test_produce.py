"""``fifolane produce`` against a real broker: keys, headers, both wire formats, bad lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kafka_fixtures import consume_all

from fifolane.config import Settings
from fifolane.serde import SchemaCatalog, SingleObjectCodec
from fifolane.serde.confluent import ConfluentCodec, RegistryClient
from fifolane.serde.fake_registry import FakeSchemaRegistry

pytestmark = pytest.mark.integration

LINES = [
    {"reservation_id": "R-1", "flight_number": "LX1", "customer_id": "C-1", "seats": 1, "amount": 10.0,
     "state": "NEW", "version": 1},
    {"reservation_id": "R-2", "flight_number": "LX2", "customer_id": "C-2", "seats": "two", "amount": 20.0,
     "state": "NEW", "version": 1},
    {"reservation_id": "R-3", "flight_number": "LX2", "customer_id": "C-3", "seats": 3, "amount": 30.0,
     "state": "CONFIRMED", "version": 2},
    {"reservation_id": "R-1", "flight_number": "LX1", "version": 5, "op": "delete"},
]


def _run_produce(settings: Settings, file: Path, registry_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    env.update({
        "FIFOLANE_BOOTSTRAP_SERVERS": settings.resolved_bootstrap(),
        "FIFOLANE_INPUT_TOPIC": settings.input_topic,
        "FIFOLANE_HOME": str(settings.home),
    })
    if registry_url:
        env["FIFOLANE_SCHEMA_REGISTRY_URL"] = registry_url
    return subprocess.run(
        [sys.executable, "-c", "from fifolane.cli import main; main()",
         "produce", "reservation", str(file), "--source", "itest"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )


def _check_records(records: list[Any], decode: Any) -> None:
    by_key: dict[bytes, list[Any]] = {}
    for msg in records:
        by_key.setdefault(msg.key(), []).append(msg)
    assert sorted(by_key) == [b"LX1", b"LX2"]  # key = the FIFO-group value
    seqs = []
    for msg in records:
        headers = dict(msg.headers())
        assert headers["fifolane.source"] == b"itest"
        seqs.append(int(headers["fifolane.seq"]))
        decoded = decode(msg.value())
        assert str(decoded.group).encode() == msg.key()
    assert sorted(seqs) == [0, 1, 2]
    # within a group (one partition) records keep their send order
    lx1 = [decode(m.value()) for m in sorted(by_key[b"LX1"], key=lambda m: m.offset())]
    assert [(d.is_delete, d.key, d.version) for d in lx1] == [(False, "R-1", 1), (True, "R-1", 5)]
    lx2 = [decode(m.value()) for m in by_key[b"LX2"]]
    assert [d.record for d in lx2] == [LINES[2]]


@pytest.fixture
def events_file(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in LINES) + "\n")
    return path


def test_produce_single_object(settings: Settings, topics: Any, events_file: Path) -> None:
    result = _run_produce(settings, events_file)
    assert result.returncode == 1, result.stderr
    assert f"{events_file}:2: field 'seats': expected int, got 'two'" in result.stderr
    assert "sent 3 reservation event(s)" in result.stderr
    assert "1 line(s) failed and were not sent" in result.stderr
    records = consume_all(settings, settings.input_topic)
    assert len(records) == 3
    _check_records(records, SingleObjectCodec(SchemaCatalog.load()).decode)


def test_produce_confluent(settings: Settings, topics: Any, events_file: Path) -> None:
    registry = FakeSchemaRegistry()
    with registry.serve() as url:
        result = _run_produce(settings, events_file, registry_url=url)
        assert result.returncode == 1, result.stderr
        assert sorted(registry.subjects) == ["fifolane.Delete", "fifolane.flights.Reservation"]
        records = consume_all(settings, settings.input_topic)
        assert all(m.value()[0] == 0 for m in records)
        codec = ConfluentCodec(SchemaCatalog.load(), RegistryClient(url))
        _check_records(records, codec.decode)
        codec.registry.close()


def test_produce_all_valid_exits_zero_and_restart_jumps(settings: Settings, topics: Any, tmp_path: Path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text(json.dumps(LINES[0]) + "\n")
    for _ in range(2):
        result = _run_produce(settings, path)
        assert result.returncode == 0, result.stderr
    seqs = sorted(int(dict(m.headers())["fifolane.seq"]) for m in consume_all(settings, settings.input_topic))
    assert seqs == [0, 1_000_000]
