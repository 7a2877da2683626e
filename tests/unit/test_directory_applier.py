"""The entity directory's decisions (services/worker/directory.py, step 2), on a real RocksDB
store: which claim wins, what is stored, which move-outs and re-written winners are sent.
End to end, with workers and a broker: tests/integration/test_group_changes.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.worker.directory import (
    CONTROL_HEADER,
    MOVE_OUT,
    DirectoryApplier,
    claim_value,
    read_claim,
    restored_row,
)
from services.worker.metrics import Stats
from services.worker.state import PartitionStore, StoreManager

DIR, INPUT = "dir", "in"
KEY = b"reservation/R1"


class Sent:
    """What the applier produced: (topic, value, key, partition, headers)."""

    def __init__(self) -> None:
        self.records: list[tuple[Any, ...]] = []

    def __call__(self, topic: str, value: bytes, key: bytes, partition: int, headers: Any = None) -> None:
        self.records.append((topic, value, key, partition, headers))

    def move_outs(self) -> list[tuple[str, int, dict[str, Any]]]:
        """(old group, its partition, body) of every move-out sent."""
        out = []
        for topic, value, key, partition, headers in self.records:
            if topic == INPUT:
                assert headers == [(CONTROL_HEADER, MOVE_OUT)]
                out.append((key.decode(), partition, json.loads(value)))
        return out

    def rewritten(self) -> list[tuple[bytes, Any, int]]:
        """(entity key, claim, directory partition) of every winner written again."""
        return [(key, read_claim(value), partition) for topic, value, key, partition, _ in self.records
                if topic == DIR]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PartitionStore]:
    stores = StoreManager(tmp_path, "g.directory", cache_mb=8, write_buffer_mb=8, group_index=False)
    try:
        yield stores.open(3)
    finally:
        stores.close_all()


def _applier(store: PartitionStore) -> tuple[DirectoryApplier, Sent, Stats]:
    sent, stats = Sent(), Stats()
    return DirectoryApplier(store, DIR, INPUT, sent, stats), sent, stats


def _stored(store: PartitionStore, key: bytes = KEY) -> tuple[str, int | None, int, bool] | None:
    """The stored winner: group, partition, version, deleted. A deleted winner's partition is
    not kept once committed (nothing is ever moved out of a deleted copy): None then."""
    row = store.get(key)
    if row is None:
        return None
    partition = None if row.value is None else int.from_bytes(row.value, "big", signed=True)
    return (row.group, partition, row.version, row.deleted)


@pytest.mark.parametrize("committed", [False, True], ids=["staged", "committed"])
def test_a_new_entity_s_claim_wins_as_it_is_and_sends_nothing(store: PartitionStore, committed: bool) -> None:
    d, sent, stats = _applier(store)
    d.apply(KEY, claim_value("F1", 4, 7, False))
    d.apply(b"reservation/R2", claim_value("F2", 0, 1, True))
    if committed:
        store.commit(2)
        store.recent.clear()  # read back from RocksDB itself
    assert _stored(store) == ("F1", 4, 7, False)
    assert _stored(store, b"reservation/R2") == ("F2", None if committed else 0, 1, True)
    assert sent.records == [] and stats.claims == 2 and stats.moves_sent == 0


def test_the_same_claim_again_changes_nothing(store: PartitionStore) -> None:
    d, sent, stats = _applier(store)
    d.apply(KEY, claim_value("F1", 4, 7, False))
    store.commit(1)
    d.apply(KEY, claim_value("F1", 4, 7, False))
    assert store.overlay == {} and sent.records == [] and stats.claims == 2


def test_a_newer_claim_of_the_same_group_is_stored_without_a_move(store: PartitionStore) -> None:
    d, sent, _ = _applier(store)
    d.apply(KEY, claim_value("F1", 4, 7, False))
    d.apply(KEY, claim_value("F1", 4, 9, False))
    assert _stored(store) == ("F1", 4, 9, False) and sent.records == []


def test_a_winning_claim_of_another_group_moves_the_entity_out_of_the_old_one(store: PartitionStore) -> None:
    d, sent, stats = _applier(store)
    d.apply(KEY, claim_value("F1", 4, 7, False))
    store.commit(1)
    d.apply(KEY, claim_value("F2", 1, 8, False))
    assert _stored(store) == ("F2", 1, 8, False)
    assert sent.move_outs() == [("F1", 4, {"key": "reservation/R1", "version": 8, "to": "F2", "to_deleted": False})]
    assert sent.rewritten() == [] and stats.moves_sent == 1


def test_a_losing_claim_is_moved_out_and_the_winner_written_again(store: PartitionStore) -> None:
    d, sent, stats = _applier(store)
    d.apply(KEY, claim_value("F2", 1, 8, False))
    d.apply(KEY, claim_value("F1", 4, 7, False))  # older: F1's copy is the one that goes
    assert _stored(store) == ("F2", 1, 8, False)
    assert sent.rewritten() == [(KEY, read_claim(claim_value("F2", 1, 8, False)), 3)]
    assert sent.move_outs() == [("F1", 4, {"key": "reservation/R1", "version": 8, "to": "F2", "to_deleted": False})]
    assert stats.moves_sent == 1


def test_a_deleted_winner_moves_nothing_out(store: PartitionStore) -> None:
    d, sent, _ = _applier(store)
    d.apply(KEY, claim_value("F1", 4, 7, True))  # deleted in F1
    d.apply(KEY, claim_value("F2", 1, 8, False))  # lives on in F2: nothing left in F1 to remove
    assert _stored(store) == ("F2", 1, 8, False) and sent.move_outs() == []


def test_at_one_version_a_live_copy_beats_a_deleted_one(store: PartitionStore) -> None:
    d, sent, _ = _applier(store)
    d.apply(KEY, claim_value("F2", 1, 8, False))
    d.apply(KEY, claim_value("F1", 4, 8, True))  # the deletion a move-out left behind
    assert _stored(store) == ("F2", 1, 8, False)
    assert sent.rewritten() == [(KEY, read_claim(claim_value("F2", 1, 8, False)), 3)]
    assert sent.move_outs() == []  # the loser is deleted already


@pytest.mark.parametrize("key, value", [
    (None, claim_value("F1", 4, 7, False)),
    (b"", claim_value("F1", 4, 7, False)),
    (KEY, None),
    (KEY, b"\x00\x01"),
    (KEY, claim_value("F1", 4, 7, False)[:13] + b"\xff\xfe"),  # a group that is not UTF-8
], ids=["no key", "empty key", "tombstone", "short", "bad group"])
def test_a_record_that_is_not_a_claim_is_ignored(store: PartitionStore, key: bytes | None,
                                                  value: bytes | None) -> None:
    d, sent, stats = _applier(store)
    d.apply(key, value)
    assert store.overlay == {} and sent.records == [] and stats.claims == 0
    d.apply(KEY, claim_value("F1", 4, 7, False))  # and the next claim is decided as usual
    assert _stored(store) == ("F1", 4, 7, False) and stats.claims == 1


def test_a_bad_record_for_a_known_entity_leaves_its_winner(store: PartitionStore) -> None:
    d, sent, stats = _applier(store)
    d.apply(KEY, claim_value("F1", 4, 7, False))
    d.apply(KEY, claim_value("F2", 1, 9, False)[:13] + b"\xff")
    assert _stored(store) == ("F1", 4, 7, False) and sent.records == [] and stats.claims == 1


def test_a_claim_of_a_group_longer_than_a_row_keeps_is_ignored(store: PartitionStore) -> None:
    """No input record of such a group is processed (dead-lettered), and storing it would fail
    every commit of the directory's owner: a forged record, ignored."""
    d, sent, stats = _applier(store)
    huge = claim_value("g" * 70_000, 4, 7, False)
    d.apply(KEY, huge)  # an entity the directory has not seen
    assert store.overlay == {} and stats.claims == 0
    assert read_claim(huge) is None and restored_row_of(huge) is None
    d.apply(KEY, claim_value("F1", 4, 7, False))
    d.apply(KEY, claim_value("g" * 70_000, 4, 9, False))  # and one it has
    store.commit(2)
    assert _stored(store) == ("F1", 4, 7, False) and sent.records == [] and stats.claims == 1
    longest = claim_value("g" * 0xFFFF, 4, 9, False)  # the longest group a row keeps
    d.apply(b"reservation/R2", longest)
    store.commit(3)
    assert _stored(store, b"reservation/R2") == ("g" * 0xFFFF, 4, 9, False)


def test_no_move_out_to_a_partition_the_input_topic_does_not_have(store: PartitionStore) -> None:
    """A forged claim naming partition 9999 loses to the real one: the real claim is stored,
    and the move-out that Kafka would refuse (failing the transaction) is not sent."""
    asked: list[int] = []

    def input_has(p: int) -> bool:
        asked.append(p)
        return 0 <= p < 6

    sent, stats = Sent(), Stats()
    d = DirectoryApplier(store, DIR, INPUT, sent, stats, input_has=input_has)
    d.apply(KEY, claim_value("FORGED", 9999, 1, False))
    d.apply(KEY, claim_value("F1", 4, 2, False))  # wins: the forged copy would be moved out
    assert _stored(store) == ("F1", 4, 2, False)
    assert sent.records == [] and stats.moves_sent == 0 and asked == [9999]
    d.apply(KEY, claim_value("F2", 1, 3, False))  # a real rebooking still moves it out of F1
    assert sent.move_outs() == [("F1", 4, {"key": "reservation/R1", "version": 3, "to": "F2", "to_deleted": False})]


class _Msg:
    def __init__(self, key: bytes, value: bytes) -> None:
        self._key, self._value = key, value

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        return self._value


def restored_row_of(value: bytes) -> Any:
    return restored_row(_Msg(KEY, value), False)  # type: ignore[arg-type]


def test_a_move_out_record_carries_the_replaced_copy_and_refuses_a_damaged_one() -> None:
    from services.worker.directory import MoveOut, move_out_record, parse_move_out

    move = MoveOut(b"reservation/R1", "F1", 7, "F2", False, b"\x00copy-bytes\xff")
    key, value, headers = move_out_record(move)
    assert key == b"F1" and parse_move_out("F1", value) == move
    plain = MoveOut(b"reservation/R1", "F1", 7, "F2", True)
    assert parse_move_out("F1", move_out_record(plain)[1]) == plain and b"copy" not in move_out_record(plain)[1]
    for bad in (b'{"key":"reservation/R1","version":7,"to":"F2","copy":"!!"}',
                b'{"key":"reservation/R1","version":7,"to":"F2","copy":5}',
                b'{"key":"reservation/R1","version":9223372036854775808,"to":"F2"}'):  # 2**63: no row packs it
        assert isinstance(parse_move_out("F1", bad), str)
