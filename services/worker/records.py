"""Decoded entity records, remembered by their encoded bytes.

A handler reads the same entities again and again (a flight and its load, for every
reservation of the flight), and decoding Avro is the largest cost of a read. Decoding is a
pure function of the bytes, so the decoded record of a value can be kept and handed out
again: as a copy, since a handler owns what it reads. Only flat records are kept (a shallow
copy is then a full one).

Entries are kept by entity key when the caller gives one (one entry per entity: a new
version replaces the old one's, so versions nobody reads again take no room), else by the
value itself. Either way an entry holds the bytes it was decoded from and is used only for
exactly those bytes.

A handler's own write is remembered too, without decoding it, when it is certain that
decoding its bytes gives the same record: its keys are exactly the schema's fields and each
value has exactly the type a decode gives (:func:`fifolane.serde.scan.round_trip_types`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fifolane.serde.scan import round_trip_types

__all__ = ["RecordCache"]

_NESTED = (dict, list)
_MISSING = object()  # its type is in no field's types


class RecordCache:
    """Decoded records by entity key or encoded value (at most ``size``; the oldest half goes
    when full).

    Safe to share between handler threads: every operation is one dict call under the GIL.
    """

    __slots__ = ("_decode", "_records", "_size", "_types")

    def __init__(self, decode: Callable[[bytes], dict[str, Any]], catalog: Any, size: int = 50_000) -> None:
        self._decode = decode
        self._size = size
        self._records: dict[bytes, tuple[bytes, dict[str, Any]]] = {}  # key -> (value, record)
        #: type name -> ((field, exact types), ...) of flat types
        self._types: dict[str, tuple[tuple[str, frozenset[type]], ...]] = {}
        for entity in catalog:
            types = round_trip_types(entity.schema)
            if types is not None:
                self._types[entity.name] = tuple(types.items())

    def read(self, data: bytes, ekey: bytes | None = None) -> dict[str, Any]:
        """The record of an encoded value (of the entity ``ekey``, if given): a copy of the
        remembered one, or decoded now."""
        k = data if ekey is None else ekey
        entry = self._records.get(k)
        if entry is not None and entry[0] == data:
            return dict(entry[1])
        record = self._decode(data)
        for v in record.values():
            if isinstance(v, _NESTED):
                return record  # not flat: a shallow copy would share its parts
        self._keep(k, data, dict(record))
        return record

    def wrote(self, type_name: str, data: bytes, record: dict[str, Any], ekey: bytes | None = None) -> None:
        """A handler wrote ``record`` as ``data`` (the entity ``ekey``, if given): remember
        it if decoding gives it back."""
        if self._decodes_to_itself(type_name, record):
            self._keep(data if ekey is None else ekey, data, dict(record))

    def _decodes_to_itself(self, type_name: str, record: dict[str, Any]) -> bool:
        # Field by field, nothing built (a write of every handler call comes through here).
        fields = self._types.get(type_name)
        if fields is None or len(record) != len(fields):
            return False
        missing = _MISSING  # same count and every field present: the same keys
        return all(type(record.get(name, missing)) in types for name, types in fields)

    def _keep(self, k: bytes, data: bytes, record: dict[str, Any]) -> None:
        records = self._records
        if records.pop(k, None) is None and len(records) >= self._size:
            for old in list(records)[: self._size // 2]:  # insertion order: the oldest first
                records.pop(old, None)
        records[k] = (data, record)  # (re)inserted last: an entity written often stays
