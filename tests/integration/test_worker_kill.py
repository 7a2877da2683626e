"""SIGKILL mid-stream, restart, scale out and in: the committed result equals one clean run."""

from __future__ import annotations

import json
import random
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kafka_fixtures import consume_all, wait_until
from worker_support import CATALOG, WorkerProcess, read_table, reservation

from fifolane.config import Settings
from fifolane.serde import make_codec
from fifolane.topics import create_topic

pytestmark = pytest.mark.integration

GROUPS, ENTITIES, EVENTS = 40, 300, 6000


def _stream(settings: Settings, audit: str, stop_at: threading.Event) -> tuple[list[tuple[str, int, bool]], dict[str, Any]]:
    """Produce EVENTS events slowly; returns the sent (group, seq) list and the reference table."""
    rng = random.Random(11)
    codec = make_codec(settings, CATALOG)
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all", "linger.ms": 2}))
    versions: dict[str, int] = defaultdict(int)
    reference: dict[str, tuple[int, bool]] = {}
    sent = []
    group_seq: dict[str, int] = defaultdict(int)
    for i in range(EVENTS):
        e = rng.randrange(ENTITIES)
        rid, group = f"R{e}", f"F{e % GROUPS}"
        versions[rid] += rng.choice([1, 1, 2])
        v = versions[rid]
        if rng.random() < 0.1:
            v = max(1, v - 3)  # a stale, out-of-order update
        delete = rng.random() < 0.08
        if delete:
            value = codec.encode_delete("reservation", rid, group, v)
        else:
            value = codec.encode("reservation", reservation(rid, group, v, seats=v))
        seq = group_seq[group]
        group_seq[group] += 1
        producer.produce(settings.input_topic, value, group.encode(), headers=[("test.seq", str(seq).encode())])
        cur = reference.get(rid)
        fresh = cur is None or v > cur[0]
        if fresh:
            reference[rid] = (v, not delete)
        sent.append((group, seq, fresh))
        if i % 200 == 0:
            producer.flush(10)
            stop_at.wait(0.05)  # pace the stream so kills land mid-stream
    assert producer.flush(30) == 0
    return sent, reference


def test_sigkill_restart_and_scaling_keep_exactly_once(settings: Settings, topics: Any, tmp_path: Path) -> None:
    audit = settings.input_topic + ".audit"
    create_topic(settings, audit, settings.partitions, {})
    procs = [WorkerProcess(settings, f"w{i}", tmp_path, app="apps.audit:app", extra=["--concurrency", "8"])
             for i in (1, 2, 3)]
    env_extra = {"AUDIT_TOPIC": audit}
    for p in procs:
        base_env = p.env
        p.env = (lambda be=base_env: {**be(), **env_extra})  # type: ignore[method-assign]
    w1, w2, w3 = procs
    w1.start()
    w2.start()
    result: dict[str, Any] = {}
    done = threading.Event()
    producer_thread = threading.Thread(target=lambda: result.update(zip(("sent", "ref"), _stream(settings, audit, done), strict=True)))
    producer_thread.start()
    try:
        def audited() -> int:
            return len(consume_all(settings, audit))

        wait_until(lambda: audited() > 800, timeout=90, message="first audits")
        w1.kill()  # SIGKILL mid-stream
        w1.start()
        wait_until(lambda: audited() > 2500, timeout=90, message="audits after restart")
        w3.start()  # scale out under load
        wait_until(lambda: audited() > 3500, timeout=90, message="audits after scale-out")
        w2.kill()
        w2.start()
        wait_until(lambda: audited() > 4500, timeout=90, message="audits after second kill")
        assert w3.terminate() == 0  # scale in
        producer_thread.join(120)
        sent, reference = result["sent"], result["ref"]

        # Every event is accounted for exactly once: handled (audited), or dropped as stale.
        def settled() -> bool:
            table = read_table(settings)
            return all((table.get(f"reservation/{rid}", (0, None))[0] == v) for rid, (v, _p) in reference.items())

        wait_until(settled, timeout=120, message=lambda: f"table converged; logs:\n{w1.log_tail()}\n{w2.log_tail()}")
    finally:
        for p in procs:
            if p.alive():
                p.kill()
    table = read_table(settings)
    for rid, (version, present) in reference.items():
        got_version, record = table[f"reservation/{rid}"]
        assert got_version == version, rid
        assert (record is not None) == present, rid
    audits = [json.loads(m.value()) for m in consume_all(settings, audit)]
    seen = [(a["group"], a["seq"]) for a in audits]
    assert len(seen) == len(set(seen)), "an effect was committed twice"
    per_group: dict[str, list[int]] = defaultdict(list)
    for a in audits:
        per_group[a["group"]].append(a["seq"])
    for group, seqs in per_group.items():
        assert seqs == sorted(seqs), f"group {group} out of order"
    # Exactly the events that were newer than their entity's state were handled; the stale
    # ones were dropped: nothing lost, nothing extra.
    expected = {(g, s) for g, s, fresh in sent if fresh}
    assert set(seen) == expected
    assert len(expected) < len(sent)  # the stream did contain stale events
