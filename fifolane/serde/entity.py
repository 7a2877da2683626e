"""An entity type: one current Avro schema plus its fifolane roles and fast accessors."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fifolane.errors import ValidationError
from fifolane.serde.declarations import Declarations, _collect_named, _nested_record
from fifolane.serde.validation import Validator, _Compiler

__all__ = ["EntityType", "Getter", "path_getter"]

#: ``record -> value or None``; never raises on a missing field.
Getter = Callable[[Mapping[str, Any]], Any]


def path_getter(path: str) -> Getter:
    """A fast accessor for a dotted field path; None when any step is missing or null."""
    parts = path.split(".")
    if len(parts) == 1:
        name = parts[0]

        def get_top(record: Mapping[str, Any]) -> Any:
            return record.get(name)

        return get_top

    def get_nested(record: Mapping[str, Any]) -> Any:
        value: Any = record
        for part in parts:
            if not isinstance(value, Mapping):
                return None
            value = value.get(part)
        return value

    return get_nested


class EntityType:
    """A fifolane entity type (``reservation``, ``flight``) and its current schema.

    ``schema`` is the fastavro-parsed current schema: the writer schema for encoding and the
    reader schema for decoding. ``group_of``/``key_of``/``version_of`` are precompiled
    accessors that return None when the field is missing.
    """

    __slots__ = (
        "name", "full_name", "schema", "raw_schema", "fingerprint", "source",
        "group_path", "key_path", "version_field", "group_index_path",
        "group_of", "key_of", "version_of", "group_index_of",
        "_validate", "_leaf_validators",
    )

    def __init__(
        self,
        declarations: Declarations,
        *,
        full_name: str,
        schema: dict[str, Any],
        raw_schema: dict[str, Any],
        fingerprint: int,
        source: Path | None = None,
    ) -> None:
        self.name = declarations.type_name
        self.full_name = full_name
        self.schema = schema
        self.raw_schema = raw_schema
        self.fingerprint = fingerprint
        self.source = source
        self.group_path = declarations.group_path
        self.key_path = declarations.key_path
        self.version_field = declarations.version_field
        self.group_index_path = declarations.group_index_path
        self.group_of: Getter = path_getter(self.group_path)
        self.key_of: Getter = path_getter(self.key_path)
        self.version_of: Getter = path_getter(self.version_field)
        self.group_index_of: Getter | None = (
            path_getter(self.group_index_path) if self.group_index_path else None
        )
        compiler = _Compiler()
        self._validate: Validator = compiler.compile(raw_schema)
        self._leaf_validators = {
            path: _leaf_validator(raw_schema, path, compiler)
            for path in {self.group_path, self.key_path, self.version_field}
        }

    def __repr__(self) -> str:
        return (
            f"EntityType({self.name!r}, full_name={self.full_name!r}, "
            f"group={self.group_path!r}, key={self.key_path!r}, version={self.version_field!r}, "
            f"fingerprint={self.fingerprint:#018x})"
        )

    def validate(self, obj: Any) -> dict[str, Any]:
        """Check a JSON object against the schema; the record to encode, defaults filled in.

        Raises :class:`ValidationError` with the field and the reason
        (``field 'seats': expected int, got 'two'``).
        """
        if not isinstance(obj, dict):
            raise ValidationError(f"expected a JSON object for type '{self.name}', got {type(obj).__name__}")
        record: dict[str, Any] = self._validate(obj, "")
        return record

    def delete_record(self, obj: Any) -> dict[str, Any]:
        """The ``fifolane.Delete`` record for a JSON delete event of this type.

        Only the key, group and version fields are needed (and checked); other fields of
        the type are allowed and ignored, unknown fields are refused.
        """
        if not isinstance(obj, dict):
            raise ValidationError(f"expected a JSON object for type '{self.name}', got {type(obj).__name__}")
        top = {f["name"] for f in self.raw_schema.get("fields", [])}
        extra = obj.keys() - top
        if extra:
            raise ValidationError(
                f"field '{min(extra)}': unknown field (fields of {self.name}: {', '.join(sorted(top))})"
            )
        values = {}
        for role, path in (("entity key", self.key_path), ("FIFO-group property", self.group_path),
                           ("version", self.version_field)):
            value = path_getter(path)(obj)
            if value is None:
                raise ValidationError(f"field '{path}': missing (a delete needs the {role})")
            values[path] = self._leaf_validators[path](value, path)
        return {
            "entity_type": self.name,
            "key": str(values[self.key_path]),
            "group": str(values[self.group_path]),
            "version": values[self.version_field],
        }


def _leaf_validator(raw_schema: dict[str, Any], path: str, compiler: _Compiler) -> Validator:
    """The validator of the field at a dotted path (named types resolved by ``compiler``)."""
    named: dict[str, Any] = {}
    _collect_named(raw_schema, str(raw_schema.get("namespace", "")), named)
    record: dict[str, Any] | None = raw_schema
    namespace = str(raw_schema.get("namespace", ""))
    parts = path.split(".")
    for i, part in enumerate(parts):
        assert record is not None  # guaranteed by read_declarations, which found the path
        namespace = str(record.get("namespace", namespace))
        field = next(f for f in record["fields"] if f["name"] == part)
        if i == len(parts) - 1:
            return compiler.compile(field["type"], namespace)
        record = _nested_record(field["type"], named)
    raise AssertionError(f"empty path {path!r}")
