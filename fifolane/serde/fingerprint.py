"""CRC-64-AVRO (Rabin) fingerprints, the schema id of Avro single-object encoding."""

from __future__ import annotations

__all__ = ["fingerprint64", "fingerprint_bytes"]

_EMPTY = 0xC15D213AA4D7A795


def _table() -> tuple[int, ...]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (_EMPTY & -(fp & 1))
        table.append(fp)
    return tuple(table)


_TABLE = _table()


def fingerprint64(data: bytes) -> int:
    """The 64-bit CRC-64-AVRO fingerprint of ``data`` (a schema's parsing canonical form)."""
    fp = _EMPTY
    for byte in data:
        fp = (fp >> 8) ^ _TABLE[(fp ^ byte) & 0xFF]
    return fp


def fingerprint_bytes(fingerprint: int) -> bytes:
    """The 8 bytes of a fingerprint as written on the wire: little-endian (Avro spec)."""
    return fingerprint.to_bytes(8, "little")
