"""A restored partition is resumed only after the consumer sought to its committed offset: a
seek that librdkafka refuses (_STATE, while the partition's fetch state settles) is made
again at the next turn of the poll loop, the partition paused meanwhile (resumed without it,
a partition stalled a worker in CI: 51,037 of 60,300 events committed after 240 s)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from fake_kafka import FakeClients
from kafka_fixtures import wait_until

from fifolane.config import Settings
from fifolane.serde import SchemaCatalog
from services.worker.kafka import map_error
from services.worker.options import WorkerOptions
from services.worker.runtime import Worker


def test_a_refused_seek_is_made_again_before_the_partition_resumes(tmp_path: Path) -> None:
    clients = FakeClients({("in", 0): 100, ("in", 1): 200})
    fc = clients.fake_consumer
    refusals = {1: 3}  # partition 1's first three seeks are refused
    seek = fc.seek
    resumed_after: list[tuple[int, int]] = []  # (partition, seeks made for it before its resume)

    def refusing_seek(tp: Any) -> None:
        if refusals.get(tp.partition, 0) > 0:
            refusals[tp.partition] -= 1
            raise map_error(KafkaException(KafkaError(KafkaError._STATE, "Failed to seek: Local: Erroneous state")),
                            f"seek in[{tp.partition}]")
        seek(tp)

    resume = fc.resume

    def resume_noting(partitions: list[Any]) -> None:
        for tp in partitions:
            resumed_after.append((tp.partition, sum(1 for s in fc.seeks if s[1] == tp.partition)))
        resume(partitions)

    fc.seek = refusing_seek  # type: ignore[method-assign]
    fc.resume = resume_noting  # type: ignore[method-assign]
    settings = Settings(home=tmp_path / "home", input_topic="in", state_topic="state", dlq_topic="dlq")
    w = Worker(settings, None, WorkerOptions(worker_id="w1", state_dir=tmp_path / "state"),
               catalog=SchemaCatalog.load(), clients=clients)
    w.connect()
    fc.callbacks["on_assign"](None, [TopicPartition("in", 0), TopicPartition("in", 1)])
    wait_until(lambda: w.poll_once() or w.assigned_partitions == [0, 1], timeout=10, message="restored")
    assert refusals == {1: 0}
    assert fc.seeks == [("in", 0, 100), ("in", 1, 200)]  # partition 1's fourth seek went through
    assert sorted(resumed_after) == [(0, 1), (1, 1)]  # each resumed once, after its seek
    assert not fc.paused
    w.stop()
    w.close()
