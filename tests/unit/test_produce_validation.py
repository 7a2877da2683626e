"""EventProducer without a broker: line validation, keys, headers, sequence numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fifolane.config import Settings
from fifolane.errors import ConfigError, ValidationError
from fifolane.produce import EventProducer, SequenceAllocator
from fifolane.serde import SchemaCatalog, SingleObjectCodec
from schemas import SCHEMAS_DIR

CATALOG = SchemaCatalog.load()


class FakeKafkaProducer:
    """Records what would be produced; delivers (or fails) on flush, like librdkafka."""

    def __init__(self, fail: bool = False) -> None:
        self.records: list[dict[str, Any]] = []
        self.pending: list[Any] = []
        self.fail = fail
        self.flush_timeouts: list[float] = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                headers: Any = None, on_delivery: Any = None) -> None:
        self.records.append({"topic": topic, "key": key, "value": value, "headers": dict(headers or [])})
        self.pending.append((on_delivery, topic, key))

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        self.flush_timeouts.append(timeout)
        for callback, topic, key in self.pending:
            callback(_Error() if self.fail else None, _Msg(topic, key))
        self.pending.clear()
        return 0


class _Error:
    def code(self) -> int:
        return KafkaError.NOT_ENOUGH_REPLICAS

    def str(self) -> str:
        return "Broker: Not enough in-sync replicas"


class _Msg:
    def __init__(self, topic: str, key: bytes | None) -> None:
        self._topic, self._key = topic, key

    def topic(self) -> str:
        return self._topic

    def key(self) -> bytes | None:
        return self._key


def _producer(tmp_path: Path, source: str = "test", fail: bool = False) -> tuple[EventProducer, FakeKafkaProducer]:
    settings = Settings(home=tmp_path / "home", schemas_dir=SCHEMAS_DIR, input_topic="in")
    fake = FakeKafkaProducer(fail)
    return EventProducer(settings, CATALOG, source, kafka_producer=fake), fake


def _line(**fields: Any) -> str:
    base = {"reservation_id": "R-1", "flight_number": "LX1", "customer_id": "C-1", "seats": 2,
            "amount": 99.5, "state": "NEW", "version": 1}
    base.update(fields)
    return json.dumps({k: v for k, v in base.items() if v is not ...})


def test_good_and_bad_lines(tmp_path: Path) -> None:
    lines = [
        _line(),                                             # 1 ok
        "{not json",                                         # 2
        "",                                                  # 3 blank: skipped, not an error
        _line(seats="two"),                                  # 4
        _line(flight_number=...),                            # 5 missing group
        _line(reservation_id=..., op="upsert"),              # 6 missing key
        _line(version=...),                                  # 7 missing version
        _line(colour="red"),                                 # 8 unknown field
        json.dumps({"reservation_id": "R-1", "flight_number": "LX1", "version": 9, "op": "delete"}),  # 9 ok
        _line(op="merge"),                                   # 10
        "[1, 2]",                                            # 11
        _line(reservation_id="R-2", flight_number="LX2"),    # 12 ok
    ]
    reported: list[tuple[int, str]] = []
    producer, fake = _producer(tmp_path)
    with producer:
        report = producer.produce_lines(lines, "reservation", on_error=lambda n, r: reported.append((n, r)))
    assert report.sent == 3
    assert report.failed == reported
    assert report.failed == [
        (2, "invalid JSON: Expecting property name enclosed in double quotes (column 2)"),
        (4, "field 'seats': expected int, got 'two'"),
        (5, "field 'flight_number': missing (required)"),
        (6, "field 'reservation_id': missing (required)"),
        (7, "field 'version': missing (required)"),
        (8, "field 'colour': unknown field (fields of Reservation: reservation_id, flight_number, "
            "customer_id, seats, amount, state, version)"),
        (10, "field 'op': expected 'upsert' or 'delete', got 'merge'"),
        (11, "expected a JSON object, got list"),
    ]
    assert not report.ok
    assert [r["key"] for r in fake.records] == [b"LX1", b"LX1", b"LX2"]
    assert {r["topic"] for r in fake.records} == {"in"}
    codec = SingleObjectCodec(CATALOG)
    decoded = [codec.decode(r["value"]) for r in fake.records]
    assert [d.is_delete for d in decoded] == [False, True, False]
    assert decoded[1].record == {"entity_type": "reservation", "key": "R-1", "group": "LX1", "version": 9}
    assert [r["headers"]["fifolane.source"] for r in fake.records] == [b"test"] * 3
    assert [r["headers"]["fifolane.seq"] for r in fake.records] == [b"0", b"1", b"2"]


def test_all_good_lines_report_ok(tmp_path: Path) -> None:
    producer, _ = _producer(tmp_path)
    with producer:
        report = producer.produce_lines([_line(version=v) for v in range(5)], "reservation")
    assert (report.sent, report.failed, report.ok) == (5, [], True)
    assert producer.delivered == 5


def test_delivery_failures_are_reported(tmp_path: Path) -> None:
    producer, _ = _producer(tmp_path, fail=True)
    with producer:
        report = producer.produce_lines([_line(), _line(version=2)], "reservation")
    assert report.sent == 2 and not report.ok
    reason = "not delivered: Broker: Not enough in-sync replicas; send it again once the cause is fixed"
    assert report.undelivered == [(1, reason), (2, reason)]
    assert report.delivery_errors == [f"line 1: {reason}", f"line 2: {reason}"]
    assert report.failed == []


def test_delivery_outlasts_a_leader_election(tmp_path: Path) -> None:
    """Records are retried for Kafka's default 120 s and flush waits for every outcome."""
    producer, fake = _producer(tmp_path)
    with producer:
        assert producer.delivery_timeout == 120.0
        producer.produce_lines([_line()], "reservation")
    assert fake.flush_timeouts[0] == 130.0  # delivery timeout + margin: every record has an outcome
    settings = Settings(home=tmp_path / "home2", schemas_dir=SCHEMAS_DIR, input_topic="in")
    custom = EventProducer(settings, CATALOG, "t2", kafka_producer=fake,
                           producer_config={"message.timeout.ms": "5000"})
    assert custom.delivery_timeout == 5.0 and custom.flush_timeout == 15.0
    custom.close()


def test_delivery_reason_says_what_to_do(tmp_path: Path) -> None:
    producer, _ = _producer(tmp_path)
    with producer:
        timed_out = KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out")
        text = producer.delivery_reason(timed_out)
        assert "not acknowledged within the delivery timeout (120s)" in text
        assert "fifolane topics describe" in text and "send it again" in text
        too_big = producer.delivery_reason(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: too large"))
        assert "raise the input topic's max.message.bytes" in too_big


def test_send_api(tmp_path: Path) -> None:
    producer, fake = _producer(tmp_path)
    with producer:
        record = CATALOG.validate("flight", {"flight_number": "LX9", "origin": "ZRH", "destination": "JFK",
                                             "departure": "2025-01-02", "capacity": 9, "version": 4})
        assert producer.send("flight", record) == 0
        assert producer.send("flight", {"flight_number": "LX9", "version": 5}, op="delete") == 1
        assert producer.send_raw(b"LX9", b"garbage", [("x", b"y")]) == 2
        assert producer.send_raw(None, b"no headers", source_headers=False) is None
        with pytest.raises(ValidationError, match=r"field 'flight_number': missing \(required: the FIFO-group"):
            producer.send("flight", {"version": 5}, op="delete")
        with pytest.raises(ValidationError, match=r"field 'flight_number': empty \(required: the FIFO-group"):
            producer.send("flight", {"flight_number": "", "version": 5}, op="delete")  # a worker dead-letters it
    assert fake.records[2]["headers"] == {"fifolane.source": b"test", "fifolane.seq": b"2", "x": b"y"}
    assert fake.records[3]["headers"] == {}


def test_invalid_source_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"invalid source id 'a/b'"):
        _producer(tmp_path, source="a/b")


# --- sequence numbers ----------------------------------------------------------------------
def test_sequence_unique_and_increasing_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "sources" / "s.seq"
    seen: list[int] = []
    for run_length in (3, 0, 5, 12):  # "restarts", one with nothing sent
        allocator = SequenceAllocator(path, block=10)
        seen.extend(allocator.next() for _ in range(run_length))
        allocator.close()
    assert seen == sorted(set(seen))
    # consecutive within a run and a block; a restart jumps to the next block (delta D = 10)
    assert seen == [0, 1, 2, 10, 11, 12, 13, 14, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]


def test_sequence_survives_producer_restarts(tmp_path: Path) -> None:
    seqs: list[bytes] = []
    for _ in range(3):
        producer, fake = _producer(tmp_path, source="restart")
        with producer:
            producer.produce_lines([_line(), _line(version=2)], "reservation")
        seqs.extend(r["headers"]["fifolane.seq"] for r in fake.records)
    assert [int(s) for s in seqs] == [0, 1, 1_000_000, 1_000_001, 2_000_000, 2_000_001]


def test_one_source_one_process(tmp_path: Path) -> None:
    path = tmp_path / "sources" / "busy.seq"
    first = SequenceAllocator(path)
    with pytest.raises(ConfigError, match=r"source 'busy' is in use by another producer .*--source"):
        SequenceAllocator(path)
    first.close()
    SequenceAllocator(path).close()


def test_corrupt_sequence_file_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.seq"
    path.write_text("garbage\n")
    allocator = SequenceAllocator(path)
    with pytest.raises(ConfigError, match=r"corrupt sequence file .*bad.seq: 'garbage' is not a number"):
        allocator.next()
    allocator.close()


class RefusingKafkaProducer(FakeKafkaProducer):
    """Refuses a record whose key is ``b"BAD"`` like librdkafka does, and is full once."""

    def __init__(self) -> None:
        super().__init__()
        self.full_once = True
        self.polls = 0

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None,
                headers: Any = None, on_delivery: Any = None) -> None:
        if key == b"FULL" and self.full_once:
            self.full_once = False
            raise BufferError("Local: Queue full")
        if key == b"BAD":
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, "Local: Invalid argument"))
        super().produce(topic, value, key, headers, on_delivery)

    def poll(self, timeout: float = 0) -> int:
        self.polls += 1
        return 0


def test_every_bad_line_is_reported_and_skipped(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", schemas_dir=SCHEMAS_DIR, input_topic="in")
    fake = RefusingKafkaProducer()
    producer = EventProducer(settings, CATALOG, "bad", kafka_producer=fake,
                             producer_config={"message.max.bytes": "2000"})
    lines: list[str | bytes] = [
        _line(reservation_id="R-1"),                          # 1 ok
        "[" * 100_000 + "]" * 100_000,                        # 2 RecursionError in json
        _line(reservation_id="R-3", customer_id="x" * 5000),  # 3 over message.max.bytes
        b'{"reservation_id": "R-4\xff"}',                     # 4 not UTF-8
        _line(reservation_id="R-5", flight_number="BAD"),     # 5 the producer refuses it
        '{"seats": ' + "9" * 5000 + "}",                      # 6 int too long for Python
        _line(reservation_id="R-7", flight_number="FULL"),    # 7 ok after a full queue
        _line(reservation_id="R-8").encode(),                 # 8 ok, as bytes
    ]
    reported: list[tuple[int, str]] = []
    with producer:
        report = producer.produce_lines(lines, "reservation", on_error=lambda n, r: reported.append((n, r)))
    assert report.failed == reported
    assert [n for n, _ in report.failed] == [2, 3, 4, 5, 6]
    reasons = dict(report.failed)
    assert reasons[2] == ("invalid JSON: nested too deeply (more than about 1,000 levels of [ and {); "
                          "flatten the event")
    assert reasons[3].startswith("the encoded record is about ")
    assert "over the producer's message.max.bytes (2,000); make the event smaller" in reasons[3]
    assert reasons[4] == "not valid UTF-8 (byte 24 of the line); save the file as UTF-8"
    assert reasons[5] == "the producer refused the record: Local: Invalid argument"
    assert reasons[6].startswith("invalid JSON: Exceeds the limit (4300 digits)")
    assert report.sent == 3 and report.undelivered == [] and not report.ok
    assert [codec_key(r) for r in fake.records] == [("LX1", "R-1"), ("FULL", "R-7"), ("LX1", "R-8")]
    assert fake.polls >= 1  # the full queue was served, not fatal
    # sequence numbers: none taken by the lines refused before sending
    assert [r["headers"]["fifolane.seq"] for r in fake.records] == [b"0", b"2", b"3"]


def codec_key(record: dict[str, Any]) -> tuple[str, str]:
    decoded = SingleObjectCodec(CATALOG).decode(record["value"])
    return record["key"].decode(), decoded.key


def test_send_refuses_an_oversized_record_before_numbering_it(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path / "home", schemas_dir=SCHEMAS_DIR, input_topic="in")
    fake = FakeKafkaProducer()
    with EventProducer(settings, CATALOG, "big", kafka_producer=fake) as producer:
        with pytest.raises(ValidationError, match=r"over the producer's message.max.bytes \(1,000,000\)"):
            producer.send_raw(b"k", b"x" * 1_000_000)
        assert producer.send_raw(b"k", b"x" * 999_000) == 0
    assert len(fake.records) == 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
fields = st.sampled_from(["reservation_id", "flight_number", "customer_id", "seats", "amount", "state",
                          "version", "op", "other"])


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(fields, json_values, max_size=9) | json_values)
def test_any_json_line_is_sent_or_reported(tmp_path: Path, obj: Any) -> None:
    """Whatever JSON a line holds, produce_lines sends it or reports it: it never raises."""
    import hashlib

    home = tmp_path / hashlib.sha1(json.dumps(obj).encode()).hexdigest()
    producer, fake = _producer(home, source="fuzz")
    with producer:
        report = producer.produce_lines([json.dumps(obj)], "reservation")
    assert report.sent + len(report.failed) == 1
    assert len(fake.records) == report.sent
