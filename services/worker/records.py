"""Decoded entity records, remembered by their encoded bytes.

A handler reads the same entities again and again (a flight and its load, for every
reservation of the flight), and decoding Avro is the largest cost of a read. Decoding is a
pure function of the bytes, so the decoded record of a value can be kept and handed out
again: as a copy, since a handler owns what it reads. Only flat records are kept (a shallow
copy is then a full one).

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
    """Decoded records by encoded value (at most ``size``; the oldest half goes when full).

    Safe to share between handler threads: every operation is one dict call under the GIL.
    """

    __slots__ = ("_decode", "_records", "_size", "_types")

    def __init__(self, decode: Callable[[bytes], dict[str, Any]], catalog: Any, size: int = 20_000) -> None:
        self._decode = decode
        self._size = size
        self._records: dict[bytes, dict[str, Any]] = {}
        #: type name -> ((field, exact types), ...) of flat types
        self._types: dict[str, tuple[tuple[str, frozenset[type]], ...]] = {}
        for entity in catalog:
            types = round_trip_types(entity.schema)
            if types is not None:
                self._types[entity.name] = tuple(types.items())

    def read(self, data: bytes) -> dict[str, Any]:
        """The record of an encoded value: a copy of the remembered one, or decoded now."""
        record = self._records.get(data)
        if record is not None:
            return dict(record)
        record = self._decode(data)
        for v in record.values():
            if isinstance(v, _NESTED):
                return record  # not flat: a shallow copy would share its parts
        self._keep(data, dict(record))
        return record

    def wrote(self, type_name: str, data: bytes, record: dict[str, Any]) -> None:
        """A handler wrote ``record`` as ``data``: remember it if decoding gives it back."""
        fields = self._types.get(type_name)
        if fields is None or len(record) != len(fields):
            return
        missing = _MISSING
        for name, types in fields:  # same count and every field present: the same keys
            if type(record.get(name, missing)) not in types:
                return
        self._keep(data, dict(record))

    def _keep(self, data: bytes, record: dict[str, Any]) -> None:
        records = self._records
        if len(records) >= self._size:
            for old in list(records)[: self._size // 2]:  # insertion order: the oldest first
                records.pop(old, None)
        records[data] = record
