"""The worker's linked consumer (input + entity directory) hands out at most the records asked
for, from both topics in turn: a bisecting transaction's room is counted in records. Records
fetched before a rewind inside a consume() are never handed out."""

from __future__ import annotations

from typing import Any

from confluent_kafka import TopicPartition

from services.worker.linked import LinkedConsumer


class _Queue:
    """A consumer of one topic: hands out its records in order, at most ``n`` a call."""

    def __init__(self, topic: str, count: int) -> None:
        self.records = [(topic, i) for i in range(count)]
        self.asked: list[int] = []

    def consume(self, n: int, timeout: float = 0) -> list[Any]:
        assert n >= 1, "librdkafka refuses a batch of no records"
        self.asked.append(n)
        out, self.records = self.records[:n], self.records[n:]
        return out

    def assign_more(self, partitions: list[TopicPartition]) -> None:
        pass


def _linked(inputs: int, claims: int) -> tuple[LinkedConsumer, _Queue, _Queue]:
    main, side = _Queue("in", inputs), _Queue("dir", claims)
    linked = LinkedConsumer(main, side, "in", "dir")  # type: ignore[arg-type]
    linked.assign_more([TopicPartition("dir", 0)])
    return linked, main, side


def test_a_batch_never_holds_more_than_asked_even_when_both_topics_have_records() -> None:
    linked, _, _ = _linked(100, 100)
    taken: list[Any] = []
    sizes = []
    for n in (12, 12, 7, 1, 1, 1, 1, 30):
        got = linked.consume(n)
        sizes.append(len(got))
        taken += got
    assert sizes == [12, 12, 7, 1, 1, 1, 1, 30]
    ins = [i for t, i in taken if t == "in"]
    dirs = [i for t, i in taken if t == "dir"]
    assert ins == list(range(len(ins))) and dirs == list(range(len(dirs)))  # each in order, none lost
    assert len(ins) >= 20 and len(dirs) >= 20  # turns: neither topic starves the other


def test_batches_of_one_alternate_between_the_topics() -> None:
    linked, _, _ = _linked(5, 5)
    assert [linked.consume(1)[0][0] for _ in range(6)] == ["dir", "in", "dir", "in", "dir", "in"]


def test_one_topic_fills_what_the_other_leaves() -> None:
    linked, main, side = _linked(50, 3)
    first, second = linked.consume(20), linked.consume(20)
    assert len(first) == len(second) == 20
    assert sum(t == "dir" for t, _ in first + second) == 3
    assert linked.consume(40) == [("in", i) for i in range(37, 50)]
    assert side.records == [] and main.records == []


def test_without_directory_partitions_only_the_input_is_asked() -> None:
    main, side = _Queue("in", 10), _Queue("dir", 10)
    linked = LinkedConsumer(main, side, "in", "dir")  # type: ignore[arg-type]
    assert len(linked.consume(4)) == 4 and side.asked == []


class _Rec:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self.t, self.p, self.o = topic, partition, offset

    def partition(self) -> int:
        return self.p

    def topic(self) -> str:
        return self.t


class _Dir:
    """Two directory partitions; a seek moves one back."""

    def __init__(self) -> None:
        self.pos = {0: 0, 1: 0}

    def consume(self, n: int, timeout: float = 0) -> list[Any]:
        out = [_Rec("dir", p, self.pos[p] + i) for p in (0, 1) for i in range(2)][:n]
        for r in out:
            self.pos[r.p] = r.o + 1
        return out

    def seek(self, tp: TopicPartition) -> None:
        self.pos[tp.partition] = tp.offset

    def assign_more(self, partitions: list[TopicPartition]) -> None:
        pass


def test_directory_records_fetched_before_a_seek_in_the_input_consumers_callback_are_not_handed_out() -> None:
    """The input consumer's rebalance callback runs inside its consume(): there an abort seeks
    the directory back. Records of a sought partition fetched before it are dropped (the seek
    delivers them again); the other partition's stay."""
    side = _Dir()

    class _Input:
        def consume(self, n: int, timeout: float = 0) -> list[Any]:
            linked.seek(TopicPartition("dir", 0, 0))  # the rewind of a failed revoke commit
            return [_Rec("in", 0, 7)]

    linked = LinkedConsumer(_Input(), side, "in", "dir")  # type: ignore[arg-type]
    linked.assign_more([TopicPartition("dir", 0), TopicPartition("dir", 1)])
    got = linked.consume(10)  # the directory's turn first
    assert [(r.t, r.p, r.o) for r in got] == [("in", 0, 7), ("dir", 1, 0), ("dir", 1, 1)]
    assert side.pos[0] == 0  # partition 0's records come again
    assert linked._side_sought is None


def test_at_most_one_offset_commit_goes_unanswered() -> None:
    """At-least-once commits not waited for: while one has no answer (on_commit), the next
    one waits; a renewed client starts afresh."""
    from services.worker.clients import GroupConsumer

    made: list[Any] = []

    class _Client:
        def __init__(self, conf: dict[str, Any]) -> None:
            self.conf, self.commits = conf, []
            self.consume = self.poll = lambda *a, **k: []
            made.append(self)

        def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
            self.commits.append((offsets[0].offset, asynchronous))

    consumer = GroupConsumer({"group.id": "g"}, factory=_Client)
    tp = TopicPartition("in", 0, 5)
    consumer.commit([tp], wait=False)
    consumer.commit([TopicPartition("in", 0, 6)], wait=False)  # the first one is unanswered: waits
    made[0].conf["on_commit"](None, [tp])  # the answer, as a later consume() serves it
    consumer.commit([TopicPartition("in", 0, 7)], wait=False)
    consumer.commit([TopicPartition("in", 0, 8)], wait=True)
    assert made[0].commits == [(5, True), (6, False), (7, True), (8, False)]


def test_a_polled_record_whose_partition_a_callback_rewinds_is_left_out_of_the_batch() -> None:
    """poll_once takes ``first`` from poll(), then consume()s more. A rebalance callback in that
    consume() may abort and seek every partition back to the last commit: ``first`` then
    comes again after the rewound records, and taking it now would run it twice and out of
    order. It is left out; a seek of another partition keeps it. Both consumers."""
    from services.worker.kafka import WorkerConsumer

    seeks: list[TopicPartition] = []

    class _Client:
        def __init__(self, conf: dict[str, Any]) -> None:
            self.poll = lambda *a: None

        def consume(self, n: int, timeout: float = 0) -> list[Any]:
            for tp in seeks:  # the callback's rewind, through the worker's wrapper
                wrapper.seek(tp)
            return [_Rec("in", 1, 40)]

        def seek(self, tp: TopicPartition) -> None:
            pass

    wrapper: Any = WorkerConsumer({}, factory=_Client)
    first = _Rec("in", 0, 7)
    assert [(r.t, r.p, r.o) for r in wrapper.poll_more(first, 10)] == [("in", 0, 7), ("in", 1, 40)]
    seeks[:] = [TopicPartition("in", 1, 30)]
    assert [(r.t, r.p, r.o) for r in wrapper.poll_more(first, 10)] == [("in", 0, 7), ("in", 1, 40)]
    seeks[:] = [TopicPartition("in", 0, 5), TopicPartition("in", 1, 30)]
    assert [(r.t, r.p, r.o) for r in wrapper.poll_more(first, 10)] == [("in", 1, 40)]
    assert wrapper.poll_more(first, 1) == [first] and wrapper._sought is None
    seeks.clear()

    class _Input:
        def consume(self, n: int, timeout: float = 0) -> list[Any]:
            for tp in seeks:
                wrapper.seek(tp)
            return [_Rec("in", 1, 40)]

        def seek(self, tp: TopicPartition) -> None:
            pass

    wrapper = LinkedConsumer(_Input(), _Dir(), "in", "dir")  # type: ignore[arg-type]
    assert [(r.t, r.p, r.o) for r in wrapper.poll_more(first, 10)] == [("in", 0, 7), ("in", 1, 40)]
    seeks[:] = [TopicPartition("in", 0, 5)]
    assert [(r.t, r.p, r.o) for r in wrapper.poll_more(first, 10)] == [("in", 1, 40)]
