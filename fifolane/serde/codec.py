"""Value codecs: entity records and deletes to bytes and back.

Two wire formats (docs/formats.md): Avro single-object encoding (here) and the Confluent
wire format (:mod:`fifolane.serde.confluent`). Both share the Avro body code of
:class:`AvroCodec`. This is the hot path of every worker: everything that can be is looked
up once (schemas, prefixes, whether resolution is needed) and a decode is one dict lookup
plus one ``schemaless_reader`` call.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from io import BytesIO
from typing import Any, NamedTuple, Protocol

from fastavro import schemaless_reader, schemaless_writer

from fifolane.errors import SerializationError, UnknownSchemaError
from fifolane.serde.catalog import SchemaCatalog, WriterSchema
from fifolane.serde.entity import EntityType
from fifolane.serde.fingerprint import fingerprint_bytes
from fifolane.serde.flatwrite import FlatWriter, QuickEncoder, compile_writer, explain_refusal
from fifolane.serde.scan import (
    QuickDecoder,
    QuickScanner,
    Reader,
    Scanner,
    Walk,
    compile_reader,
    compile_scanner,
    reads_unchanged,
    record_walk,
)

__all__ = ["AvroCodec", "Codec", "Decoded", "SingleObjectCodec", "SINGLE_OBJECT_MAGIC", "Scan"]

#: ``value -> (entity type, [key, group, version])``, or None: decode it instead
#: (see :meth:`Codec.scanner`).
Scan = Callable[[bytes], "tuple[EntityType, list[Any]] | None"]

SINGLE_OBJECT_MAGIC = b"\xc3\x01"
_SO_HEADER = 10  # magic (2) + fingerprint (8)

#: A Python object's repr in a decoder's message ("cannot read double from <_io.BytesIO object
#: at 0x7f...>"): says nothing to the reader of a dead letter, and differs in every process.
_OBJECT = re.compile(r"\s*(?:from\s+)?<[\w.]+ object at 0x[0-9a-fA-F]+>")


def _decoder_error(exc: Exception) -> str:
    """What a decoder's exception says about the value, for a dead letter's reader."""
    detail = _OBJECT.sub("", str(exc)).strip()
    if isinstance(exc, EOFError):  # fastavro's message is often empty here
        return "the value ends before the record does (truncated?)" + (f": {detail}" if detail else "")
    return f"{type(exc).__name__}: {detail}"


class Decoded(NamedTuple):
    """A decoded value.

    ``type`` is the entity type the value is about, also for a delete (then named by the
    delete's ``entity_type``). ``record`` is the entity record in the type's *current*
    schema, or for a delete the ``fifolane.Delete`` record (``entity_type``, ``key``,
    ``group``, ``version``). ``key``/``group``/``version`` work for both.
    """

    type: EntityType
    record: dict[str, Any]
    is_delete: bool

    @property
    def key(self) -> Any:
        """The entity key (a string for deletes; None if the record lacks it)."""
        return self.record["key"] if self.is_delete else self.type.key_of(self.record)

    @property
    def group(self) -> Any:
        """The FIFO-group value (a string for deletes; None if the record lacks it)."""
        return self.record["group"] if self.is_delete else self.type.group_of(self.record)

    @property
    def version(self) -> Any:
        """The version (None if the record lacks it)."""
        return self.record["version"] if self.is_delete else self.type.version_of(self.record)


class Codec(Protocol):
    """What workers, producers and listeners need from a codec, whatever the wire format."""

    catalog: SchemaCatalog

    def encode(self, type_name: str, record: Mapping[str, Any]) -> bytes:
        """Encode an entity record of ``type_name`` with its current schema."""
        ...

    def encode_delete(self, type_name: str, key: Any, group: Any, version: int) -> bytes:
        """Encode a ``fifolane.Delete`` of one entity (key and group are sent as strings)."""
        ...

    def decode(self, data: bytes) -> Decoded:
        """Decode a value; UnknownSchemaError for an unknown writer schema,
        SerializationError for anything else that is not a valid value."""
        ...

    def decoder(self) -> Callable[[bytes], Decoded]:
        """:meth:`decode` for a hot path: the same answers and errors, maybe faster."""
        ...

    def encoder(self) -> QuickEncoder:
        """:meth:`encode` for a hot path (``encoder().encode(type_name, record)``): the same
        bytes and errors, maybe faster."""
        ...

    def scanner(self, types: Collection[str]) -> Scan:
        """A shortcut for upserts of ``types``: read only the key, group and version of a
        value written with the current schema of its type, or an older one that resolves
        into it unchanged (without building the record). None means "decode it": a delete,
        another type or writer schema, a schema that is not flat, or anything invalid
        (decode() then names the error)."""
        ...


class AvroCodec:
    """Shared Avro body code: subclasses supply the header (prefix) and the writer lookup."""

    catalog: SchemaCatalog

    def __init__(self, catalog: SchemaCatalog) -> None:
        self.catalog = catalog
        #: type name (or _DELETE) -> fast writer of header + body, for flat schemas
        #: (:mod:`fifolane.serde.flatwrite`); filled by subclasses with their headers.
        self._fast: dict[str, FlatWriter] = {}
        #: writer fingerprint -> fast reader of its bodies (:func:`compile_reader`), None if
        #: fastavro reads them (not flat, or resolved into another schema)
        self._readers: dict[int, Reader | None] = {}

    # -- encoding ----------------------------------------------------------------------
    def _prefix(self, type_name: str) -> tuple[bytes, dict[str, Any]]:  # pragma: no cover
        raise NotImplementedError

    def _add_fast(self, type_name: str, prefix: bytes, schema: dict[str, Any]) -> None:
        fast = compile_writer(schema, prefix)
        if fast is not None:
            self._fast[type_name] = fast

    def encode(self, type_name: str, record: Mapping[str, Any]) -> bytes:
        """Encode an entity record of ``type_name`` with its current schema."""
        fast = self._fast.get(type_name)
        if fast is not None:
            try:
                return fast(record)
            except Exception:  # anything unusual: fastavro writes it (same bytes) or refuses it
                pass
        prefix, schema = self._prefix(type_name)  # UnknownSchemaError for unknown types
        return _write(prefix, schema, record, type_name)

    def encoder(self) -> QuickEncoder:
        """:meth:`encode` for a hot path, as ``encoder().encode(type_name, record)``: the same
        bytes and errors, the fast writers called without this class's Python frame."""
        return QuickEncoder(self._fast, self.encode)

    def encode_delete(self, type_name: str, key: Any, group: Any, version: int) -> bytes:
        """Encode a ``fifolane.Delete`` of one entity of ``type_name``."""
        self.catalog.entity(type_name)  # refuse deletes of unknown types at the source
        record = {"entity_type": type_name, "key": str(key), "group": str(group), "version": version}
        return self.encode(_DELETE, record)

    # -- decoding ----------------------------------------------------------------------
    def decoder(self) -> Callable[[bytes], Decoded]:
        """See :meth:`Codec.decoder` (here: :meth:`decode` itself)."""
        return self.decode  # type: ignore[attr-defined, no-any-return]

    def _read(self, writer: WriterSchema, data: bytes, offset: int) -> Decoded:
        try:
            fast = self._readers[writer.fingerprint]
        except KeyError:
            fast = self._readers[writer.fingerprint] = (
                compile_reader(writer.schema) if writer.reader is None else None)
        if fast is not None and type(data) is bytes:  # bytearray, memoryview: fastavro
            found = fast(data, offset)  # None: not sure, fastavro decides (or names the error)
            if found is not None:
                entity = writer.entity
                return _new_decoded(Decoded, (entity, found, False)) if entity is not None else self._delete(found)
        fo = BytesIO(data)
        fo.seek(offset)
        try:
            record: Any = schemaless_reader(fo, writer.schema, writer.reader)
        except Exception as exc:  # fastavro raises many kinds on garbage; map them here, once
            raise SerializationError(
                f"undecodable {writer.entity.name if writer.entity else 'delete'} value "
                f"({len(data)} bytes): {_decoder_error(exc)}"
            ) from exc
        if fo.tell() != len(data):
            raise SerializationError(
                f"undecodable value: {len(data) - fo.tell()} trailing bytes after the record"
            )
        entity = writer.entity
        if entity is not None:
            # tuple.__new__ skips the NamedTuple's Python-level __new__ (hot path).
            return _new_decoded(Decoded, (entity, record, False))
        return self._delete(record)

    def _scanner_of(self, writer: WriterSchema, types: Collection[str]) -> Scanner | None:
        """The field scanner for values of ``writer`` if it is a schema of ``types``: the
        current one, or an older one whose values resolve unchanged into it."""
        entity = writer.entity
        if entity is None or entity.name not in types:
            return None
        if writer.reader is not None and not reads_unchanged(writer.schema, writer.reader):
            return None
        return compile_scanner(writer.schema, (entity.key_path, entity.group_path, entity.version_field))

    def _delete(self, record: dict[str, Any]) -> Decoded:
        entity = self.catalog.types.get(record["entity_type"])
        if entity is None:
            raise UnknownSchemaError(
                f"delete of unknown entity type '{record['entity_type']}'; "
                f"known types: {', '.join(sorted(self.catalog.types))}"
            )
        return Decoded(entity, record, True)


_new_decoded = tuple.__new__

#: Name under which codecs cache the delete schema's encoder (not a valid type name).
_DELETE = "fifolane.Delete"


def _write(prefix: bytes, schema: dict[str, Any], record: Mapping[str, Any], what: str) -> bytes:
    fo = BytesIO()
    fo.write(prefix)
    try:
        schemaless_writer(fo, schema, record)
    except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as exc:
        raise SerializationError(f"cannot encode {what}: {_explain(schema, record, exc)}") from exc
    return fo.getvalue()


def _explain(schema: dict[str, Any], record: Any, exc: Exception) -> str:
    """The field fastavro refused and why, else fastavro's own message."""
    try:
        detail = explain_refusal(schema, record)
    except Exception:  # a record odd enough to break the explanation: fastavro's words
        detail = None
    return detail or str(exc)


class SingleObjectCodec(AvroCodec):
    """Avro single-object encoding: ``C3 01`` + 8-byte LE fingerprint + Avro body.

    Writes with the current schema of each type; reads any writer schema of the catalog
    (current or history) and resolves it into the current schema of its type.
    """

    def __init__(self, catalog: SchemaCatalog) -> None:
        super().__init__(catalog)
        # Precomputed: type name -> (header bytes, parsed schema); raw fingerprint -> writer.
        self._encoders: dict[str, tuple[bytes, dict[str, Any]]] = {
            t.name: (SINGLE_OBJECT_MAGIC + fingerprint_bytes(t.fingerprint), t.schema)
            for t in catalog
        }
        delete = catalog.delete
        self._encoders[_DELETE] = (SINGLE_OBJECT_MAGIC + fingerprint_bytes(delete.fingerprint),
                                   delete.schema)
        for name, (prefix, schema) in self._encoders.items():
            self._add_fast(name, prefix, schema)
        self._writers: dict[bytes, WriterSchema] = {
            fingerprint_bytes(fp): w for fp, w in catalog.writers.items()
        }

    def __repr__(self) -> str:
        return f"SingleObjectCodec({self.catalog!r})"

    def _prefix(self, type_name: str) -> tuple[bytes, dict[str, Any]]:
        try:
            return self._encoders[type_name]
        except KeyError:
            raise UnknownSchemaError(
                f"unknown entity type '{type_name}'; known types: "
                f"{', '.join(sorted(self.catalog.types))}"
            ) from None

    def decode(self, data: bytes) -> Decoded:
        """Decode a single-object-encoded value (entity or delete)."""
        if data is None:
            raise SerializationError("no value (null / tombstone) to decode")
        if data[:2] != SINGLE_OBJECT_MAGIC:
            raise SerializationError(
                f"not Avro single-object encoding: starts with {bytes(data[:2]).hex() or 'nothing'}"
                f", expected c301"
            )
        if len(data) < _SO_HEADER:
            raise SerializationError(
                f"truncated single-object header: {len(data)} bytes, need {_SO_HEADER}"
            )
        writer = self._writers.get(data[2:_SO_HEADER])
        if writer is None:
            fp = int.from_bytes(data[2:_SO_HEADER], "little")
            raise UnknownSchemaError(
                f"unknown writer schema fingerprint {fp:#018x}: not in the catalog "
                f"(add the schema, or an older version of it to schemas/history/)"
            )
        return self._read(writer, data, _SO_HEADER)

    def decoder(self) -> Callable[[bytes], Decoded]:
        """See :meth:`Codec.decoder`: values of the current flat schemas are read by a
        compiled walk (:class:`fifolane.serde.scan.QuickDecoder`), the rest by :meth:`decode`."""
        table: dict[bytes, tuple[EntityType, Walk]] = {}
        for fp, writer in self._writers.items():
            walk = record_walk(writer.schema) if writer.reader is None and writer.entity is not None else None
            if walk is not None:
                assert writer.entity is not None
                table[fp] = (writer.entity, walk)
        return QuickDecoder(self.decode, Decoded, SINGLE_OBJECT_MAGIC, _SO_HEADER - len(SINGLE_OBJECT_MAGIC), table)

    def scanner(self, types: Collection[str]) -> Scan:
        """See :meth:`Codec.scanner`."""
        table: dict[bytes, tuple[EntityType, Scanner]] = {}
        for fp, writer in self._writers.items():
            fn = self._scanner_of(writer, types)
            if fn is not None:
                assert writer.entity is not None
                table[fp] = (writer.entity, fn)
        return QuickScanner(SINGLE_OBJECT_MAGIC, _SO_HEADER - len(SINGLE_OBJECT_MAGIC), table)
