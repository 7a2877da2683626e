"""Broker faults on a 3-node cluster (RF 3, min ISR 2, producers acks=all + idempotence).

- The leader of an input partition dies mid-stream and comes back: no acknowledged event
  is lost, the pipeline goes on once leadership moved, and the history checks clean. A
  worker that dies meanwhile is restarted, as a restart policy would, and the crash is
  printed: a failover longer than the transaction timeout can end a worker with a fatal
  INVALID_TXN_STATE instead of a new producer (reported with issue 7).
- Two of three brokers down: every produce ends reported failed (no silent loss, nothing
  acknowledged), and producing works again once one broker is back.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from fault_support import (
    Stream,
    collect_history,
    committed_effects,
    fault_worker,
    input_seqs,
    make_topics,
    wait_settled,
)
from kafka_fixtures import wait_until
from worker_support import CATALOG

from fifolane.config import Settings
from fifolane.serde import make_codec
from fifolane.testing import KINDS
from fifolane.testing.workload import TrackedProducer, Workload
from fifolane.topics import create_topic

pytestmark = [pytest.mark.faults, pytest.mark.integration]

ZERO = dict.fromkeys(KINDS, 0)


def leader_of(settings: Settings, partition: int) -> int:
    md = AdminClient(settings.kafka_config()).list_topics(settings.input_topic, timeout=10)
    return int(md.topics[settings.input_topic].partitions[partition].leader)


@pytest.fixture
def cluster(kafka_cluster3: Any) -> Iterator[Any]:
    """The 3-node cluster; every broker is running again after the test."""
    yield kafka_cluster3
    for i, broker in enumerate(kafka_cluster3.status().brokers):
        if not broker.alive:
            kafka_cluster3.start_broker(i)


def test_partition_leader_crash_mid_stream(cluster: Any, settings3: Settings, tmp_path: Path) -> None:
    make_topics(settings3)
    effect_topic = settings3.input_topic + ".effects"
    create_topic(settings3, effect_topic, settings3.partitions, {})
    worker = fault_worker(settings3, "b1", tmp_path, effect_topic)
    # Strictly growing versions: every event is fresh, so each acknowledged one needs an effect.
    stream = Stream(settings3, Workload(events=10**7, groups=30, entities=200, stale=0.0, seed=9), rate=150,
                    conf={"message.timeout.ms": 20_000})
    crashes: list[str] = []

    def supervise() -> bool:
        """Restart the worker if it died (as a container restart policy would); note why."""
        if not worker.alive():
            fatal = [line for line in worker.log_tail(60).splitlines() if "FATAL" in line or "fatal" in line]
            crashes.append(fatal[-1] if fatal else worker.log_tail(5))
            worker.start()
        return True

    worker.start()
    stream.start()
    try:
        wait_until(lambda: committed_effects(settings3, effect_topic) >= 300, timeout=90, interval=0.25,
                   message=lambda: f"first effects\n{worker.log_tail()}")
        victim = leader_of(settings3, 0)
        cluster.kill_broker(victim)  # SIGKILL the leader of input partition 0
        new_leader = wait_until(lambda: (lead := leader_of(settings3, 0)) not in (victim, -1) and lead + 1,
                                timeout=30, interval=0.2, message="leadership of partition 0 to move") - 1
        before = committed_effects(settings3, effect_topic)
        # The transaction and group coordinators move with the leader; on 2 busy cores the
        # worker's commit can block for tens of seconds before the new coordinator answers.
        wait_until(lambda: supervise() and committed_effects(settings3, effect_topic) >= before + 300,
                   timeout=180, interval=0.25,
                   message=lambda: f"the worker goes on after the leader moved\n{worker.log_tail()}")
        cluster.start_broker(victim)
        again = committed_effects(settings3, effect_topic)
        wait_until(lambda: supervise() and committed_effects(settings3, effect_topic) >= again + 200,
                   timeout=90, interval=0.25,
                   message=lambda: f"progress after the broker returned\n{worker.log_tail()}")
        produced = stream.finish()
        settled = wait_settled(settings3, effect_topic, produced, timeout=90,
                               describe=lambda: str(supervise()) + worker.log_tail())
        supervise()
    finally:
        stream.stop_event.set()
        if worker.alive():
            worker.kill()
    tracked = stream.producer
    assert tracked.attempted == len(tracked.acked) + len(tracked.failed)  # every produce has an outcome
    _history, report = collect_history(settings3, effect_topic, produced)
    print(f"leader {victim} -> {new_leader}; acked {len(tracked.acked)}, failed {len(tracked.failed)}; "
          f"worker crashes (restarted): {crashes}")
    assert settled, report.summary()
    assert report.counts == ZERO, report.summary()
    sent = input_seqs(settings3)
    assert [(e.group, e.seq) for e in tracked.acked if (e.group, e.seq) not in sent] == []


def test_two_brokers_down_fail_loudly_then_recover(cluster: Any, settings3: Settings) -> None:
    make_topics(settings3)
    events = iter(Workload(events=600, groups=10, entities=50, stale=0.0, seed=4).generate())
    tracked = TrackedProducer(settings3, make_codec(settings3, CATALOG),
                              {"message.timeout.ms": 3_000, "request.timeout.ms": 2_000})

    def send(n: int) -> None:
        for _ in range(n):
            tracked.send(next(events))
        assert tracked.flush(30) == 0  # every outcome is known within the message timeout

    send(100)
    assert (len(tracked.acked), tracked.failed) == (100, [])
    down = [i for i in range(3) if i != leader_of(settings3, 0)][:1] + [leader_of(settings3, 0)]
    for i in down:
        cluster.kill_broker(i)
    send(100)
    assert len(tracked.acked) == 100, "acknowledged with 2 of 3 brokers down (min ISR 2)"
    assert len(tracked.failed) == 100
    codes = {m.group(1) for _e, err in tracked.failed if (m := re.search(r"code=(\w+)", err))}
    print(f"errors with 2 brokers down: {sorted(codes)}")
    assert len(codes) >= 1
    assert codes <= {"_MSG_TIMED_OUT", "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
                     "REQUEST_TIMED_OUT", "_TIMED_OUT"}, codes
    cluster.start_broker(down[0])

    def recovered() -> bool:
        before = len(tracked.acked)
        send(20)
        return len(tracked.acked) == before + 20

    wait_until(recovered, timeout=60, interval=0.2, message=lambda: f"producing after a broker returned: "
               f"last errors {[err for _e, err in tracked.failed[-3:]]}")
    cluster.start_broker(down[1])
    assert tracked.attempted == len(tracked.acked) + len(tracked.failed)
    sent = input_seqs(settings3)
    assert [(e.group, e.seq) for e in tracked.acked if (e.group, e.seq) not in sent] == []
