"""Send events to the input topic: validate, encode, key by FIFO group, number per source.

    with EventProducer(settings, source="bookings") as producer:
        producer.send("reservation", record)             # upsert
        producer.send("reservation", record, op="delete")
        report = producer.produce_lines(lines, "reservation")   # JSON lines

Every record carries ``fifolane.source`` and ``fifolane.seq`` headers (docs/formats.md).
Sequence numbers come from a :class:`SequenceAllocator`: consecutive within a run, unique
and increasing across restarts, which jump to the next durably reserved block
("delta-well-ordered", seed 004).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from fifolane.config import Settings
from fifolane.errors import ConfigError, SerializationError, ValidationError
from fifolane.partitioner import PARTITIONER
from fifolane.serde import Codec, SchemaCatalog, make_codec

__all__ = [
    "DEFAULT_DELIVERY_TIMEOUT_S",
    "DEFAULT_MESSAGE_MAX_BYTES",
    "INTERRUPT_WAIT_S",
    "SEQ_BLOCK",
    "EventProducer",
    "ProduceReport",
    "SequenceAllocator",
    "default_source",
]

#: Numbers a source reserves at once: a restart jumps by at most this much (the seed's delta D).
SEQ_BLOCK = 1_000_000
HEADER_SOURCE = "fifolane.source"
HEADER_SEQ = "fifolane.seq"
_SOURCE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
Headers = list[tuple[str, str | bytes | None]]
DeliveryCallback = Callable[[KafkaError | None, Message], None]
#: How long a record is retried before it is reported failed: Kafka's own default
#: ``delivery.timeout.ms``, well beyond a leader election after a broker dies.
DEFAULT_DELIVERY_TIMEOUT_S = 120.0
#: librdkafka's default ``message.max.bytes`` (the producer refuses larger records).
DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
# Record framing beyond key, value and header bytes (librdkafka's MessageV2 overhead is at
# most about 40 bytes), and per header (two length varints).
_RECORD_OVERHEAD = 64
_HEADER_OVERHEAD = 10
# flush() waits this much beyond the delivery timeout for the last delivery reports.
_FLUSH_MARGIN_S = 10.0
#: After Ctrl-C, how long produce_lines waits for the records in flight to be acknowledged.
INTERRUPT_WAIT_S = 5.0


def default_source() -> str:
    """The source id when none is given: one per host, so restarts continue its numbering."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()) or "localhost"
    return f"cli-{host}"[:128]


class SequenceAllocator:
    """Hi/lo sequence numbers for one source, durable across restarts.

    The file ``<home>/sources/<source>.seq`` holds the first number not yet reserved. Opening
    reserves the next block of ``block`` numbers (written and fsynced before any is used);
    numbers within a block are consecutive, and a restart starts at the next block, so
    numbers never repeat even after a crash. An exclusive lock on ``<source>.seq.lock``,
    held while the allocator is open, keeps two processes from using one source at once
    (they would interleave, and the numbers would no longer increase with send order).
    """

    def __init__(self, path: Path, block: int = SEQ_BLOCK) -> None:
        if block < 1:
            raise ValueError(f"block must be >= 1, got {block}")
        self.path = path
        self.block = block
        path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = path.with_name(path.name + ".lock")
        self._lock_fd: int | None = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise ConfigError(
                f"source '{path.stem}' is in use by another producer (lock {lock_path}); "
                f"give this one another source id (--source)"
            ) from None
        self._next = 0
        self._limit = 0

    def _read(self) -> int:
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return 0
        if not text.isdigit():
            raise ConfigError(f"corrupt sequence file {self.path}: {text[:40]!r} is not a number")
        return int(text)

    def _reserve(self) -> None:
        start = self._read()
        tmp = self.path.with_name(self.path.name + ".tmp")
        with tmp.open("w") as fh:
            fh.write(f"{start + self.block}\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself must survive a crash
        finally:
            os.close(dir_fd)
        self._next, self._limit = start, start + self.block

    def next(self) -> int:
        """The next number; reserves a new block when the current one is used up."""
        if self._lock_fd is None:
            raise ConfigError(f"sequence allocator {self.path} is closed")
        if self._next >= self._limit:
            self._reserve()
        number = self._next
        self._next = number + 1
        return number

    def close(self) -> None:
        """Release the source (the unused rest of the block is skipped by the next run)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None


def _ids(entity: Any, record: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """A record's group, key and version; ValidationError naming the first one missing."""
    ids = entity.group_of(record), entity.key_of(record), entity.version_of(record)
    for role, path, value in zip(("FIFO-group property", "entity key", "version"),
                                 (entity.group_path, entity.key_path, entity.version_field), ids, strict=True):
        if value is None or value == "":  # a worker dead-letters these (missing-group, missing-key)
            raise ValidationError(f"field '{path}': {'missing' if value is None else 'empty'} (required: the {role})")
    return ids


def _finite(token: str) -> float:
    """A JSON number as a float; NaN, Infinity and numbers beyond a double's range are
    refused (JSON has no such numbers, and a NaN amount spoils every sum downstream)."""
    value = float(token)
    if not math.isfinite(value):
        raise ValidationError(f"invalid JSON: {token} is not a finite number (JSON has no NaN or "
                              f"Infinity); use a number or null")
    return value


def _show(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class ProduceReport:
    """What :meth:`EventProducer.produce_lines` did: counts, and every failure with its line.

    ``failed``: lines skipped, not sent (invalid JSON, not valid for the schema, too large,
    refused by the producer), each ``(line number, reason)``. ``undelivered``: lines sent but
    not acknowledged by the brokers. ``delivery_errors``: the undelivered ones as text.
    """

    sent: int = 0
    failed: list[tuple[int, str]] = field(default_factory=list)
    undelivered: list[tuple[int, str]] = field(default_factory=list)
    delivery_errors: list[str] = field(default_factory=list)
    delivered: int = 0  # records the brokers acknowledged
    #: Ctrl-C: lines from ``resume_line`` on are not known delivered (``delivered_beyond`` of
    #: them were: partitions complete out of order); those before were delivered or reported.
    interrupted: bool = False
    resume_line: int | None = None
    delivered_beyond: int = 0

    @property
    def ok(self) -> bool:
        """True when every line was valid and every record was delivered."""
        return not self.failed and not self.undelivered and not self.delivery_errors and not self.interrupted


class EventProducer:
    """An idempotent Kafka producer of fifolane events for one source.

    Not thread-safe: use one per thread (each with its own source id). ``producer_config``
    overrides librdkafka settings; ``kafka_producer`` replaces the confluent-kafka Producer
    (anything with its ``produce``/``poll``/``flush``), for tests without a broker.

    A record is retried until ``delivery.timeout.ms`` (default 120 s, Kafka's own default:
    longer than a leader election after a broker dies), and :meth:`flush` waits that long
    plus a margin, so every record sent has an outcome when it returns.
    """

    def __init__(self, settings: Settings, catalog: SchemaCatalog | None = None, source: str | None = None,
                 *, codec: Codec | None = None, producer_config: Mapping[str, Any] | None = None,
                 kafka_producer: Any = None) -> None:
        self.settings = settings
        self.catalog = catalog or (codec.catalog if codec else SchemaCatalog.load(settings.schemas_dir))
        self.codec: Codec = codec or make_codec(settings, self.catalog)
        self.source = source or default_source()
        if not _SOURCE_RE.fullmatch(self.source):
            raise ConfigError(f"invalid source id {self.source!r}: use 1-128 letters, digits, '.', '_' or '-'")
        self.topic = settings.input_topic
        self.delivered = 0
        self.delivery_errors: list[str] = []
        self._source_header = self.source.encode()
        conf = settings.kafka_config(**{
            "enable.idempotence": True,  # no duplicates or reordering on retries
            "acks": "all",
            "linger.ms": 5,
            "client.id": f"fifolane-produce-{self.source}",
            # Java's default partitioner for keyed records (fifolane.partitioner): a group goes
            # to the same partition whichever client produced it, and readers can compute it.
            "partitioner": PARTITIONER,
        })
        conf.update(producer_config or {})
        if "delivery.timeout.ms" not in conf and "message.timeout.ms" not in conf:
            conf["delivery.timeout.ms"] = int(DEFAULT_DELIVERY_TIMEOUT_S * 1000)
        try:
            timeout_ms = int(conf.get("delivery.timeout.ms", conf.get("message.timeout.ms", 0)))
            self.max_message_bytes = int(conf.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"producer settings: delivery.timeout.ms and message.max.bytes must be "
                              f"numbers: {exc}") from None  # fmt: skip
        #: Seconds librdkafka retries a record before it reports it failed (0 = forever).
        self.delivery_timeout = timeout_ms / 1000
        self._seq = SequenceAllocator(settings.home / "sources" / f"{self.source}.seq")
        # kafka_producer: anything with confluent-kafka's produce/poll/flush (unit tests).
        try:
            self._producer = kafka_producer if kafka_producer is not None else Producer(conf)
        except Exception:
            self._seq.close()
            raise

    # -- context manager ---------------------------------------------------------------
    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- sending -----------------------------------------------------------------------
    def send(self, type_name: str, record: Mapping[str, Any], op: str = "upsert") -> int:
        """Send an upsert (``record`` is the entity) or a delete (``record`` needs only the
        key, group and version fields); returns its sequence number.

        Raises ValidationError when the group, key or version is missing, for an unknown op,
        or when the encoded record is over the producer's ``message.max.bytes``;
        SerializationError when the record does not fit the schema.
        """
        entity = self.catalog.entity(type_name)
        group, key, version = _ids(entity, record)
        if op == "upsert":
            value_bytes = self.codec.encode(type_name, record)
        elif op == "delete":
            value_bytes = self.codec.encode_delete(type_name, key, group, version)
        else:
            raise ValidationError(f"field 'op': expected 'upsert' or 'delete', got {_show(op)}")
        return self._send(str(group).encode(), value_bytes)

    def send_raw(self, key: bytes | None, value: bytes | None, headers: Headers | None = None,
                 *, source_headers: bool = True) -> int | None:
        """Send bytes as they are (tests and demos inject malformed records this way).

        With ``source_headers`` the record gets this source's ``fifolane.source`` and
        ``fifolane.seq`` first (the returned number); ``headers`` are appended.
        """
        if source_headers:
            return self._send(key, value, headers)
        self._produce(key, value, list(headers or []), self._on_delivery)
        return None

    def check_size(self, key: bytes | None, value: bytes | None, extra: Headers | None = None) -> None:
        """Refuse a record the producer would refuse for its size, naming the limit.

        The estimate adds the source headers and the record framing to the key and value, and
        errs on the large side by a few bytes.
        """
        size = len(key or b"") + len(value or b"") + _RECORD_OVERHEAD
        size += len(HEADER_SOURCE) + len(self._source_header) + len(HEADER_SEQ) + 20 + 2 * _HEADER_OVERHEAD
        for name, header in extra or ():
            size += len(name) + len(header or b"") + _HEADER_OVERHEAD
        if size > self.max_message_bytes:
            raise ValidationError(
                f"the encoded record is about {size:,} bytes, over the producer's message.max.bytes "
                f"({self.max_message_bytes:,}); make the event smaller, or raise message.max.bytes "
                f"(FIFOLANE_LIBRDKAFKA) together with the input topic's max.message.bytes"
            )

    def _send(self, key: bytes | None, value: bytes | None, extra: Headers | None = None,
              on_delivery: DeliveryCallback | None = None) -> int:
        self.check_size(key, value, extra)  # before a sequence number is taken
        seq = self._seq.next()
        headers: Headers = [(HEADER_SOURCE, self._source_header), (HEADER_SEQ, str(seq).encode())]
        if extra:
            headers.extend(extra)
        self._produce(key, value, headers, on_delivery or self._on_delivery)
        return seq

    def _produce(self, key: bytes | None, value: bytes | None, headers: Headers,
                 on_delivery: DeliveryCallback) -> None:
        while True:
            try:
                self._producer.produce(self.topic, value=value, key=key, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                # Local queue full: serve delivery reports until there is room again.
                self._producer.poll(0.1)
        self._producer.poll(0)

    def delivery_reason(self, err: Any) -> str:
        """Why a record was not delivered, and what to do about it."""
        code = err.code() if hasattr(err, "code") else None
        text = err.str()
        if code == KafkaError._MSG_TIMED_OUT:
            return (f"{text}: not acknowledged within the delivery timeout ({self.delivery_timeout:.0f}s): "
                    f"a partition had no leader, or the cluster was unreachable, that long; check "
                    f"`fifolane topics describe` (replication) and the brokers, then send it again")  # fmt: skip
        if code == KafkaError.MSG_SIZE_TOO_LARGE:
            return (f"{text}: the broker refused its size; make the event smaller or raise the input "
                    f"topic's max.message.bytes")  # fmt: skip
        return f"{text}; send it again once the cause is fixed"

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.delivery_errors.append(f"{msg.topic()} key={_show(msg.key())}: {self.delivery_reason(err)}")

    @property
    def flush_timeout(self) -> float:
        """How long :meth:`flush` waits by default: the delivery timeout plus a margin (-1 = forever)."""
        return self.delivery_timeout + _FLUSH_MARGIN_S if self.delivery_timeout > 0 else -1

    def flush(self, timeout: float | None = None) -> int:
        """Wait for delivery of everything sent; returns how many are still undelivered
        (each also counted in ``delivery_errors``). ``timeout`` defaults to
        :attr:`flush_timeout`, by when every record has an outcome."""
        wait = self.flush_timeout if timeout is None else timeout
        remaining = int(self._producer.flush(wait))
        if remaining:
            self.delivery_errors.append(
                f"{remaining} record(s) without a delivery report after waiting {wait:.0f}s: the brokers "
                f"did not acknowledge them; check the cluster (`fifolane kafka status`, `fifolane topics "
                f"describe`) and send them again"
            )
        return remaining

    def close(self) -> None:
        """Flush and release the source."""
        try:
            self.flush()
        finally:
            self._seq.close()

    # -- JSON lines --------------------------------------------------------------------
    def produce_lines(self, lines: Iterable[str | bytes], type_name: str, *,
                      on_error: Callable[[int, str], None] | None = None, skip: int = 0) -> ProduceReport:
        """Validate and send JSON lines (one event each, 1-based line numbers), then flush.

        A line may carry ``"op": "upsert"`` (default) or ``"delete"``; a delete needs only
        the key, group and version fields. ``bytes`` lines must be UTF-8. A line that cannot
        be sent (invalid UTF-8 or JSON, JSON nested too deeply, not valid for the schema, over
        ``message.max.bytes``, refused by the producer) is skipped and listed in ``failed``; a
        line sent but not acknowledged is listed in ``undelivered``. Both are passed to
        ``on_error`` as soon as they are known; every other line is sent. The first ``skip``
        lines are not sent (a resumed run). Ctrl-C (KeyboardInterrupt) stops the sending: the
        report says from which line on delivery is not known (``resume_line``).
        """
        entity = self.catalog.entity(type_name)
        report = ProduceReport()
        errors_before = len(self.delivery_errors)
        pending: set[int] = set()
        delivered: set[int] = set()
        stopping: list[bool] = []  # Ctrl-C: records dropped by the purge are counted, not reported
        done = 0  # the last line handled (sent, skipped or reported)

        def fail(line_no: int, reason: str, into: list[tuple[int, str]]) -> None:
            into.append((line_no, reason))
            if on_error is not None:
                on_error(line_no, reason)

        def reporter(line_no: int) -> DeliveryCallback:
            def on_delivery(err: KafkaError | None, _msg: Message) -> None:
                if err is None:
                    self.delivered += 1
                    delivered.add(line_no)
                elif stopping:
                    return  # purged after Ctrl-C: stays pending, not known delivered
                pending.discard(line_no)
                if err is None:
                    return
                reason = f"not delivered: {self.delivery_reason(err)}"
                self.delivery_errors.append(f"line {line_no}: {reason}")
                fail(line_no, reason, report.undelivered)
            return on_delivery

        try:
            for line_no, line in enumerate(lines, 1):
                if line_no > skip:
                    self._produce_line(entity.name, line_no, line, report, pending, reporter, fail)
                done = line_no
            if self.flush():
                wait = self.flush_timeout
                for line_no in sorted(pending):
                    fail(line_no, f"not delivered: no delivery report within {wait:.0f}s; check the cluster "
                                  f"and send the line again", report.undelivered)  # fmt: skip
        except KeyboardInterrupt:
            stopping.append(True)
            self._stop_sending()
            report.interrupted = True
            # Known delivered: the lines before the first one sent and not acknowledged, not
            # delivered, or not handled at all (skipped invalid lines were reported).
            report.resume_line = min(pending | {n for n, _ in report.undelivered} | {done + 1})
            report.delivered_beyond = sum(1 for n in delivered if n > report.resume_line)
        report.delivered = len(delivered)
        report.delivery_errors = self.delivery_errors[errors_before:]
        return report

    def _produce_line(self, type_name: str, line_no: int, line: str | bytes, report: ProduceReport,
                      pending: set[int], reporter: Callable[[int], DeliveryCallback],
                      fail: Callable[[int, str, list[tuple[int, str]]], None]) -> None:
        try:
            text = line.decode("utf-8") if isinstance(line, bytes) else line
        except UnicodeDecodeError as exc:
            fail(line_no, f"not valid UTF-8 (byte {exc.start + 1} of the line); save the file as UTF-8",
                 report.failed)
            return
        if not text.strip():
            return
        try:
            key, value = self._encode_line(type_name, text)
            pending.add(line_no)
            self._send(key, value, on_delivery=reporter(line_no))
        except (ValidationError, SerializationError) as exc:
            pending.discard(line_no)
            return fail(line_no, str(exc), report.failed)
        except KafkaException as exc:
            pending.discard(line_no)
            err = exc.args[0] if exc.args else exc
            detail = err.str() if isinstance(err, KafkaError) else str(err)
            return fail(line_no, f"the producer refused the record: {detail}", report.failed)
        report.sent += 1

    def _stop_sending(self) -> None:
        """After Ctrl-C: drop what is not sent yet, give what is in flight a few seconds (a second
        Ctrl-C cuts that short), then drop it too: :meth:`close` then has nothing to wait for."""
        purge = getattr(self._producer, "purge", None)
        try:
            if purge is not None:
                purge(in_queue=True, in_flight=False)
            self._producer.flush(INTERRUPT_WAIT_S)
        except KeyboardInterrupt:
            pass
        if purge is not None:
            purge(in_queue=True, in_flight=True)
        self._producer.poll(0)  # the purged records' reports

    def _encode_line(self, type_name: str, line: str) -> tuple[bytes, bytes]:
        try:
            obj = json.loads(line, parse_constant=_finite, parse_float=_finite)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
        except RecursionError:
            raise ValidationError(
                "invalid JSON: nested too deeply (more than about 1,000 levels of [ and {); flatten the event"
            ) from None
        except ValueError as exc:  # e.g. an integer with more digits than Python converts
            raise ValidationError(f"invalid JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ValidationError(f"expected a JSON object, got {type(obj).__name__}")
        op = obj.pop("op", "upsert")
        entity = self.catalog.types[type_name]
        if op == "upsert":
            record = entity.validate(obj)
            return str(_ids(entity, record)[0]).encode(), self.codec.encode(type_name, record)
        if op == "delete":
            delete = entity.delete_record(obj)
            value = self.codec.encode_delete(type_name, delete["key"], delete["group"], delete["version"])
            return delete["group"].encode(), value
        raise ValidationError(f"field 'op': expected 'upsert' or 'delete', got {_show(op)}")
