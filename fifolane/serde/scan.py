"""Read a few top-level fields of a flat Avro record without decoding the rest.

A worker's table handler needs only the key, group and version of an upsert: the value
bytes go to the state topic as they are. Decoding the whole record with fastavro (a dict,
a string per field) is the largest cost per event, so for flat records (fields of
primitive types, enums, fixed and unions of those, no logical types) a
:func:`compile_scanner` walks the body field by field instead, keeping only the wanted
fields. It still checks everything a decode checks: string lengths and UTF-8, enum and
union indexes, no bytes missing or left over.

:func:`compile_reader` is the same walk keeping every field: the whole record, as fastavro
decodes it. The codecs read values of a current flat schema with it (fifolane.serde.codec):
compiled (fifolane.compiled), 0.7 us for a reservation against fastavro's 1.7.

A scanner (or reader) is only ever a shortcut. It answers None for anything it is not sure of (a
corrupt body, an unusual encoding), and the caller then decodes normally, which gives
the real answer or the error. So a record a scanner accepts is one fastavro accepts,
with the same values for the wanted fields; the tests check that on random and
corrupted records.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from fifolane.serde.catalog import missing_defaults

__all__ = ["QuickDecoder", "QuickScanner", "Reader", "Scanner", "Walk", "compile_reader", "compile_scanner", "reads_unchanged",
           "record_walk", "round_trip_types"]

#: ``(data, offset of the body) -> the wanted values in the order asked, or None``.
Scanner = Callable[[bytes, int], "list[Any] | None"]
#: ``(data, offset of the body) -> the whole record, or None``.
Reader = Callable[[bytes, int], "dict[str, Any] | None"]

# Field kinds: below _DOUBLE a zig-zag varint comes first (a value, an enum index or a
# length); _DOUBLE up to _FIXED are fixed sizes (the size is the op's argument).
_STRING, _LONG, _ENUM, _BYTES, _DOUBLE, _FLOAT, _FIXED, _BOOLEAN, _NULL, _UNION = range(10)

_PRIMITIVES: dict[str, tuple[int, Any]] = {
    "string": (_STRING, None), "long": (_LONG, None), "int": (_LONG, None),
    "double": (_DOUBLE, 8), "float": (_FLOAT, 4), "bytes": (_BYTES, None),
    "boolean": (_BOOLEAN, None), "null": (_NULL, None),
}

#: Kinds whose value a scanner returns (floats are skipped, never converted); a reader
#: returns every kind.
_RETURNABLE = {_STRING, _LONG, _ENUM, _BYTES, _BOOLEAN, _NULL}

_unpack_double = struct.Struct("<d").unpack_from
_unpack_float = struct.Struct("<f").unpack_from

#: A varint of at most this many bits of payload (9 bytes) always fits an Avro long.
_MAX_SHIFT = 56


def _kind(schema: Any) -> tuple[int, Any] | None:
    """(kind, argument) of a field type; None if a scanner does not handle it."""
    if isinstance(schema, str):
        return _PRIMITIVES.get(schema)
    if isinstance(schema, dict):
        if "logicalType" in schema:
            return None  # decoded into other Python types; leave those to fastavro
        t = schema.get("type")
        if t == "enum":
            return _ENUM, tuple(schema["symbols"])
        if t == "fixed":
            return _FIXED, int(schema["size"])
        return _PRIMITIVES.get(t) if isinstance(t, str) else None
    if isinstance(schema, list):
        branches = [_kind(b) for b in schema]
        if not branches or any(b is None or b[0] == _UNION for b in branches):
            return None
        return _UNION, tuple(branches)
    return None


def _returnable(kind: tuple[int, Any]) -> bool:
    if kind[0] == _UNION:
        return all(b[0] in _RETURNABLE for b in kind[1])
    return kind[0] in _RETURNABLE


def compile_scanner(schema: dict[str, Any], wanted: Sequence[str]) -> Scanner | None:
    """A scanner for records of the fastavro-parsed ``schema`` that returns the values of
    the top-level fields ``wanted`` (a name may be asked for twice, say a key that is also
    the group); None if the schema is not flat enough or lacks one of them."""
    if schema.get("type") != "record":
        return None
    fields = schema.get("fields") or []
    names = [f.get("name") for f in fields]
    if any(w not in names for w in wanted):
        return None
    unique = list(dict.fromkeys(wanted))
    if len(unique) < len(wanted):
        inner = compile_scanner(schema, unique)
        if inner is None:
            return None
        positions = [unique.index(w) for w in wanted]

        def scan_repeated(data: bytes, pos: int) -> list[Any] | None:
            values = inner(data, pos)
            return None if values is None else [values[i] for i in positions]

        return scan_repeated
    ops: list[tuple[int, Any, int]] = []
    for field in fields:
        kind = _kind(field.get("type"))
        name = field["name"]
        if kind is None or (name in wanted and not _returnable(kind)):
            return None
        ops.append((kind[0], kind[1], wanted.index(name) if name in wanted else -1))
    # A partial object, not a closure: one Python call per record instead of two.
    return partial(_scan, tuple(ops), len(wanted))


#: A compiled walk over every field of a record schema: (ops, field names).
Walk = tuple[tuple[tuple[int, Any, int], ...], tuple[str, ...]]


def record_walk(schema: dict[str, Any]) -> Walk | None:
    """The walk of :func:`compile_reader` (None if the schema is not flat enough)."""
    if schema.get("type") != "record":
        return None
    fields = schema.get("fields") or []
    ops: list[tuple[int, Any, int]] = []
    for slot, field in enumerate(fields):
        kind = _kind(field.get("type"))
        if kind is None:
            return None
        ops.append((kind[0], kind[1], slot))
    return tuple(ops), tuple(str(f["name"]) for f in fields)


def compile_reader(schema: dict[str, Any]) -> Reader | None:
    """A reader of whole records of the fastavro-parsed flat record ``schema``: the record
    fastavro's ``schemaless_reader(fo, schema, None)`` gives for the body (the same field
    order, values and types), or None for anything it is not sure of; None if the schema is
    not flat enough."""
    walk = record_walk(schema)
    return None if walk is None else partial(_read, walk[0], walk[1])


def _read(ops: tuple[tuple[int, Any, int], ...], names: tuple[str, ...], data: bytes,
          pos: int) -> dict[str, Any] | None:
    values = _scan(ops, len(names), data, pos)
    if values is None:
        return None
    record: dict[str, Any] = {}
    for i, name in enumerate(names):
        record[name] = values[i]
    return record


_tuple_new = tuple.__new__


class QuickDecoder:
    """A codec's ``decode`` with a shortcut: a value that is ``magic`` + the id of a schema
    in ``table`` (``id_len`` bytes) + a body its walk reads is decoded here, as
    ``decoded((entity, record, False))``; anything else (deletes, older schemas, anything
    the walk is not sure of, errors) goes to ``decode``, which gives the same answer or
    names the error. One compiled call instead of the codec's Python frames."""

    __slots__ = ("_decode", "_decoded", "_magic", "_start", "_end", "_table")

    def __init__(self, decode: Callable[[bytes], Any], decoded: type, magic: bytes, id_len: int,
                 table: dict[bytes, tuple[Any, Walk]]) -> None:
        self._decode = decode
        self._decoded = decoded
        self._magic = magic
        self._start = len(magic)
        self._end = len(magic) + id_len
        self._table = table

    def __call__(self, data: Any) -> Any:  # Any: None and the like get decode()'s error
        if type(data) is bytes and data[: self._start] == self._magic:
            found = self._table.get(data[self._start : self._end])
            if found is not None:
                walk = found[1]
                record = _read(walk[0], walk[1], data, self._end)
                if record is not None:
                    return _tuple_new(self._decoded, (found[0], record, False))
        return self._decode(data)


class QuickScanner:
    """A codec's ``scanner`` as one compiled call per record: for a value that is ``magic``
    + the id of a schema in ``table`` (``id_len`` bytes) + a body that schema's scanner reads,
    ``(entity, [wanted values])``; None for anything else (the caller decodes it then)."""

    __slots__ = ("_magic", "_start", "_end", "_table")

    def __init__(self, magic: bytes, id_len: int, table: dict[bytes, tuple[Any, Scanner]]) -> None:
        self._magic = magic
        self._start = len(magic)
        self._end = len(magic) + id_len
        self._table = table

    def __call__(self, data: Any) -> tuple[Any, list[Any]] | None:  # Any: None and the like give None
        if type(data) is bytes and data[: self._start] == self._magic:
            found = self._table.get(data[self._start : self._end])
            if found is not None:
                values = found[1](data, self._end)
                if values is not None:
                    return found[0], values
        return None


def _scan(ops: tuple[tuple[int, Any, int], ...], n_wanted: int, data: bytes, pos: int) -> list[Any] | None:
    # The hot loop of a table worker: one pass, inlined varints, no helper calls for the
    # common kinds. Data too short (IndexError) or not UTF-8 (UnicodeDecodeError): None.
    try:
        out: list[Any] = [None] * n_wanted
        end = len(data)
        for kind, arg, slot in ops:
            if kind == _UNION:
                b = data[pos]
                pos += 1
                if b & 0x80:
                    return None  # over 63 branches: not worth a fast path
                index = (b >> 1) ^ -(b & 1)
                if not 0 <= index < len(arg):
                    return None
                kind, arg = arg[index]
            if kind < _DOUBLE:
                # a zig-zag varint: the value of a long/int, an enum index, a string/bytes length
                b = data[pos]
                pos += 1
                if b & 0x80:
                    n = b & 0x7F
                    shift = 7
                    while True:
                        b = data[pos]
                        pos += 1
                        n |= (b & 0x7F) << shift
                        if not b & 0x80:
                            break
                        shift += 7
                        if shift > _MAX_SHIFT:
                            return None
                else:
                    n = b
                n = (n >> 1) ^ -(n & 1)
                if kind == _STRING:
                    stop = pos + n
                    if n < 0 or stop > end:
                        return None
                    text = data[pos:stop].decode()  # UnicodeDecodeError: not UTF-8, as fastavro
                    if slot >= 0:
                        out[slot] = text
                    pos = stop
                elif kind == _LONG:
                    if slot >= 0:
                        out[slot] = n
                elif kind == _ENUM:
                    if not 0 <= n < len(arg):
                        return None
                    if slot >= 0:
                        out[slot] = arg[n]
                else:  # bytes
                    stop = pos + n
                    if n < 0 or stop > end:
                        return None
                    if slot >= 0:
                        out[slot] = data[pos:stop]
                    pos = stop
            elif kind < _BOOLEAN:
                stop = pos + arg
                if stop > end:
                    return None
                if slot >= 0:  # only a reader asks for these
                    if kind == _DOUBLE:
                        out[slot] = _unpack_double(data, pos)[0]
                    elif kind == _FLOAT:
                        out[slot] = _unpack_float(data, pos)[0]
                    else:
                        out[slot] = data[pos:stop]
                pos = stop
            elif kind == _BOOLEAN:
                b = data[pos]
                pos += 1
                if b > 1:
                    return None
                if slot >= 0:
                    out[slot] = b == 1
            # _NULL: nothing to read (its value, None, is already in ``out``)
        if pos != end:
            return None
        return out
    except (IndexError, UnicodeDecodeError):
        return None


#: The Python type a decode gives for each kind, where encoding any value of exactly that
#: type and decoding it again gives an equal value (float32 does not round-trip: absent).
_EXACT: dict[int, type] = {_STRING: str, _LONG: int, _ENUM: str, _BYTES: bytes, _DOUBLE: float,
                           _FIXED: bytes, _BOOLEAN: bool, _NULL: type(None)}


def round_trip_types(schema: dict[str, Any]) -> dict[str, frozenset[type]] | None:
    """For a flat record schema: field name -> the exact Python types of its values for
    which ``decode(encode(record)) == record`` (given the record encodes at all). A record
    whose keys are exactly the fields and whose values are of these exact types (``type(v)``,
    so no bool for an int) decodes to itself; None if the schema is not flat enough."""
    if schema.get("type") != "record":
        return None
    out: dict[str, frozenset[type]] = {}
    for field in schema.get("fields") or []:
        kind = _kind(field.get("type"))
        if kind is None:
            return None
        branches = kind[1] if kind[0] == _UNION else (kind,)
        types = [_EXACT.get(b[0]) for b in branches]
        if any(t is None for t in types):
            return None
        exact = {t for t in types if t is not None}
        kinds = [b[0] for b in branches]
        if _LONG in kinds and _DOUBLE in kinds:
            # A union writes a value into the first branch that takes it, and a double takes
            # an int: 5 is written as 5.0 when the double comes first, and an int too large
            # for the int (or long) branch is written as a double whatever the order.
            exact.discard(int)
        out[field["name"]] = frozenset(exact)
    return out


def reads_unchanged(writer: dict[str, Any], reader: dict[str, Any]) -> bool:
    """Whether every body of the record schema ``writer`` resolves into ``reader`` with the
    same values in the fields both have, and never fails: same record name, no aliases,
    each shared field of the same flat type (an enum may gain symbols), and a default for
    each field the writer lacks. Then a field scanner of the writer schema answers what a
    decode into ``reader`` would (the fields the reader adds come from their defaults, the
    ones it dropped are skipped)."""
    if writer.get("type") != "record" or writer.get("name") != reader.get("name"):
        return False
    wfields, rfields = writer.get("fields") or [], reader.get("fields") or []
    if any(f.get("aliases") for f in (*wfields, *rfields)):
        return False
    if missing_defaults(writer, reader):
        return False  # resolution fails: decode() names the missing field
    by_name = {f["name"]: f for f in rfields}
    return all(f["name"] not in by_name or _same_type(f["type"], by_name[f["name"]]["type"])
               for f in wfields)


def _same_type(w: Any, r: Any) -> bool:
    if isinstance(w, list) or isinstance(r, list):
        return (isinstance(w, list) and isinstance(r, list) and len(w) == len(r)
                and all(_same_type(a, b) for a, b in zip(w, r, strict=True)))
    if isinstance(w, dict) and isinstance(r, dict):
        if "logicalType" in w or "logicalType" in r or w.get("type") != r.get("type"):
            return False
        kind = w.get("type")
        if kind == "enum":
            return w.get("name") == r.get("name") and set(w["symbols"]) <= set(r["symbols"])
        if kind == "fixed":
            return w.get("name") == r.get("name") and w.get("size") == r.get("size")
        return kind in _FLAT
    w = w.get("type") if isinstance(w, dict) and set(w) == {"type"} else w
    r = r.get("type") if isinstance(r, dict) and set(r) == {"type"} else r
    return isinstance(w, str) and w == r and w in _FLAT


#: Avro primitive types (a named type referred to by name is not compared: scanners decline it).
_FLAT = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
