"""The worker's linked consumer (input + entity directory) hands out at most the records asked
for, from both topics in turn: a bisecting transaction's room is counted in records."""

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
