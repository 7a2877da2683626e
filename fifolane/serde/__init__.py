"""Schemas and value codecs: the catalog of entity types and the two Avro wire formats.

    catalog = SchemaCatalog.load(settings.schemas_dir)
    codec = make_codec(settings, catalog)      # single-object, or Confluent if a registry is set
    data = codec.encode("reservation", record)
    decoded = codec.decode(data)               # Decoded(type, record, is_delete)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fifolane.compiled import activate

activate(__name__, __path__)  # the compiled modules, if built and current (fifolane/compiled.py)

from fifolane.serde.catalog import DELETE_SCHEMA_NAME, SchemaCatalog, WriterSchema  # noqa: E402
from fifolane.serde.codec import Codec, Decoded, SingleObjectCodec  # noqa: E402
from fifolane.serde.entity import EntityType  # noqa: E402

if TYPE_CHECKING:
    from fifolane.config import Settings

__all__ = [
    "DELETE_SCHEMA_NAME",
    "Codec",
    "Decoded",
    "EntityType",
    "SchemaCatalog",
    "SingleObjectCodec",
    "WriterSchema",
    "make_codec",
]


def make_codec(settings: Settings, catalog: SchemaCatalog | None = None) -> Codec:
    """The codec ``settings`` ask for: Confluent wire format when ``schema_registry_url``
    is set, Avro single-object encoding otherwise. Loads the catalog if not given."""
    if catalog is None:
        catalog = SchemaCatalog.load(settings.schemas_dir)
    if settings.schema_registry_url:
        # Imported here: httpx is only needed with a registry.
        from fifolane.serde.confluent import ConfluentCodec, RegistryClient

        return ConfluentCodec(catalog, RegistryClient(settings.schema_registry_url))
    return SingleObjectCodec(catalog)
