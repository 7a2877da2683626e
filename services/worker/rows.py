"""The row format of a partition store (services.worker.state): one entity's latest state
packed as ``version (i64) | flags (u8) | len(group) (u16) | group | value``, or a raw row
(a restored value whose version and group are read later), and the limits that packing sets.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields
from typing import Any

from fifolane.errors import StateError

__all__ = [
    "FLAG_DELETED", "FLAG_RAW", "MAX_GROUP_BYTES", "MAX_VERSION", "MIN_VERSION", "RAW_HEADER",
    "RAW_VERSION", "ROW", "ROW_VERSION", "RestoredRow", "Row", "index_key",
]

ROW = struct.Struct(">qBH")
#: The version at the start of a packed row: ``ROW_VERSION.unpack_from(data)[0]``.
ROW_VERSION = struct.Struct(">q")
FLAG_DELETED = 1
FLAG_RAW = 2
#: The version field of a raw row (see services.worker.state's docstring): check for it before using the
#: version of a packed row, and read the row with PartitionStore.unpack.
RAW_VERSION = -(2**63)
RAW_HEADER = ROW.pack(RAW_VERSION, FLAG_RAW, 0)

#: The longest FIFO-group value a row can hold (its length is packed in 16 bits).
MAX_GROUP_BYTES = 0xFFFF
#: Versions are signed 64-bit integers (Avro long); a row packs them so.
MIN_VERSION, MAX_VERSION = -(2**63) + 1, 2**63 - 1


# init=False and an __init__ of its own, here and in services.worker.effects: compiled with
# mypyc, a dataclass's generated __init__ runs interpreted (~5x slower); this one is native.
@dataclass(slots=True, init=False)
class Row:
    """One entity's latest state; ``value`` is the encoded entity (None when deleted)."""

    version: int
    deleted: bool
    group: str
    value: bytes | None

    def __init__(self, version: int, deleted: bool, group: str, value: bytes | None) -> None:
        self.version = version
        self.deleted = deleted
        self.group = group
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:  # copy and pickle: a compiled class is made through its __init__
        return type(self), tuple(getattr(self, f.name) for f in fields(self))

    def pack(self) -> bytes:
        g = self.group.encode()
        return ROW.pack(self.version, FLAG_DELETED if self.deleted else 0, len(g)) + g + (self.value or b"")

    @staticmethod
    def unpack(data: bytes) -> Row:
        """A packed row (not a raw one: see :meth:`PartitionStore.unpack`)."""
        version, flags, glen = ROW.unpack_from(data)
        if flags & FLAG_RAW:
            raise StateError("a raw row: read it with PartitionStore.unpack")
        start = ROW.size
        group = data[start : start + glen].decode()
        deleted = bool(flags & FLAG_DELETED)
        return Row(version, deleted, group, None if deleted else data[start + glen :])


#: A changelog record for :meth:`PartitionStore.restore_batch`: entity key, version, deleted,
#: group, value (None when deleted); version None: keep it as a raw row.
RestoredRow = tuple[bytes, "int | None", bool, str, "bytes | None"]


def index_key(group: str, ekey: bytes) -> bytes:
    return b"i:" + group.encode() + b"\x00" + ekey
