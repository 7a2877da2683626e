"""The schema catalog: every ``.avsc`` of a schemas directory, parsed and checked once.

Current schemas (``schemas/*.avsc``) define the entity types; older versions
(``schemas/history/*.avsc``) are kept as writer schemas only, resolved into the current
schema of their type when read. Every writer schema is indexed by its CRC-64-AVRO
fingerprint, the key of the single-object encoding.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
from fastavro.schema import SchemaParseException, to_parsing_canonical_form

from fifolane.errors import SchemaError, UnknownSchemaError
from fifolane.serde.declarations import read_declarations, record_full_name
from fifolane.serde.entity import EntityType
from fifolane.serde.fingerprint import fingerprint64

__all__ = ["DELETE_SCHEMA_NAME", "SchemaCatalog", "WriterSchema", "missing_defaults"]

#: Full name of the system schema of deletes (docs/formats.md).
DELETE_SCHEMA_NAME = "fifolane.Delete"


@dataclass(frozen=True, slots=True)
class WriterSchema:
    """A schema records may have been written with, and how to read them.

    ``reader`` is None when the writer schema is the current one: decoding then skips
    schema resolution entirely (the hot path). ``entity`` is None for ``fifolane.Delete``.
    """

    fingerprint: int
    schema: dict[str, Any]
    reader: dict[str, Any] | None
    entity: EntityType | None
    where: str

    @property
    def is_delete(self) -> bool:
        return self.entity is None


def parse(raw: Any, where: str) -> dict[str, Any]:
    """fastavro-parse one raw schema (own named-type namespace), wrapping its errors."""
    try:
        parsed = fastavro.parse_schema(raw, named_schemas={})
    except (SchemaParseException, ValueError, TypeError, KeyError) as exc:
        raise SchemaError(f"{where}: invalid Avro schema: {exc}") from exc
    if not isinstance(parsed, dict):
        raise SchemaError(f"{where}: expected an Avro record schema, got {type(parsed).__name__}")
    return parsed


def schema_fingerprint(parsed: dict[str, Any]) -> int:
    """CRC-64-AVRO fingerprint of a parsed schema's parsing canonical form."""
    return fingerprint64(to_parsing_canonical_form(parsed).encode())


def _load_json(path: Path, where: str) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SchemaError(f"{where}: cannot read schema: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("type") != "record":
        raise SchemaError(f"{where}: expected an Avro record schema (a JSON object with \"type\": \"record\")")
    return raw


def missing_defaults(writer: dict[str, Any], reader: dict[str, Any]) -> list[str]:
    """Reader fields that the writer lacks and that have no default (resolution would fail)."""
    written = {f["name"] for f in writer.get("fields", [])}
    for field in writer.get("fields", []):
        written.update(field.get("aliases", []))
    return [
        f["name"] for f in reader.get("fields", [])
        if f["name"] not in written and not set(f.get("aliases", [])) & written and "default" not in f
    ]


class SchemaCatalog:
    """Entity types by name, writer schemas by fingerprint. Build it with :meth:`load`."""

    def __init__(
        self, types: dict[str, EntityType], writers: dict[int, WriterSchema], delete: WriterSchema
    ) -> None:
        self.types = types
        self.writers = writers
        self.delete = delete
        self.by_full_name = {t.full_name: t for t in types.values()}

    # -- loading -----------------------------------------------------------------------
    @classmethod
    def load(cls, directory: Path | str | None = None) -> SchemaCatalog:
        """Parse and check every schema of ``directory`` (default: the bundled schemas).

        A directory without ``delete.avsc`` gets the bundled ``fifolane.Delete``.
        Raises :class:`SchemaError` naming the file and the fix.
        """
        from schemas import SCHEMAS_DIR

        root = Path(directory) if directory is not None else SCHEMAS_DIR
        if not root.is_dir():
            raise SchemaError(f"schemas directory {root} does not exist; set FIFOLANE_SCHEMAS_DIR")

        def where(path: Path) -> str:
            return f"{root.name}/{path.relative_to(root).as_posix()}"

        types: dict[str, EntityType] = {}
        writers: dict[int, WriterSchema] = {}
        delete: WriterSchema | None = None
        for path in sorted(root.glob("*.avsc")):
            raw = _load_json(path, where(path))
            parsed = parse(raw, where(path))
            fp = schema_fingerprint(parsed)
            full_name = record_full_name(raw)
            if full_name == DELETE_SCHEMA_NAME:
                delete = WriterSchema(fp, parsed, None, None, where(path))
                writers[fp] = delete
                continue
            decl = read_declarations(raw, where(path))
            for other in types.values():
                if other.name == decl.type_name or other.full_name == full_name:
                    raise SchemaError(
                        f"{where(path)}: type '{decl.type_name}' ({full_name}) is also defined by "
                        f"{other.source}; keep one current schema per type and move older "
                        f"versions to {root.name}/history/"
                    )
            entity = EntityType(decl, full_name=full_name, schema=parsed, raw_schema=raw,
                                fingerprint=fp, source=path)
            types[entity.name] = entity
            writers[fp] = WriterSchema(fp, parsed, None, entity, where(path))
        if not types:
            raise SchemaError(f"{root}: no entity schemas (*.avsc) found")
        if delete is None:
            delete = cls._bundled_delete(SCHEMAS_DIR)
            writers[delete.fingerprint] = delete

        by_full_name = {t.full_name: t for t in types.values()}
        history = root / "history"
        for path in sorted(history.rglob("*.avsc")) if history.is_dir() else []:
            raw = _load_json(path, where(path))
            parsed = parse(raw, where(path))
            fp = schema_fingerprint(parsed)
            current = by_full_name.get(record_full_name(raw))
            if current is None:
                raise SchemaError(
                    f"{where(path)}: history schema {record_full_name(raw)} matches no current "
                    f"schema; history files must keep the record name of a type in {root.name}/"
                )
            if fp in writers:  # identical to the current schema (or a duplicate): nothing to resolve
                continue
            missing = missing_defaults(raw, current.raw_schema)
            if missing:
                raise SchemaError(
                    f"{where(path)}: records written with this schema cannot be read as "
                    f"'{current.name}': current field(s) {', '.join(missing)} missing here need "
                    f"a default in {current.source.name if current.source else current.name}"
                )
            writers[fp] = WriterSchema(fp, parsed, current.schema, current, where(path))
        return cls(types, writers, delete)

    @staticmethod
    def _bundled_delete(bundled: Path) -> WriterSchema:
        path = bundled / "delete.avsc"
        raw = _load_json(path, f"{bundled.name}/delete.avsc")
        parsed = parse(raw, str(path))
        return WriterSchema(schema_fingerprint(parsed), parsed, None, None, str(path))

    # -- lookups -----------------------------------------------------------------------
    def entity(self, type_name: str) -> EntityType:
        """The entity type named ``type_name``; UnknownSchemaError listing the known ones."""
        try:
            return self.types[type_name]
        except KeyError:
            raise UnknownSchemaError(
                f"unknown entity type '{type_name}'; known types: {', '.join(sorted(self.types))}"
            ) from None

    def writer(self, fingerprint: int) -> WriterSchema:
        """The writer schema with this CRC-64-AVRO fingerprint."""
        try:
            return self.writers[fingerprint]
        except KeyError:
            raise UnknownSchemaError(
                f"no schema with fingerprint {fingerprint:#018x} in the catalog "
                f"(current or history)"
            ) from None

    def writer_for_schema(self, raw: dict[str, Any], where: str) -> WriterSchema:
        """A WriterSchema for a schema found elsewhere (a registry), resolved to its type."""
        parsed = parse(raw, where)
        fp = schema_fingerprint(parsed)
        known = self.writers.get(fp)
        if known is not None:
            return known
        name = record_full_name(raw)
        if name == DELETE_SCHEMA_NAME:
            return WriterSchema(fp, parsed, self.delete.schema, None, where)
        entity = self.by_full_name.get(name)
        if entity is None:
            raise UnknownSchemaError(
                f"{where}: record {name} is not a known entity type "
                f"(known: {', '.join(sorted(self.by_full_name))})"
            )
        return WriterSchema(fp, parsed, entity.schema, entity, where)

    def validate(self, type_name: str, obj: Any) -> dict[str, Any]:
        """Check a JSON object as an event of ``type_name``; the record ready to encode."""
        return self.entity(type_name).validate(obj)

    def __iter__(self) -> Iterator[EntityType]:
        return iter(self.types.values())

    def __repr__(self) -> str:
        return f"SchemaCatalog(types={sorted(self.types)}, writers={len(self.writers)})"
