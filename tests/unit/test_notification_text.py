"""The notification JSON (docs/formats.md) is written from precomputed pieces on the hot path;
these pieces must give exactly the text of the standard encoder over the whole record."""

from __future__ import annotations

import datetime
import decimal
import itertools
import json
import uuid
from typing import Any

import pytest

from listeners.notify import (
    assemble,
    change_parts,
    dumps,
    encode_value,
    listener_prefix,
    notification,
)

VALUES: list[Any] = [
    {"a": 1, "b": 'x\u00e9"\n\x00', "c": 1.5, "d": None, "e": True, "f": False},
    {"big_double": 1e308, "tiny": 5e-324, "text": "1:nan"},
    {"day": datetime.date(2026, 1, 1), "at": datetime.datetime(2026, 1, 1, 2, 3),
     "price": decimal.Decimal("1.10"), "id": uuid.UUID(int=5), "raw": b"\x00\xff",
     "span": datetime.timedelta(seconds=90)},
    {"nested": {"x": [1, 2, {"y": (3, 4)}], "tags": frozenset({"t"})}, 5: "an int key"},
    {}, None, {"big": 10**30, "small": 1e16, "zero": -0.0, "bool_key": {True: 1}},
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_a_projection_is_written_as_the_standard_encoder_writes_it(value: Any) -> None:
    assert encode_value(value).encode() == dumps(value)  # dumps: the standard encoder


def test_an_unencodable_value_fails_as_with_the_standard_encoder() -> None:
    with pytest.raises(TypeError, match="object is not JSON serialisable"):
        encode_value({"x": object()})


def test_notifications_from_parts_equal_the_whole_record_encoded() -> None:
    """Every combination of the change fields gives the JSON of the documented record, key
    order included (snapshot before moved_to, both last)."""
    count = 0
    for type_, key, change, partition, offset, version, ts, snapshot, moved_to in itertools.product(
        ["reservation", 'we"ird\u00e9'], ["R1", 'k\n"x'], [None, "created", "modified", "removed"],
        [0, 5], [None, 0, 99], [1, -(2**63) + 1], [0, 1_700_000_000_000], [False, True], [None, "F2"],
    ):
        parts = change_parts(type_, key, change, partition, offset, version, ts, snapshot, moved_to)
        text = assemble(listener_prefix("l1", "2026-01-01T00:00:00+00:00"), "created", parts,
                        encode_value({"v": 1}), 7)
        expected: dict[str, Any] = {
            "listener": "l1", "registration": "2026-01-01T00:00:00+00:00", "kind": "created",
            "key": key, "type": type_, "value": {"v": 1}, "table_change": change,
            "partition": partition, "offset": offset, "version": version, "seq": 7, "ts": ts,
        }
        if snapshot:
            expected["snapshot"] = True
        if moved_to is not None:
            expected["moved_to"] = moved_to
        assert text == dumps(expected)
        assert list(json.loads(text)) == list(expected)
        count += 1
    assert count == 2 * 2 * 4 * 2 * 3 * 2 * 2 * 2 * 2
    assert notification("l1", "removed", "t", "k", None, "removed", 0, 3, 2, 9, 5) == (
        b'{"listener":"l1","kind":"removed","key":"k","type":"t","value":null,'
        b'"table_change":"removed","partition":0,"offset":3,"version":2,"seq":9,"ts":5}')
