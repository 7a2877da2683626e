"""services.worker.orphans: when a member leaves the group and joins again so that partitions
nobody owns are handed out (the integration test: tests/integration/test_orphaned_partition.py)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import ConsumerGroupState, TopicPartition

from services.worker.orphans import Orphans, OrphanWatch

STUCK = {"k1": frozenset({1, 2}), "k2": frozenset()}


def test_nothing_to_do_while_every_partition_has_an_owner_or_the_group_rebalances() -> None:
    o = Orphans(grace=30)
    for now in (0, 100, 200):
        assert o.rejoin("k2", True, 3, {"k1": frozenset({1, 2}), "k2": frozenset({0})}, now) == []
        assert o.rejoin("k2", False, 3, STUCK, now) == []


def test_the_member_with_fewest_partitions_rejoins_after_the_grace() -> None:
    ours, theirs = Orphans(grace=30), Orphans(grace=30)
    for now in (0, 10, 29):
        assert ours.rejoin("k2", True, 3, STUCK, now) == []
        assert theirs.rejoin("k1", True, 3, STUCK, now) == []
    assert ours.rejoin("k2", True, 3, STUCK, 30) == [0]
    assert theirs.rejoin("k1", True, 3, STUCK, 30) == []  # not k1's turn yet
    assert theirs.rejoin("k1", True, 3, STUCK, 60) == [0]  # k2 did not act: anyone does


def test_a_changed_assignment_or_an_unknown_member_starts_over() -> None:
    o = Orphans(grace=30)
    assert o.rejoin("k2", True, 3, STUCK, 0) == []
    moved = {"k1-new": frozenset({1, 2}), "k2": frozenset()}  # k1 restarted: a new member id
    assert o.rejoin("k2", True, 3, moved, 30) == []
    assert o.rejoin("k2", True, 3, moved, 59) == []
    assert o.rejoin("k3", True, 3, moved, 100) == []  # not (yet) a member itself
    assert o.rejoin("k2", True, 3, moved, 100) == []
    assert o.rejoin("k2", True, 3, moved, 130) == [0]


def _done(value: Any) -> Future[Any]:
    f: Future[Any] = Future()
    f.set_result(value)
    return f


class _Admin:
    def __init__(self, topic: str, members: dict[str, list[int]]) -> None:
        self.topic, self.members, self.asked = topic, members, 0

    def describe_consumer_groups(self, groups: list[str], request_timeout: float) -> dict[str, Future[Any]]:
        self.asked += 1
        members = [SimpleNamespace(member_id=m, assignment=SimpleNamespace(
            topic_partitions=[TopicPartition(self.topic, p) for p in ps] + [TopicPartition("other", 0)]))
            for m, ps in self.members.items()]
        return {groups[0]: _done(SimpleNamespace(state=ConsumerGroupState.STABLE, members=members))}

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, Future[Any]]:
        return {self.topic: _done(SimpleNamespace(partitions=[0, 1, 2]))}


class _Consumer:
    def __init__(self) -> None:
        self.rejoined = 0

    def member_id(self) -> str:
        return "k2"

    def rejoin(self) -> None:
        self.rejoined += 1


def test_the_watch_asks_every_interval_and_rejoins_the_consumer() -> None:
    now = [0.0]
    admin, consumer = _Admin("in", {"k1": [1, 2], "k2": []}), _Consumer()
    watch = OrphanWatch(lambda: admin, consumer, "g", "in", interval=10, grace=30,  # type: ignore[arg-type]
                        clock=lambda: now[0])
    for t in range(41):
        now[0] = float(t)
        watch.tick()
    assert admin.asked == 4 and consumer.rejoined == 0  # asked at 10, 20, 30, 40; answers seen a turn later
    now[0] = 41.0
    watch.tick()  # unowned since the answer seen at 11
    assert consumer.rejoined == 1 and watch.rejoins == 1
