"""Write state-topic records exactly as docs/formats.md says, transactionally, for tests.

Alongside, :class:`StateWriter` keeps a plain-Python reference of the committed table
(aborted transactions leave it untouched), the oracle for the Spark views.
"""

from __future__ import annotations

import io
import uuid
import zlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import date
from typing import Any

from confluent_kafka import Producer
from fastavro import parse_schema, schemaless_writer

from fifolane.config import Settings
from fifolane.serde import SchemaCatalog
from fifolane.serde.catalog import schema_fingerprint
from fifolane.serde.codec import SINGLE_OBJECT_MAGIC, Codec, SingleObjectCodec
from fifolane.serde.fingerprint import fingerprint_bytes
from fifolane.serde.state_records import state_headers

__all__ = ["StateWriter", "flight", "reservation"]

_KEY_FIELD = {"reservation": "reservation_id", "flight": "flight_number"}


class StateWriter:
    """A transactional producer for one state topic plus the reference table it implies."""

    def __init__(self, settings: Settings, catalog: SchemaCatalog, codec: Codec | None = None) -> None:
        self.settings = settings
        self.topic = settings.state_topic
        self.catalog = catalog
        self.codec = codec or SingleObjectCodec(catalog)
        self.producer = Producer(settings.kafka_config(**{
            "transactional.id": f"test-state-{uuid.uuid4().hex}",
            "linger.ms": 5,
        }))
        self.producer.init_transactions(30)
        #: committed state: (type, key) -> record
        self.table: dict[tuple[str, str], dict[str, Any]] = {}
        self._pending: list[tuple[tuple[str, str], dict[str, Any] | None]] = []

    def _partition(self, group: str) -> int:
        return zlib.crc32(group.encode()) % self.settings.partitions

    def _send(self, type_name: str, key: str, group: str, version: int, value: bytes | None,
              timestamp_ms: int | None) -> None:
        kwargs: dict[str, Any] = {"timestamp": timestamp_ms} if timestamp_ms is not None else {}
        # As a worker writes them: headers on tombstones only (upserts carry group and
        # version in their value), unless the settings ask for headers on upserts too.
        headers = (state_headers(type_name.encode(), group.encode(), version)
                   if value is None or self.settings.state_headers else None)
        self.producer.produce(
            self.topic, key=f"{type_name}/{key}".encode(), value=value,
            partition=self._partition(group), headers=headers, **kwargs,
        )

    def upsert(self, type_name: str, record: Mapping[str, Any], *, writer_schema: dict[str, Any] | None = None,
               codec: Codec | None = None, timestamp_ms: int | None = None) -> None:
        """Write an entity; ``writer_schema`` (a raw older schema) encodes it single-object
        with that schema instead of the current one; ``codec`` overrides the writer's codec."""
        record = dict(record)
        if writer_schema is not None:
            parsed: dict[str, Any] = parse_schema(writer_schema, named_schemas={})  # type: ignore[assignment]
            buf = io.BytesIO()
            buf.write(SINGLE_OBJECT_MAGIC + fingerprint_bytes(schema_fingerprint(parsed)))
            schemaless_writer(buf, parsed, record)
            value = buf.getvalue()
            # What a reader sees: the current schema's default for the missing field.
            record.setdefault("customer_id", "")
        else:
            value = (codec or self.codec).encode(type_name, record)
        key = str(record[_KEY_FIELD[type_name]])
        self._send(type_name, key, str(record["flight_number"]), int(record["version"]), value, timestamp_ms)
        self._pending.append(((type_name, key), record))

    def delete(self, type_name: str, key: str, group: str, version: int, *, timestamp_ms: int | None = None) -> None:
        """A tombstone (null value) with the state-topic headers."""
        self._send(type_name, key, group, version, None, timestamp_ms)
        self._pending.append(((type_name, key), None))

    @contextmanager
    def transaction(self, *, abort: bool = False) -> Iterator[StateWriter]:
        """Group writes in one transaction; ``abort=True`` aborts it (data invisible)."""
        self.producer.begin_transaction()
        self._pending = []
        yield self
        if abort:
            self.producer.flush(30)  # the aborted records really reach the log
            self.producer.abort_transaction(30)
        else:
            self.producer.commit_transaction(30)
            for ident, record in self._pending:
                if record is None:
                    self.table.pop(ident, None)
                else:
                    self.table[ident] = record
        self._pending = []

    def close(self) -> None:
        """Flush and close the producer (before the session's Kafka stops)."""
        self.producer.flush(30)
        self.producer.close()

    def rows(self, type_name: str) -> list[dict[str, Any]]:
        """The committed records of one type."""
        return [r for (t, _), r in self.table.items() if t == type_name]


def flight(number: str, origin: str, destination: str, day: date, capacity: int, version: int) -> dict[str, Any]:
    return {"flight_number": number, "origin": origin, "destination": destination,
            "departure": day, "capacity": capacity, "version": version}


def reservation(rid: str, flight_number: str, seats: int, amount: float, state: str, version: int,
                customer: str = "C") -> dict[str, Any]:
    return {"reservation_id": rid, "flight_number": flight_number, "customer_id": customer,
            "seats": seats, "amount": amount, "state": state, "version": version}
