"""What a stored row tells about the old state without decoding it (for the equality index).

A worker writes an entity's group into its row, and its key into the row's key. When the
type's group and key fields are plain strings, those equal the old state's fields: the index
can look them up with no decode (:class:`Hints`). If a row ever disagrees (rows not written
as the worker does), the type falls back to decoding, with a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fifolane.serde.entity import EntityType
from listeners.index import lookup
from listeners.plan import Known
from services.worker.sink import Row

__all__ = ["Hints", "string_path"]

log = logging.getLogger(__name__)

Path = tuple[str, ...]
_NONE: tuple[Path | None, Path | None] = (None, None)


def string_path(schema: Any, path: str) -> Path | None:
    """``path`` as a tuple if it names a non-null ``string`` field (through nested records)
    of the Avro record ``schema``, else None."""
    names = tuple(path.split("."))
    node = schema
    for i, name in enumerate(names):
        if not isinstance(node, dict) or node.get("type") != "record":
            return None
        field = next((f for f in node.get("fields", ()) if f.get("name") == name), None)
        if field is None:
            return None
        node = field.get("type")
        if i == len(names) - 1:
            if node == "string" or (isinstance(node, dict) and node.get("type") == "string"
                                    and "logicalType" not in node):  # fmt: skip
                return names
            return None
    return None


class Hints:
    """Per entity type: the old state's group and key fields known from its row."""

    def __init__(self, entity_type: Callable[[str], EntityType | None]) -> None:
        self._entity_type = entity_type
        self._hints: dict[bytes, tuple[Path | None, Path | None]] = {}

    def known(self, tb: bytes, type_: str, key: str, old: Row, new: Row,
              new_rec: Any) -> tuple[Known, ...]:  # fmt: skip
        hint = self._hints.get(tb)
        if hint is None:
            entity = self._entity_type(type_)
            hint = _NONE
            if entity is not None:
                hint = (string_path(entity.schema, entity.group_path),
                        string_path(entity.schema, entity.key_path))  # fmt: skip
            self._hints[tb] = hint
        if hint == _NONE:
            return ()
        gpath, kpath = hint
        if new_rec is not None and (
            (gpath is not None and (new_rec.get(gpath[0]) if len(gpath) == 1
                                    else lookup(new_rec, gpath)) != new.group)
            or (kpath is not None and (new_rec.get(kpath[0]) if len(kpath) == 1
                                       else lookup(new_rec, kpath)) != key)
        ):  # never seen: rows not written like the worker does; decode from now on
            log.warning("listeners: %s rows do not carry their group/key fields as written; "
                        "decoding old states for the index", type_)  # fmt: skip
            self._hints[tb] = _NONE
            return ()
        if gpath is None:
            return ((kpath, key),) if kpath is not None else ()
        if kpath is None:
            return ((gpath, old.group),)
        return ((gpath, old.group), (kpath, key))
