"""The decoded-record cache of handler reads (services/worker/records.py) and the committed
rows a partition keeps in memory (PartitionStore.recent): what they hand out is always what
decoding / RocksDB would give, and a handler can never change what another one reads."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from fifolane.config import Settings
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.serde.scan import round_trip_types
from services.worker.records import RecordCache
from services.worker.state import Row, StoreManager

CATALOG = SchemaCatalog.load()
CODEC = make_codec(Settings(), CATALOG)


def _res(**over: Any) -> dict[str, Any]:
    rec = {"reservation_id": "R1", "flight_number": "F1", "customer_id": "c1", "seats": 2,
           "amount": 20.0, "state": "NEW", "version": 3}
    rec.update(over)
    return rec


def _cache() -> tuple[RecordCache, list[bytes]]:
    decoded: list[bytes] = []

    def decode(data: bytes) -> dict[str, Any]:
        decoded.append(data)
        return CODEC.decode(data).record  # type: ignore[no-any-return]

    return RecordCache(decode, CATALOG, size=4), decoded


def test_reads_are_decoded_once_and_handed_out_as_copies() -> None:
    cache, decoded = _cache()
    data = CODEC.encode("reservation", _res())
    first = cache.read(data)
    first["seats"] = 99  # a handler changes what it read
    second = cache.read(data)
    assert second == _res() and second is not first
    assert decoded == [data]


@pytest.mark.parametrize("written,kept", [
    (_res(), True),
    (_res(amount=20), False),  # an int for a double: decoding gives 20.0
    (_res(seats=True), False),  # a bool for an int
    ({k: v for k, v in _res().items() if k != "customer_id"}, False),  # a field left to its default
    ({**_res(), "extra": 1}, False),  # a key the schema does not have
    (_res(amount=math.inf), True),
])
def test_a_write_is_remembered_only_when_decoding_gives_it_back(written: dict[str, Any], kept: bool) -> None:
    cache, decoded = _cache()
    try:
        data = CODEC.encode("reservation", written)
    except Exception:  # noqa: BLE001 - fastavro refuses some of them: nothing to remember
        assert not kept
        return
    cache.wrote("reservation", data, written)
    got = cache.read(data)
    assert decoded == ([] if kept else [data])
    assert got == CODEC.decode(data).record
    written.clear()  # the writer's dict is not the cache's
    assert cache.read(data) == got


def test_the_cache_stays_bounded() -> None:
    cache, decoded = _cache()
    values = [CODEC.encode("reservation", _res(version=v)) for v in range(10)]
    for data in values:
        cache.read(data)
    assert len(cache._records) <= 4  # noqa: SLF001 - the bound is the point of this test
    assert cache.read(values[-1])["version"] == 9 and len(decoded) == 10


def test_round_trip_types_of_the_catalog() -> None:
    types = round_trip_types(CATALOG.entity("reservation").schema)
    assert types is not None and types["amount"] == frozenset({float}) and types["seats"] == frozenset({int})
    assert round_trip_types({"type": "record", "fields": [{"name": "f", "type": "float"}]}) is None
    assert round_trip_types({"type": "record", "fields": [{"name": "t", "type": {"type": "long", "logicalType": "timestamp-millis"}}]}) is None


def test_recent_rows_follow_commits_and_restores(tmp_path: Path) -> None:
    mgr = StoreManager(tmp_path / "s", "g", group_index=True)
    st = mgr.open(0)
    st.put(b"reservation/R1", Row(1, False, "F1", b"v1"), None)
    assert st.recent == {}  # staged only
    st.commit(1)
    assert st.recent == {b"reservation/R1": Row(1, False, "F1", b"v1")}
    assert st.get(b"reservation/R1") == Row(1, False, "F1", b"v1")
    st.put(b"reservation/R1", Row(2, False, "F1", b"v2"), Row(1, False, "F1", b"v1"))
    st.rollback()  # aborted: the committed row stays what is read
    assert st.get(b"reservation/R1") == Row(1, False, "F1", b"v1")
    st.restore_batch([(b"reservation/R1", 5, False, "F2", b"v5")], 7)
    assert st.recent == {} and st.get(b"reservation/R1") == Row(5, False, "F2", b"v5")
    mgr.close_all()


def test_a_key_looked_up_in_vain_is_found_once_written(tmp_path: Path) -> None:
    """The keys RocksDB has no row of (PartitionStore.absent) never hide a row written later:
    staged, committed (also once the recent rows are gone) or restored."""
    mgr = StoreManager(tmp_path / "s", "g", group_index=True)
    st = mgr.open(0)
    r1, r2 = b"reservation/R1", b"reservation/R2"
    assert st.get(r1) is None and st.get(r2) is None
    assert st.absent == {r1, r2}
    st.put(r1, Row(1, False, "F1", b"v1"), None)
    assert st.get(r1) == Row(1, False, "F1", b"v1")  # staged
    st.commit(1)
    st.recent.clear()  # as when the recent rows overflow: RocksDB answers
    assert st.get(r1) == Row(1, False, "F1", b"v1") and r1 not in st.absent
    assert st.get(r2) is None and r2 in st.absent
    st.put(r2, Row(1, False, "F1", b"w1"), None)
    st.rollback()  # aborted: still nothing there
    assert st.get(r2) is None
    st.restore_batch([(r2, 5, False, "F2", b"w5")], 7)
    assert st.absent == set() and st.get(r2) == Row(5, False, "F2", b"w5")
    mgr.close_all()


def test_reads_by_entity_key_keep_one_entry_per_entity() -> None:
    """Kept by entity key, a new version's record replaces the old one's; an entry is used
    only for the very bytes it was decoded from."""
    cache, decoded = _cache()
    ekey = b"reservation/R1"
    v1, v2 = CODEC.encode("reservation", _res(version=1)), CODEC.encode("reservation", _res(version=2))
    assert cache.read(v1, ekey)["version"] == 1
    cache.wrote("reservation", v2, _res(version=2), ekey)
    assert len(cache._records) == 1  # noqa: SLF001 - one entry per entity is the point
    assert cache.read(v2, ekey)["version"] == 2 and decoded == [v1]
    assert cache.read(v1, ekey)["version"] == 1 and decoded == [v1, v1]  # not the entry's bytes
