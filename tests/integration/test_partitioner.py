"""fifolane's partitioner is Java's: the Python murmur2, `fifolane produce` and a Java
KafkaProducer put every key on the same partition (real Kafka, the Kafka client jars)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from kafka_fixtures import consume_all
from worker_support import reservation

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.partitioner import murmur2, partition_for
from fifolane.produce import EventProducer
from fifolane.topics import create_topic

pytestmark = pytest.mark.integration

LIBS = PROJECT_ROOT / ".fifolane" / "kafka" / "libs"
JAVA = PROJECT_ROOT / "tests" / "java" / "Murmur2Partitions.java"
KEYS = [b"", b"a", b"ab", b"abc", b"abcd", b"F-100", "Flug-Zürich-7".encode(), bytes(range(256)),
        *(f"G{i}".encode() for i in range(200)), *(f"reservation/R-{i:05d}".encode() for i in range(50))]


def _java(*args: str) -> list[str]:
    out = subprocess.run(["java", "-cp", f"{LIBS}/*", str(JAVA), *args], capture_output=True, text=True,
                         timeout=180, check=True)
    return [line for line in out.stdout.splitlines() if line and not line.startswith("SLF4J")]


def test_murmur2_equals_java_utils(kafka_bootstrap: str) -> None:
    """Utils.murmur2 and the default partitioner's formula, key by key (the jars come with
    the session's Kafka)."""
    lines = _java("7", *(k.hex() or "-" for k in KEYS))
    assert len(lines) == len(KEYS)
    for key, line in zip(KEYS, lines, strict=True):
        hexkey, h, p = line.split()
        assert hexkey == (key.hex() or "-")
        assert murmur2(key) == int(h), key
        assert partition_for(key, 7) == int(p), key


def test_fifolane_produce_and_java_producer_agree(settings: Settings, topics: Any) -> None:
    """Groups sent by EventProducer land where a Java producer sends the same keys."""
    groups = [f"F-{i}" for i in range(60)] + ["Flug-Zürich-7"]
    with EventProducer(settings, source="partitioner-test") as producer:
        for i, g in enumerate(groups):
            producer.send("reservation", reservation(f"R{i}", g, 1))
    ours = {m.key().decode(): m.partition() for m in consume_all(settings, settings.input_topic)}
    assert set(ours) == set(groups)
    java_topic = settings.input_topic + ".java"
    create_topic(settings, java_topic, settings.partitions, {})
    lines = _java(str(settings.partitions), settings.resolved_bootstrap(), java_topic,
                  *(g.encode().hex() for g in groups))
    sent = {bytes.fromhex(k).decode(): int(p) for tag, k, p in (ln.split() for ln in lines if ln.startswith("sent "))}
    assert sent == ours
    assert ours == {g: partition_for(g, settings.partitions) for g in groups}
