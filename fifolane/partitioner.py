"""Which partition a key goes to: Java's default partitioner (murmur2), in Python.

Every fifolane producer (``fifolane produce``, the worker's producer) partitions keyed
records with librdkafka's ``murmur2_random`` partitioner, which for a non-null key is the
Java client's default: ``toPositive(murmur2(key)) % partitions``. This module computes the
same function, so a reader can tell where a key lives without producing anything:

    partition_for(b"F-100", 6)   # the input partition of FIFO group "F-100"

The query API routes with it (a group's partition) and the entity directory is keyed the
same way (``<type>/<key>``). Keys produced with librdkafka's old default (``consistent_random``,
CRC32) land elsewhere; see the README ("Partitioning").
"""

from __future__ import annotations

__all__ = ["PARTITIONER", "murmur2", "partition_for"]

#: The librdkafka ``partitioner`` setting that matches Java clients for keyed records.
PARTITIONER = "murmur2_random"

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """``org.apache.kafka.common.utils.Utils.murmur2(data)`` as a signed 32-bit int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    end = length - length % 4
    for i in range(0, end, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(key: bytes | str, partitions: int) -> int:
    """The partition of a keyed record among ``partitions``, as Java's default partitioner
    (and librdkafka's ``murmur2_random``) chooses it."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    raw = key.encode() if isinstance(key, str) else key
    return (murmur2(raw) & 0x7FFFFFFF) % partitions
