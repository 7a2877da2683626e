"""Static types of listener expressions, from the entity type's Avro schema (registration only).

:func:`avro_type` turns a (fastavro-parsed) Avro schema into a :class:`T`; the checker
(:mod:`listeners.typecheck`) infers the type of every part of an expression from it. Only
what is certain gets a type: a union of several non-null types, a named-type reference, a
logical type this module does not know (or on another base type) and anything else not certain
is ``dyn``, and ``dyn`` is accepted everywhere. A nullable field (a union with ``null``) has the
type of its other member, marked ``nullable``.

How a decoded Avro value reaches CEL: ``int``/``long`` are CEL ``int``, ``float``/``double``
``double``, ``string`` and ``enum`` ``string``, ``bytes``/``fixed`` ``bytes``, ``boolean``
``bool``, ``array`` a list, ``map`` a map with string keys, a nested ``record`` a map whose
keys are its field names (reading another one is a ``KeyError`` at run time). Logical types
(:mod:`listeners.celvalues`): ``date``, ``time-millis``/``time-micros`` and ``uuid`` are
``string`` (ISO), ``timestamp-*``/``local-timestamp-*`` ``timestamp``, ``decimal`` on bytes
``double``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["BOOL", "DYN", "INT", "NULL", "STRING", "T", "avro_type", "meta_type"]


@dataclass(frozen=True, slots=True)
class T:
    """A static type: ``kind`` is one of int, uint, double, string, bytes, bool, null, list,
    map, record, timestamp, duration, type, dyn. ``fields``: a record's fields; ``elem``: a
    list's element or a map's value type; ``key``: a map's key type (None: not known);
    ``name``: a record's type name (for messages)."""

    kind: str
    fields: Mapping[str, T] | None = None
    elem: T | None = None
    nullable: bool = False
    name: str = ""
    key: T | None = None

    @property
    def known(self) -> bool:
        """True unless the type is ``dyn`` (then nothing is refused about it)."""
        return self.kind != "dyn"

    def describe(self) -> str:
        """``double``, ``list of string``, ``record Reservation``, ``double or null``..."""
        if self.kind == "record":
            text = f"record {self.name}" if self.name else "record"
        elif self.kind in ("list", "map") and self.elem is not None and self.elem.known:
            text = f"{self.kind} of {self.elem.describe()}"
        else:
            text = self.kind
        return f"{text} or null" if self.nullable else text


DYN = T("dyn")
NULL = T("null")
BOOL = T("bool")
INT = T("int")
STRING = T("string")

_PRIMITIVES = {"null": NULL, "boolean": BOOL, "int": INT, "long": INT, "float": T("double"),
               "double": T("double"), "bytes": T("bytes"), "string": STRING}  # fmt: skip


#: What listeners.celvalues hands CEL for a logical type on its base type (others: dyn).
#: A decimal is a double in CEL; a local timestamp a timestamp (as UTC).
_LOGICAL = {("date", "int"): STRING, ("time-millis", "int"): STRING, ("time-micros", "long"): STRING,
            ("uuid", "string"): STRING, ("decimal", "bytes"): T("double"),
            **{(f"{p}timestamp-{u}", "long"): T("timestamp")
               for p in ("", "local-") for u in ("millis", "micros")}}  # fmt: skip


def avro_type(schema: Any, depth: int = 0, named: dict[str, T] | None = None) -> T:
    """The static type of values decoded with ``schema`` (``dyn`` when not certain).

    ``named``: the named types (records, enums, fixed) seen so far, by short and full name,
    for later references to them; a record's reference to itself is ``dyn``."""
    named = {} if named is None else named
    if depth > 32:  # a deeply nested schema: stop looking (dyn accepts everything)
        return DYN
    if isinstance(schema, str):
        return _PRIMITIVES.get(schema) or named.get(schema, DYN)
    if isinstance(schema, list):
        members = [avro_type(s, depth + 1, named) for s in schema]
        others = [m for m in members if m.kind != "null"]
        if len(others) == 1:
            return replace(others[0], nullable=len(members) > 1)
        return NULL if not others else DYN
    if not isinstance(schema, dict):
        return DYN
    if "logicalType" in schema:
        lt, base = schema["logicalType"], schema.get("type")
        return _LOGICAL.get((lt, base), DYN) if isinstance(lt, str) and isinstance(base, str) else DYN
    kind = schema.get("type")
    if kind in ("record", "error", "enum", "fixed"):
        if kind in ("record", "error"):
            fields: dict[str, T] = {}
            for f in schema.get("fields") or ():
                if isinstance(f, dict) and isinstance(f.get("name"), str):
                    fields[f["name"]] = avro_type(f.get("type"), depth + 1, named)
            t = T("record", fields, name=str(schema.get("name", "")).rpartition(".")[2])
        else:
            t = STRING if kind == "enum" else T("bytes")
        name, space = schema.get("name"), schema.get("namespace")
        if isinstance(name, str):
            short = name.rpartition(".")[2]
            named[short] = DYN if short in named else t  # a short name of two types: unsure
            named[name if "." in name or not isinstance(space, str) else f"{space}.{name}"] = t
        return t
    if kind == "array":
        return T("list", elem=avro_type(schema.get("items"), depth + 1, named))
    if kind == "map":
        return T("map", elem=avro_type(schema.get("values"), depth + 1, named), key=STRING)  # Avro map keys are strings
    return avro_type(kind, depth + 1, named) if isinstance(kind, (str, list)) else DYN


def meta_type() -> T:
    """``meta``: what :class:`listeners.contexts.Contexts` builds (offset is null in snapshots)."""
    return T("record", {"partition": INT, "offset": replace(INT, nullable=True), "timestamp": INT,
                        "version": INT, "type": STRING}, name="meta")  # fmt: skip
