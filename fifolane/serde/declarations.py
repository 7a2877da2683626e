"""Read and check the ``fifolane.*`` attributes of an entity schema (docs/formats.md).

An entity schema declares exactly one FIFO-group field, exactly one key field, one ``long``
version field and at most one group-index field. Declarations are checked once, when the
catalog loads, and every refusal names the schema file and the fix.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fifolane.errors import SchemaError

__all__ = ["Declarations", "read_declarations", "record_full_name"]

GROUP = "fifolane.group"
KEY = "fifolane.key"
VERSION = "fifolane.version"
GROUP_INDEX = "fifolane.group_index"
TYPE = "fifolane.type"

# A group or key value becomes a Kafka key / state-topic key as a string, so it must be a
# scalar with one obvious string form.
_SCALARS = {"string", "int", "long", "enum"}


@dataclass(frozen=True, slots=True)
class Declarations:
    """The roles an entity schema declares, as dotted field paths."""

    type_name: str
    group_path: str
    key_path: str
    version_field: str
    group_index_path: str | None


def record_full_name(schema: dict[str, Any]) -> str:
    """``namespace.name`` of a record schema (the name alone if it has no namespace)."""
    name = str(schema.get("name", ""))
    namespace = schema.get("namespace")
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def _type_label(field_type: Any, named: dict[str, Any]) -> str:
    """The Avro type of a field, seen through ``["null", T]`` and named references."""
    if isinstance(field_type, list):
        branches = [b for b in field_type if b != "null"]
        return _type_label(branches[0], named) if len(branches) == 1 else "union"
    if isinstance(field_type, str):
        if field_type in named:
            return _type_label(named[field_type], named)
        return field_type
    if isinstance(field_type, dict):
        return str(field_type.get("type"))
    return repr(field_type)


def _nested_record(field_type: Any, named: dict[str, Any]) -> dict[str, Any] | None:
    """The record a field holds (directly, by name, or as the one branch beside null)."""
    if isinstance(field_type, list):
        records = [r for b in field_type if (r := _nested_record(b, named)) is not None]
        return records[0] if len(records) == 1 else None
    if isinstance(field_type, str):
        return _nested_record(named[field_type], named) if field_type in named else None
    if isinstance(field_type, dict) and field_type.get("type") == "record":
        return field_type
    return None


def _collect_named(schema: Any, namespace: str, named: dict[str, Any]) -> None:
    """Index named types by short and full name, so field references can be followed."""
    if isinstance(schema, list):
        for branch in schema:
            _collect_named(branch, namespace, named)
    elif isinstance(schema, dict):
        kind = schema.get("type")
        if kind in ("record", "enum", "fixed") and "name" in schema:
            ns = schema.get("namespace", namespace)
            full = record_full_name({"name": schema["name"], "namespace": ns})
            named[full] = schema
            named.setdefault(str(schema["name"]), schema)
            namespace = ns
        if kind == "record":
            for field in schema.get("fields", []):
                _collect_named(field.get("type"), namespace, named)
        elif kind == "array":
            _collect_named(schema.get("items"), namespace, named)
        elif kind == "map":
            _collect_named(schema.get("values"), namespace, named)
        elif isinstance(kind, (dict, list)):
            _collect_named(kind, namespace, named)


def _walk_fields(
    record: dict[str, Any], named: dict[str, Any], prefix: str, seen: frozenset[str]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Yield ``(dotted path, field)`` for every field, descending into nested records."""
    for field in record.get("fields", []):
        path = prefix + str(field.get("name"))
        yield path, field
        nested = _nested_record(field.get("type"), named)
        if nested is not None:
            name = record_full_name(nested)
            if name not in seen:  # recursive types: do not descend forever
                yield from _walk_fields(nested, named, path + ".", seen | {name})


def read_declarations(schema: dict[str, Any], where: str) -> Declarations:
    """Check the fifolane declarations of one raw (unparsed) record schema.

    ``where`` names the schema file in error messages (``schemas/reservation.avsc``).
    Raises :class:`SchemaError` naming the file, the problem and the fix.
    """
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise SchemaError(f"{where}: an entity schema must be an Avro record")
    type_name = str(schema.get(TYPE) or str(schema.get("name", "")).lower())
    named: dict[str, Any] = {}
    _collect_named(schema, str(schema.get("namespace", "")), named)
    root = record_full_name(schema)
    fields = list(_walk_fields(schema, named, "", frozenset({root})))

    def marked(attr: str) -> list[tuple[str, dict[str, Any]]]:
        return [(p, f) for p, f in fields if f.get(attr) is True]

    groups, keys, indexes = marked(GROUP), marked(KEY), marked(GROUP_INDEX)
    prefix = f"{where}: type '{type_name}'"
    if not groups:
        if indexes:
            raise SchemaError(
                f"{prefix} declares a FIFO-group index ('{indexes[0][0]}') without a FIFO-group "
                f"property; mark exactly one field with \"{GROUP}\": true, or remove "
                f"\"{GROUP_INDEX}\""
            )
        raise SchemaError(
            f"{prefix} declares no FIFO-group property; "
            f"mark exactly one field with \"{GROUP}\": true"
        )
    if len(groups) > 1:
        names = ", ".join(f"'{p}'" for p, _ in groups)
        raise SchemaError(
            f"{prefix} declares {len(groups)} FIFO-group properties ({names}); "
            f"keep \"{GROUP}\": true on exactly one field"
        )
    if not keys:
        raise SchemaError(
            f"{prefix} declares no entity key; mark exactly one field with \"{KEY}\": true"
        )
    if len(keys) > 1:
        names = ", ".join(f"'{p}'" for p, _ in keys)
        raise SchemaError(
            f"{prefix} declares {len(keys)} entity keys ({names}); "
            f"keep \"{KEY}\": true on exactly one field"
        )
    if len(indexes) > 1:
        names = ", ".join(f"'{p}'" for p, _ in indexes)
        raise SchemaError(
            f"{prefix} declares {len(indexes)} FIFO-group indexes ({names}); "
            f"keep \"{GROUP_INDEX}\": true on at most one field"
        )
    for role, attr, (path, field) in (("FIFO-group property", GROUP, groups[0]),
                                      ("entity key", KEY, keys[0])):
        label = _type_label(field.get("type"), named)
        if label not in _SCALARS:
            raise SchemaError(
                f"{prefix}: {role} '{path}' has type {label}; \"{attr}\" must be on a "
                f"string, int, long or enum field"
            )

    versions = marked(VERSION)
    if len(versions) > 1:
        names = ", ".join(f"'{p}'" for p, _ in versions)
        raise SchemaError(
            f"{prefix} declares {len(versions)} version fields ({names}); "
            f"keep \"{VERSION}\": true on exactly one long field"
        )
    if not versions:
        versions = [(p, f) for p, f in fields if p == "version"]
    if not versions:
        raise SchemaError(
            f"{prefix} has no version field; add a long field named 'version' or mark one "
            f"long field with \"{VERSION}\": true"
        )
    version_path, version_field = versions[0]
    label = _type_label(version_field.get("type"), named)
    if label != "long":
        raise SchemaError(
            f"{prefix}: version field '{version_path}' has type {label}; it must be a long"
        )
    return Declarations(
        type_name=type_name,
        group_path=groups[0][0],
        key_path=keys[0][0],
        version_field=version_path,
        group_index_path=indexes[0][0] if indexes else None,
    )
