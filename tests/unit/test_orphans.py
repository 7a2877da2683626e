"""services.worker.orphans: when a member leaves the group and joins again so that partitions
nobody owns are handed out (the integration test: tests/integration/test_orphaned_partition.py)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaError, KafkaException, TopicPartition

from services.worker.orphans import LEAVE_S, Orphans, OrphanWatch

STUCK = {"k1": (True, frozenset({1, 2})), "k2": (True, frozenset())}


def test_nothing_to_do_while_every_partition_has_an_owner_or_the_group_rebalances() -> None:
    o = Orphans(grace=30)
    for now in (0, 100, 200):
        assert o.rejoin("k2", True, 3, {"k1": (True, frozenset({1, 2})), "k2": (True, frozenset({0}))}, now) == []
        assert o.rejoin("k2", False, 3, STUCK, now) == []


def test_the_member_with_fewest_partitions_rejoins_after_the_grace() -> None:
    ours, theirs = Orphans(grace=30), Orphans(grace=30)
    for now in (0, 10, 29):
        assert ours.rejoin("k2", True, 3, STUCK, now) == []
        assert theirs.rejoin("k1", True, 3, STUCK, now) == []
    assert ours.rejoin("k2", True, 3, STUCK, 30) == [0]
    assert theirs.rejoin("k1", True, 3, STUCK, 30) == []  # not k1's turn yet
    assert theirs.rejoin("k1", True, 3, STUCK, 60) == [0]  # k2 did not act: the next one does


def test_members_without_the_watch_are_not_waited_for_and_static_ones_act_one_at_a_time() -> None:
    """A dynamic member (no --worker-id: no watch) with no partitions never acts: the static
    members take their turns, one more each grace period, not all at once."""
    members = {"dyn": (False, frozenset()), "a": (True, frozenset({1})), "b": (True, frozenset({2})),
               "c": (True, frozenset({3}))}
    watches = {m: Orphans(grace=30) for m in ("a", "b", "c")}
    acted: dict[str, float] = {}
    for now in range(0, 200, 10):
        for m, o in watches.items():
            if m not in acted and o.rejoin(m, True, 4, members, float(now)) == [0]:
                acted[m] = now
    assert acted == {"a": 30, "b": 60, "c": 90}


def test_a_changed_assignment_or_an_unknown_member_starts_over() -> None:
    o = Orphans(grace=30)
    assert o.rejoin("k2", True, 3, STUCK, 0) == []
    moved = {"k1-new": (True, frozenset({1, 2})), "k2": (True, frozenset())}  # k1 restarted: a new member id
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
        members = [SimpleNamespace(member_id=m, group_instance_id=m, assignment=SimpleNamespace(
            topic_partitions=[TopicPartition(self.topic, p) for p in ps] + [TopicPartition("other", 0)]))
            for m, ps in self.members.items()]
        return {groups[0]: _done(SimpleNamespace(state=ConsumerGroupState.STABLE, members=members))}

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, Future[Any]]:
        return {self.topic: _done(SimpleNamespace(partitions=[0, 1, 2]))}


class _Consumer:
    def __init__(self) -> None:
        self.left = self.rejoined = 0
        self.member, self.fail = "k2", False

    def member_id(self) -> str:
        return self.member

    def leave(self) -> None:
        if self.fail:
            raise KafkaException(KafkaError(KafkaError._FATAL, "fenced"))
        self.left += 1

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
    assert admin.asked == 4 and consumer.left == 0  # asked at 10, 20, 30, 40; answers seen a turn later
    now[0] = 41.0
    watch.tick()  # unowned in the answers to the questions asked at 10 ... 40
    assert consumer.left == 1 and watch.rejoins == 1 and consumer.rejoined == 0
    for t in (42, 50, 60):  # the revoke has not run yet: a subscribe now would cancel the leave
        now[0] = float(t)
        watch.tick()
    assert consumer.rejoined == 0 and admin.asked == 4
    consumer.member = ""  # left the group
    now[0] = 61.0
    watch.tick()
    assert consumer.rejoined == 1
    watch.close()
    assert watch._admin is None and watch._asked is None


def test_a_leave_that_never_completes_joins_again_after_a_while_and_a_failing_leave_is_not_fatal() -> None:
    now = [0.0]
    admin, consumer = _Admin("in", {"k1": [1, 2], "k2": []}), _Consumer()
    watch = OrphanWatch(lambda: admin, consumer, "g", "in", interval=10, grace=30,  # type: ignore[arg-type]
                        clock=lambda: now[0])
    consumer.fail = True  # failed for good: its error renews it (services/worker/rebalance.py)
    for t in range(60):
        now[0] = float(t)
        watch.tick()  # raised KafkaException out of the poll loop before
    assert consumer.left == 0 and watch.rejoins == 0
    consumer.fail = False
    for t in range(60, 100):
        now[0] = float(t)
        watch.tick()
        if consumer.left:
            break
    assert consumer.left == 1 and consumer.rejoined == 0
    left = now[0]
    now[0] = left + LEAVE_S - 1
    watch.tick()
    assert consumer.rejoined == 0
    now[0] = left + LEAVE_S + 1
    watch.tick()
    assert consumer.rejoined == 1
