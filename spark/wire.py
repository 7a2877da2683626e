"""The state topic's value header (docs/formats.md), read with Spark built-in functions.

Two encodings share the topic: Avro single-object encoding (``C3 01`` + 8-byte little-endian
CRC-64-AVRO fingerprint + body) and the Confluent wire format (``00`` + 4-byte big-endian
schema id + body). Both are split here into a ``writer`` id string and the Avro ``body``,
without a Python UDF (a JVM-side substring is an order of magnitude cheaper than shipping
every value through a Python worker).
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F

__all__ = ["BAD_HEADER", "body_column", "confluent_writer", "soe_writer", "writer_column"]

#: The ``writer`` reported for a value with neither header (the column itself is null).
BAD_HEADER = "(bad header)"
_SOE = "soe:"
_CONFLUENT = "cf:"


def soe_writer(fingerprint: int) -> str:
    """The ``writer`` id of a single-object-encoded value with this fingerprint."""
    return _SOE + fingerprint.to_bytes(8, "little", signed=False).hex().upper()


def confluent_writer(schema_id: int) -> str:
    """The ``writer`` id of a Confluent-framed value with this registry schema id."""
    return f"{_CONFLUENT}{schema_id}"


def _is_soe(value: Column) -> Column:
    return (F.length(value) >= 10) & (F.hex(F.substring(value, 1, 2)) == F.lit("C301"))


def _is_confluent(value: Column) -> Column:
    return (F.length(value) >= 5) & (F.hex(F.substring(value, 1, 1)) == F.lit("00"))


def writer_column(value: Column) -> Column:
    """``soe:<16 hex digits>`` / ``cf:<schema id>``, or null for an unknown header."""
    return (
        F.when(_is_soe(value), F.concat(F.lit(_SOE), F.hex(F.substring(value, 3, 8))))
        .when(
            _is_confluent(value),
            F.concat(F.lit(_CONFLUENT), F.conv(F.hex(F.substring(value, 2, 4)), 16, 10)),
        )
    )


def body_column(value: Column) -> Column:
    """The Avro binary body after the header (null for an unknown header)."""
    # substring(binary, pos, len) is 1-based; a large len takes the rest of the value.
    rest = F.lit(2**31 - 1)
    return (
        F.when(_is_soe(value), F.substring(value, F.lit(11), rest))
        .when(_is_confluent(value), F.substring(value, F.lit(6), rest))
    )
