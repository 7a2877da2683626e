"""Decode the Avro bodies of one entity type with Spark's built-in ``from_avro``.

Records may have been written with an older schema (``schemas/history/``) or, with a Schema
Registry, under any registry id. Each writer schema decodes its own records, resolved to the
current (reader) schema through ``from_avro``'s ``avroSchema`` option, so every branch yields
the same struct: one ``CASE WHEN writer = ...`` expression, one pass, no union and no Python
UDF. A record whose writer schema is unknown fails the job with its key (FAILFAST).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro

from fifolane.errors import SerializationError, UnknownSchemaError
from fifolane.serde.catalog import SchemaCatalog, WriterSchema
from fifolane.serde.confluent import RegistryClient
from spark.wire import BAD_HEADER, soe_writer

__all__ = ["decode_entities", "resolve_writers", "schema_json"]


def schema_json(schema: dict[str, Any]) -> str:
    """Avro JSON of a fastavro-parsed schema (fastavro's private keys removed)."""

    def clean(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: clean(v) for k, v in node.items() if not k.startswith("__")}
        if isinstance(node, list):
            return [clean(v) for v in node]
        return node

    return json.dumps(clean(schema))


def _registry_writer(catalog: SchemaCatalog, registry: RegistryClient, schema_id: int) -> WriterSchema:
    text = registry.schema_by_id(schema_id)
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise UnknownSchemaError(f"registry schema id {schema_id} is not JSON: {exc}") from exc
    return catalog.writer_for_schema(raw, f"registry id {schema_id}")


def resolve_writers(
    catalog: SchemaCatalog,
    type_name: str,
    writers: Iterable[str],
    *,
    registry_url: str | None = None,
) -> dict[str, WriterSchema]:
    """Writer schemas of ``type_name`` for the ``writer`` ids seen on the topic.

    Single-object ids are looked up by fingerprint in the catalog; Confluent ids are fetched
    from the registry. Raises :class:`UnknownSchemaError` naming what is missing.
    """
    entity = catalog.entity(type_name)
    by_soe = {soe_writer(fp): w for fp, w in catalog.writers.items()}
    known = ", ".join(sorted(w for w, s in by_soe.items() if s.entity is entity))
    resolved: dict[str, WriterSchema] = {}
    registry: RegistryClient | None = None
    try:
        for writer in sorted(set(writers)):
            if writer == BAD_HEADER:
                raise SerializationError(
                    f"{type_name} values on the state topic start with neither C3 01 (single-object) "
                    "nor 00 (Confluent); see docs/formats.md"
                )
            if writer.startswith("cf:"):
                if registry_url is None:
                    raise UnknownSchemaError(
                        f"{type_name} records use Confluent framing ({writer}) but "
                        "FIFOLANE_SCHEMA_REGISTRY_URL is not set"
                    )
                registry = registry or RegistryClient(registry_url)
                found: WriterSchema | None = _registry_writer(catalog, registry, int(writer[3:]))
            else:
                found = by_soe.get(writer)
            if found is None or found.entity is None or found.entity.name != entity.name:
                raise UnknownSchemaError(
                    f"no {type_name} writer schema for {writer} (known: {known}); is an older "
                    "schema missing from schemas/history/?"
                )
            resolved[writer] = found
    finally:
        if registry is not None:
            registry.close()
    return resolved


def _decode_expr(body: Column, writer: Column, reader: str, writers: dict[str, WriterSchema]) -> Column:
    expr: Column | None = None
    for writer_id, schema in writers.items():
        options = {"mode": "FAILFAST"}
        if schema.reader is not None:  # an older schema: resolve it into the current one
            options["avroSchema"] = reader
        decoded = from_avro(body, schema_json(schema.schema), options)
        condition = writer == F.lit(writer_id)
        expr = F.when(condition, decoded) if expr is None else expr.when(condition, decoded)
    if expr is None:  # no record of this type: the current schema gives the empty table its columns
        return from_avro(body, reader)
    # Writers were collected from the same data; this only guards against a mismatch.
    unknown = F.concat(F.lit("unknown writer schema "), F.coalesce(writer, F.lit(BAD_HEADER)))
    return expr.otherwise(F.raise_error(unknown))


def decode_entities(
    state: DataFrame,
    catalog: SchemaCatalog,
    type_name: str,
    writers: dict[str, WriterSchema],
) -> DataFrame:
    """The live entities of ``type_name`` as columns of its current schema.

    ``state`` is :func:`spark.read.read_state`'s output; ``writers`` maps every ``writer``
    id present for this type to its schema (:func:`resolve_writers`).
    """
    entity = catalog.entity(type_name)
    reader = schema_json(entity.schema)
    fields = [f["name"] for f in entity.schema["fields"]]
    rows = state.where(F.col("type") == F.lit(type_name)).select("entity_key", "writer", "body")
    decoded = rows.select("entity_key",
                          _decode_expr(F.col("body"), F.col("writer"), reader, writers).alias("e"))
    # An entity that changed group has a record in its old partition until the move-out
    # there is committed (docs/formats.md, "Group changes"): the higher version wins.
    version = F.col("e")
    for part in entity.version_field.split("."):
        version = version[part]
    latest = decoded.groupBy("entity_key").agg(F.max_by(F.col("e"), version).alias("e"))
    return latest.select(*[F.col("e")[name].alias(name) for name in fields])
