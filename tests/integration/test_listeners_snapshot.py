"""Include-current-state: a listener registered mid-stream, its worker SIGKILLed during the
snapshot and restarted; the client's materialized view equals the filtered, converted table."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from kafka_fixtures import wait_until
from worker_support import WorkerProcess, read_table, reservation, send_events

from fifolane.config import Settings
from listeners.client import ListenerClient, MaterializedView
from listeners.model import ListenerSpec
from listeners.registry import Progress, parse_progress_key, read_registry, register

pytestmark = pytest.mark.integration

ENTITIES = 24_000  # ~8,000 per partition: several snapshot chunks of ~1,700
FILTER = "value.amount > 100.0"
CONVERT = '{"id": value.reservation_id, "seats": value.seats}'


def _amount(i: int, v: int) -> float:
    return float((i * 37 + v * 11) % 200)


def _batch(start: int, stop: int, version: int) -> list[tuple[str, dict[str, Any], str]]:
    out = []
    for i in range(start, stop):
        op = "delete" if (i + version) % 13 == 0 and version > 1 else "upsert"
        rec = reservation(f"R{i}", f"F{i % 50}", version, seats=version, amount=_amount(i, version))
        out.append(("reservation", rec, op))
    return out


def _first_progress(settings: Settings, name: str, stop: threading.Event) -> Progress | None:
    """Follow the registry until a committed, unfinished snapshot progress record shows up."""
    c = Consumer(settings.kafka_config(**{"group.id": f"t-{uuid.uuid4().hex}",
                                          "isolation.level": "read_committed"}))  # fmt: skip
    c.assign([TopicPartition(settings.registry_topic, 0, OFFSET_BEGINNING)])
    try:
        while not stop.is_set():
            msg = c.poll(0.05)
            if msg is None or msg.error() is not None:
                continue
            key, value = msg.key(), msg.value()
            if key is None or value is None:
                continue
            pk = parse_progress_key(key.decode())
            if pk is not None and pk[0] == name:
                p = Progress.from_json(value)
                if not p.done:
                    return p
        return None
    finally:
        c.close()


def test_include_current_state_survives_a_kill(settings: Settings, topics: dict[str, Any],
                                               tmp_path: Path) -> None:  # fmt: skip
    send_events(settings, _batch(0, ENTITIES, 1))
    proc = WorkerProcess(settings, "snap-w1", tmp_path).start()
    try:
        wait_until(lambda: proc.snapshot().get("processed", 0) >= ENTITIES, timeout=40,
                   message=lambda: f"{proc.snapshot()} {proc.log_tail()}")  # fmt: skip
        # Mid-stream: updates keep flowing while the listener registers and snapshots.
        sender = threading.Thread(target=send_events, args=(settings, _batch(0, 3000, 2)))
        sender.start()
        spec = register(settings, ListenerSpec(name="view", filter=FILTER, convert=CONVERT,
                                               include_current_state=True))  # fmt: skip
        stop = threading.Event()
        progress = _first_progress(settings, "view", stop)
        assert progress is not None and progress.sent > 0
        proc.kill()  # during the snapshot: the chunk in flight is aborted
        sender.join(30)
        proc.start()
        send_events(settings, _batch(1000, 6000, 3))
        expected_rows = 6000 - 1000
        # The table settles: every key at its last version.
        last = {f"reservation/R{i}": 3 for i in range(1000, 6000)}
        last.update({f"reservation/R{i}": 2 for i in range(0, 1000)})

        def settled() -> dict[str, Any] | None:
            table = read_table(settings)
            ok = all(table.get(k, (0, None))[0] == v for k, v in last.items())
            return table if ok and len(table) == ENTITIES else None

        table = wait_until(settled, timeout=40, message=lambda: proc.log_tail())
        expected = {
            k: {"id": rec["reservation_id"], "seats": rec["seats"]}
            for k, (_v, rec) in table.items() if rec is not None and rec["amount"] > 100.0
        }  # fmt: skip
        assert expected_rows and len(expected) > 5000
        view = MaterializedView()
        versions: dict[str, list[int]] = {}
        announced: list[str] = []  # keys of snapshot notifications
        with ListenerClient(settings, "view", from_beginning=True, spec=spec) as client:

            def caught_up() -> bool:
                for note in client.poll(0.5):
                    view.apply(note)
                    versions.setdefault(note["key"], []).append(note["version"])
                    if note.get("snapshot"):
                        announced.append(note["key"])
                return view.data == expected

            wait_until(caught_up, timeout=40,
                       message=lambda: f"view {len(view.data)} vs {len(expected)} "
                                       f"{proc.log_tail()}")  # fmt: skip
            assert client.gaps == [] and client.duplicates == 0
        # The resumed snapshot repeated nothing; per key, notifications follow the updates.
        assert len(announced) == len(set(announced)) > progress.sent
        assert all(vs == sorted(set(vs)) for vs in versions.values())
        state = read_registry(settings)
        assert sorted(p for (n, p), pr in state.progress.items() if n == "view" and pr.done) == [0, 1, 2]
        assert proc.runs == 2
    finally:
        if proc.alive():
            proc.terminate()
