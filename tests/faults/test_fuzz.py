"""Bad input: the decode path and the expression compiler never crash, and a real worker
dead-letters every bad record (with its reason) while processing all valid traffic.

The soak mixes random bytes, truncated Avro, wrong schema fingerprints, huge records,
missing keys and null values into a valid stream: 2,000 records (``--long``: 10,000).
"""

from __future__ import annotations

import random
import string
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from kafka_fixtures import consume_all
from worker_support import CATALOG, WorkerThread, wait_accounted

from fifolane.config import Settings
from fifolane.errors import ExpressionError, SerializationError, UnknownSchemaError
from fifolane.serde import make_codec
from fifolane.serde.codec import SINGLE_OBJECT_MAGIC, SingleObjectCodec
from fifolane.testing import KINDS, History, ProducedEvent, check_history
from fifolane.testing.records import table_from
from fifolane.testing.workload import SEQ_HEADER, Workload, reservation
from listeners.expr import compile_converter, compile_filter

pytestmark = pytest.mark.faults

CODEC = SingleObjectCodec(CATALOG)
ZERO = dict.fromkeys(KINDS, 0)
PREFIXES = [SINGLE_OBJECT_MAGIC + CODEC._encoders[name][0][2:] for name in sorted(CODEC._encoders)]


def decode_outcome(data: bytes) -> str:
    """``ok``, or the fifolane error it raised; anything else propagates (a crash)."""
    try:
        CODEC.decode(data)
    except UnknownSchemaError:
        return "unknown-schema"
    except SerializationError:
        return "undecodable"
    return "ok"


reservations = st.builds(
    reservation, st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
)


@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_codec(data: bytes) -> None:
    assert decode_outcome(data) in ("ok", "undecodable", "unknown-schema")


@given(st.sampled_from(PREFIXES), st.binary(max_size=200))
def test_known_fingerprint_with_a_random_body(prefix: bytes, body: bytes) -> None:
    assert decode_outcome(prefix + body) in ("ok", "undecodable", "unknown-schema")


@given(reservations, st.data())
def test_truncated_avro_is_undecodable(record: dict[str, Any], data: st.DataObject) -> None:
    encoded = CODEC.encode("reservation", record)
    assert CODEC.decode(encoded).record == record
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    assert decode_outcome(encoded[:cut]) == "undecodable"


@given(reservations, st.binary(min_size=8, max_size=8))
def test_unknown_fingerprint_is_an_unknown_schema(record: dict[str, Any], fingerprint: bytes) -> None:
    encoded = CODEC.encode("reservation", record)
    if SINGLE_OBJECT_MAGIC + fingerprint in PREFIXES:
        return
    with pytest.raises(UnknownSchemaError):
        CODEC.decode(SINGLE_OBJECT_MAGIC + fingerprint + encoded[10:])


CEL_TOKENS = ["value", "old", "key", "meta", "kind", ".", "amount", "state", "version", "==", "!=", "<",
              ">=", "&&", "||", "!", "+", "-", "*", "/", "%", "(", ")", "[", "]", "{", "}", ",", ":", "?",
              "in", "size", "has", "1", "2.5", "-3", '"C"', "'x'", "true", "false", "null", "b\"\"", "u",
              "1u", "0x1F", "\\", "\n", "'''", '"', "`", "#", "@", "$", "😀"]
expressions = st.one_of(
    st.text(max_size=60),
    st.lists(st.sampled_from(CEL_TOKENS), max_size=25).map(" ".join),
    st.lists(st.sampled_from(CEL_TOKENS), max_size=25).map("".join),
)


@hsettings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(expressions)
def test_expressions_compile_or_raise_expression_error(src: str) -> None:
    for compile_ in (compile_filter, compile_converter):
        try:
            compile_(src)
        except ExpressionError as exc:
            assert exc.position is None or 0 <= exc.position <= len(src), (src, exc.position)


# --- soak against a real worker -------------------------------------------------------------
BAD_KINDS = {  # kind -> the dead-letter reason it must get
    "random-bytes": "undecodable",
    "truncated-avro": "undecodable",
    "wrong-fingerprint": "unknown-schema",
    "huge-garbage": "undecodable",
    "null-value": "undecodable",
    "no-record-key": "missing-group",
    "wrong-record-key": "missing-group",
    "empty-entity-key": "missing-key",
    "empty-group": "missing-group",
}


def bad_record(kind: str, rng: random.Random, group: str) -> tuple[bytes | None, bytes | None]:
    """(key, value) of one bad record of ``kind``."""
    rid = "".join(rng.choices(string.ascii_letters, k=6))
    good = CODEC.encode("reservation", reservation(rid, group, rng.randrange(1, 100)))
    if kind == "random-bytes":
        return group.encode(), bytes([rng.randrange(0, 0xC3)]) + rng.randbytes(rng.randrange(0, 200))
    if kind == "truncated-avro":
        return group.encode(), good[: rng.randrange(0, len(good))]
    if kind == "wrong-fingerprint":
        return group.encode(), SINGLE_OBJECT_MAGIC + rng.randbytes(8) + good[10:]
    if kind == "huge-garbage":
        return group.encode(), b"\x00" + rng.randbytes(900_000)
    if kind == "null-value":
        return group.encode(), None
    if kind == "no-record-key":
        return None, good
    if kind == "wrong-record-key":
        return b"not-" + group.encode(), good
    if kind == "empty-entity-key":
        return group.encode(), CODEC.encode("reservation", reservation("", group, 1))
    assert kind == "empty-group"
    return b"", CODEC.encode("reservation", reservation(rid, "", 1))


@pytest.mark.integration
def test_bad_records_are_dead_lettered_and_the_worker_goes_on(settings: Settings, topics: Any,
                                                               long_run: bool) -> None:
    total = 10_000 if long_run else 2_000
    rng = random.Random(1234)
    codec = make_codec(settings, CATALOG)
    valid = Workload(events=total, groups=30, entities=200, seed=8).generate()
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all", "linger.ms": 5}))
    produced: list[ProducedEvent] = []
    bad: dict[str, str] = {}  # fuzz id -> expected reason
    kinds = sorted(BAD_KINDS)
    huge_valid = 0
    for i in range(total):
        if rng.random() < 0.5:
            event = next(valid)
            if event.op == "upsert" and i % 400 == 0:
                assert event.value is not None
                event = replace(event, value={**event.value, "customer_id": "x" * 900_000})
                huge_valid += 1
            if event.op == "delete":
                value = codec.encode_delete("reservation", event.key.split("/")[1], event.group, event.version)
            else:
                value = codec.encode("reservation", dict(event.value or {}))
            key: bytes | None = event.group.encode()
            headers = [(SEQ_HEADER, str(event.seq).encode())]
            produced.append(event)
        else:
            kind = kinds[i % len(kinds)] if i < 4 * len(kinds) else rng.choice(kinds)
            key, value = bad_record(kind, rng, f"F{rng.randrange(30)}")
            bad[str(i)] = BAD_KINDS[kind]
            headers = [("fuzz.id", str(i).encode()), ("fuzz.kind", kind.encode())]
        while True:
            try:
                producer.produce(settings.input_topic, value, key, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    assert huge_valid >= 1 and set(bad.values()) == set(BAD_KINDS.values())

    with WorkerThread(settings, worker_id="fuzz") as w:
        wait_accounted([w], total, timeout=120)
        assert w.thread.is_alive() and w.error is None
        stats = w.stats
        assert stats.dead_lettered == len(bad)
        assert stats.processed + stats.superseded == len(produced)
        # Still alive and well: one more valid event is applied.
        sentinel = reservation("sentinel", "F0", 1)
        producer.produce(settings.input_topic, codec.encode("reservation", sentinel), b"F0")
        assert producer.flush(30) == 0
        wait_accounted([w], total + 1, timeout=60)
    table = table_from(consume_all(settings, settings.state_topic), codec)
    assert table.pop("reservation/sentinel").value == sentinel
    report = check_history(History(produced, table=table, compare_values=True))
    print(report.summary())
    assert report.counts == ZERO, report.summary()

    letters = {}
    for m in consume_all(settings, settings.dlq_topic):
        h = {k: v.decode() for k, v in m.headers() or ()}
        assert h["fifolane.dlq.error"], h
        letters[h["fuzz.id"]] = h["fifolane.dlq.reason"]
    assert letters == bad
