"""Confluent wire format: ``00`` + 4-byte big-endian Schema Registry id + Avro body.

Subjects follow the RecordNameStrategy: one subject per record full name
(``fifolane.flights.Reservation``, ``fifolane.Delete``), because one input topic carries
several record types and a ``<topic>-value`` subject could hold only one of them.
Ids are cached both ways, so the registry is asked once per schema per process.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Collection
from typing import Any

import httpx

from fifolane.errors import SchemaRegistryError, SerializationError, UnknownSchemaError
from fifolane.serde.catalog import DELETE_SCHEMA_NAME, SchemaCatalog, WriterSchema
from fifolane.serde.codec import _DELETE, AvroCodec, Decoded, Scan
from fifolane.serde.entity import EntityType
from fifolane.serde.scan import Scanner

__all__ = ["CONFLUENT_MAGIC", "ConfluentCodec", "RegistryClient", "SchemaRegistryError"]

CONFLUENT_MAGIC = 0
_HEADER = 5  # magic (1) + schema id (4)
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryClient:
    """The three Schema Registry REST calls fifolane needs, over one httpx client."""

    def __init__(
        self, url: str, *, transport: httpx.BaseTransport | None = None, timeout: float = 10.0
    ) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url, transport=transport, timeout=timeout,
            headers={"Accept": _CONTENT_TYPE},
        )

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise SchemaRegistryError(f"schema registry {self.url}: {method} {path}: {exc}") from exc

    @staticmethod
    def _json(response: httpx.Response, what: str) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError as exc:
            raise SchemaRegistryError(f"schema registry: {what}: not JSON: {response.text[:200]!r}") from exc
        if not isinstance(body, dict):
            raise SchemaRegistryError(f"schema registry: {what}: unexpected answer {body!r}")
        return body

    def register(self, subject: str, schema: str) -> int:
        """Register (or find) ``schema`` under ``subject``; its global id."""
        what = f"register {subject}"
        response = self._request(
            "POST", f"/subjects/{subject}/versions",
            content=json.dumps({"schema": schema}), headers={"Content-Type": _CONTENT_TYPE},
        )
        body = self._json(response, what)
        if response.status_code != 200 or "id" not in body:
            raise SchemaRegistryError(
                f"schema registry refused {what}: HTTP {response.status_code} {body.get('message', body)}"
            )
        return int(body["id"])

    def schema_by_id(self, schema_id: int) -> str:
        """The schema text with this id; UnknownSchemaError if the registry has none."""
        what = f"schema id {schema_id}"
        response = self._request("GET", f"/schemas/ids/{schema_id}")
        if response.status_code == 404:
            raise UnknownSchemaError(f"schema registry {self.url} has no schema with id {schema_id}")
        body = self._json(response, what)
        if response.status_code != 200 or "schema" not in body:
            raise SchemaRegistryError(
                f"schema registry: {what}: HTTP {response.status_code} {body.get('message', body)}"
            )
        return str(body["schema"])


class ConfluentCodec(AvroCodec):
    """Confluent wire format, registering the catalog's current schemas on first use."""

    def __init__(self, catalog: SchemaCatalog, registry: RegistryClient) -> None:
        super().__init__(catalog)
        self.registry = registry
        self._encoders: dict[str, tuple[bytes, dict[str, Any]]] = {}
        self._by_id: dict[int, WriterSchema] = {}
        self._lock = threading.Lock()  # one registration per schema, also with many threads

    def __repr__(self) -> str:
        return f"ConfluentCodec({self.registry.url!r}, {self.catalog!r})"

    def _prefix(self, type_name: str) -> tuple[bytes, dict[str, Any]]:
        enc = self._encoders.get(type_name)
        if enc is not None:
            return enc
        if type_name == _DELETE:
            writer, raw, subject = self.catalog.delete, None, DELETE_SCHEMA_NAME
        else:
            entity = self.catalog.entity(type_name)
            writer = self.catalog.writers[entity.fingerprint]
            raw, subject = entity.raw_schema, entity.full_name
        with self._lock:
            enc = self._encoders.get(type_name)
            if enc is None:
                text = json.dumps(raw) if raw is not None else _schema_text(writer)
                schema_id = self.registry.register(subject, text)
                self._by_id.setdefault(schema_id, writer)
                enc = (bytes([CONFLUENT_MAGIC]) + schema_id.to_bytes(4, "big"), writer.schema)
                self._add_fast(type_name, *enc)
                self._encoders[type_name] = enc
        return enc

    def decode(self, data: bytes) -> Decoded:
        """Decode a Confluent-framed value (entity or delete)."""
        if data is None:
            raise SerializationError("no value (null / tombstone) to decode")
        if not data or data[0] != CONFLUENT_MAGIC:
            raise SerializationError(
                f"not Confluent wire format: first byte {bytes(data[:1]).hex() or 'missing'}, "
                f"expected 00"
            )
        if len(data) < _HEADER:
            raise SerializationError(f"truncated Confluent header: {len(data)} bytes, need {_HEADER}")
        schema_id = int.from_bytes(data[1:_HEADER], "big")
        writer = self._by_id.get(schema_id)
        if writer is None:
            writer = self._fetch(schema_id)
        return self._read(writer, data, _HEADER)

    def scanner(self, types: Collection[str]) -> Scan:
        """See :meth:`fifolane.serde.Codec.scanner`. Ids are learnt by decode(): a value
        whose schema id was never decoded here is left to decode() once."""
        table: dict[int, tuple[EntityType, Scanner] | None] = {}
        by_id = self._by_id

        def scan(data: bytes) -> tuple[EntityType, list[Any]] | None:
            if data is None or len(data) < _HEADER or data[0] != CONFLUENT_MAGIC:
                return None
            schema_id = int.from_bytes(data[1:_HEADER], "big")
            try:
                found = table[schema_id]
            except KeyError:
                writer = by_id.get(schema_id)
                if writer is None:
                    return None
                entity, fn = writer.entity, self._scanner_of(writer, types)
                found = None if entity is None or fn is None else (entity, fn)
                table[schema_id] = found
            if found is None:
                return None
            values = found[1](data, _HEADER)
            return None if values is None else (found[0], values)

        return scan

    def _fetch(self, schema_id: int) -> WriterSchema:
        text = self.registry.schema_by_id(schema_id)
        where = f"registry schema id {schema_id}"
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UnknownSchemaError(f"{where}: not a JSON schema: {exc}") from exc
        if not isinstance(raw, dict):
            raise UnknownSchemaError(f"{where}: not a record schema")
        writer = self.catalog.writer_for_schema(raw, where)
        self._by_id[schema_id] = writer
        return writer


def _schema_text(writer: WriterSchema) -> str:
    """The canonical JSON text of a parsed schema (for schemas known only parsed)."""
    from fastavro.schema import to_parsing_canonical_form

    return str(to_parsing_canonical_form(writer.schema))
