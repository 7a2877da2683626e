"""Checks of a listener against the entity schemas, at registration only.

:func:`check_registration` runs in :func:`listeners.registry.register` (the CLI's path too),
before anything is written: an unknown ``type`` is refused with the known types and the
closest one; the filter and the converter are type-checked against the type's Avro schema
(:mod:`listeners.typecheck`: unknown fields, operators that never fit their operands, a
division by a literal zero, map keys CEL refuses, a filter that is not a bool, a converter
that is not a map). A listener without a type has ``value`` and ``old`` of unknown type
(``dyn``): only what is wrong whatever the record is refused.

Workers never run these checks: registrations already in the registry (from older versions,
from other clients) keep working as before.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING

from fifolane.config import Settings
from fifolane.errors import ExpressionError, ListenerError, SchemaError
from fifolane.serde.catalog import SchemaCatalog
from listeners._lexer import LexError, tokenize
from listeners._parser import ParseError, parse
from listeners.static_types import DYN, STRING, T, avro_type, meta_type
from listeners.typecheck import StaticError, check

if TYPE_CHECKING:
    from listeners.model import ListenerSpec

__all__ = ["check_expression", "check_registration", "load_catalog"]


def load_catalog(settings: Settings) -> SchemaCatalog:
    """The entity types workers know (``FIFOLANE_SCHEMAS_DIR``); ListenerError if unreadable."""
    try:
        return SchemaCatalog.load(settings.schemas_dir)
    except SchemaError as exc:
        raise ListenerError(f"cannot check the listener's type against the entity schemas: {exc}") from None


def _entity(catalog: SchemaCatalog, name: str) -> T:
    entity = catalog.types.get(name)
    if entity is None:
        known = sorted(catalog.types)
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ListenerError(f"unknown entity type {name!r}{hint} (known types: {', '.join(known)}); "
                            f"give one of them with --type, or leave --type out for every type")  # fmt: skip
    t = avro_type(entity.raw_schema)
    return T(t.kind, t.fields, t.elem, nullable=True, name=entity.name) if t.kind == "record" else DYN


def check_expression(src: str, role: str, value: T = DYN) -> None:
    """Type-check one filter or converter (``value``/``old`` typed ``value``); raise
    :class:`ExpressionError` with the position of the offending part. An expression the
    analyser cannot parse is not checked here (the CEL library accepted it)."""
    try:
        root = parse(tokenize(src))
    except (LexError, ParseError):
        return
    env = {"key": STRING, "kind": STRING, "meta": meta_type(), "value": value, "old": value}
    try:
        check(src, root, role, env)
    except StaticError as exc:
        raise ExpressionError(f"invalid {role}: {exc} (at offset {exc.position})", expression=src,
                              position=min(exc.position, len(src))) from None  # fmt: skip
    except RecursionError:  # bounded by the cost checks; be safe anyway
        return


def check_registration(spec: ListenerSpec, catalog: SchemaCatalog | None) -> None:
    """Refuse a registration that can never work (see the module docstring).

    ``catalog``: the entity types (needed when ``spec.type`` is set; None: the type and the
    fields are not checked). Raises :class:`ListenerError` or :class:`ExpressionError`.
    """
    value = _entity(catalog, spec.type) if spec.type is not None and catalog is not None else DYN
    check_expression(spec.filter, "filter", value)
    if spec.convert is not None:
        check_expression(spec.convert, "converter", value)
