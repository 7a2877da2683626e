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
    assert f"{events_file}: line 2: field 'seats': expected int, got 'two'" in result.stderr
    assert "delivered 3 of 3 reservation event(s) sent" in result.stderr
    assert "1 line(s) skipped, not sent" in result.stderr
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


def test_produce_skips_every_kind_of_bad_line(settings: Settings, topics: Any, tmp_path: Path) -> None:
    """Each bad line is reported as `line N: ...` and skipped; the good lines around it are sent."""
    def good(n: int, op: str = "upsert") -> bytes:
        record = {**LINES[0], "reservation_id": f"R-{n}", "version": n}
        if op == "delete":
            record = {"reservation_id": f"R-{n}", "flight_number": "LX1", "version": n, "op": "delete"}
        return json.dumps(record).encode()

    lines = [
        good(1),
        b'{"reservation_id": "R-2",',                                   # 2 invalid JSON
        good(3),
        b"[" * 50_000 + b"]" * 50_000,                                   # 4 RecursionError
        good(5),
        json.dumps({**LINES[1], "reservation_id": "R-6"}).encode(),      # 6 seats "two"
        json.dumps({**LINES[0], "reservation_id": "R-7", "customer_id": "x" * 1_100_000}).encode(),  # 7 > 1 MB
        b'{"reservation_id": "R-8\xe9"}',                               # 8 latin-1, not UTF-8
        good(9, "delete"),
        b"",                                                             # blank: ignored
        good(11),
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = _run_produce(settings, path)
    assert result.returncode == 1, result.stderr
    reported = sorted(int(line.split(": line ")[1].split(":")[0]) for line in result.stderr.splitlines()
                      if line.startswith(f"{path}: line "))
    assert reported == [2, 4, 6, 7, 8]
    assert f"{path}: line 2: invalid JSON: " in result.stderr
    assert f"{path}: line 4: invalid JSON: nested too deeply" in result.stderr
    assert f"{path}: line 6: field 'seats': expected int, got 'two'" in result.stderr
    assert f"{path}: line 7: the encoded record is about 1,100," in result.stderr
    assert "over the producer's message.max.bytes (1,000,000)" in result.stderr
    assert f"{path}: line 8: not valid UTF-8 (byte 24 of the line)" in result.stderr
    assert "delivered 5 of 5 reservation event(s) sent" in result.stderr and "5 line(s) skipped, not sent" in result.stderr
    decode = SingleObjectCodec(SchemaCatalog.load()).decode
    got = sorted((d.key, d.version, d.is_delete) for d in (decode(m.value())
                 for m in consume_all(settings, settings.input_topic)))
    assert got == [("R-1", 1, False), ("R-11", 11, False), ("R-3", 3, False), ("R-5", 5, False),
                   ("R-9", 9, True)]
