"""A worker that keeps being fenced by a producer with its transactional id, or whose consumer
failed for good, stops with a reason instead of going on."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError

from fifolane.errors import ProducerFatalError, ProducerFencedError, WorkerError
from services.worker.kafka import consumer_error
from services.worker.txn import FenceWatch


def test_many_fencings_in_a_short_time_stop_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("services.worker.txn.time.monotonic", lambda: now[0])
    watch = FenceWatch("fifolane-table-w1", limit=3, window_s=60.0)
    fenced = ProducerFencedError("commit: fenced by a newer instance")
    watch.note(fenced)
    watch.note(ProducerFatalError("another fatal error"))  # not a fencing: not counted
    now[0] += 100.0
    watch.note(fenced)
    watch.note(fenced)  # 3, but the first was 100 s before: a restart now and then
    now[0] += 1.0
    with pytest.raises(WorkerError, match="'fifolane-table-w1' fenced it 3 times in 1 s: another worker runs "
                                          "with the same --worker-id"):
        watch.note(fenced)


def test_a_fatal_consumer_error_stops_the_worker_and_names_a_shared_static_id() -> None:
    consumer_error(KafkaError(KafkaError._PARTITION_EOF, "eof"))  # nothing to say
    consumer_error(KafkaError(KafkaError._TRANSPORT, "broker down"))  # the client retries: logged
    with pytest.raises(WorkerError, match="failed for good: .*same group.instance.id; another worker runs "
                                          "with the same --worker-id"):
        consumer_error(KafkaError(KafkaError._FATAL, "Static consumer fenced by other consumer with same "
                                  "group.instance.id"))
    with pytest.raises(WorkerError, match="failed for good: something else$"):
        consumer_error(KafkaError(KafkaError._FATAL, "something else", fatal=True))
