"""Losing one broker of three, with the workers' own processes and no restarts from outside.

Issue #12, part 1, as a new user would run it: a 3-node cluster (RF 3, min ISR 2), input
topic of 6 partitions, two table workers (``python -m services.worker`` with the built-in
table handler, listener runtime on), a stream of versioned reservation events (stale
updates and deletes included). While the stream runs, each of the three brokers is SIGKILLed
in turn, starting with the one that hosts the first worker's transaction coordinator, and
started again once the workers carried on without it; the next kill waits until every
replica is back in sync (so only one broker is ever missing).

Nobody restarts a worker: both must be alive at the end. Once the stream is done and the
consumer group has committed every input offset (lag 0), the committed state topic must
equal the reference table of the acknowledged events (indeterminate ones may or may not
count), values included, and nothing may be dead-lettered.

One worker has a stable ``--worker-id`` (static membership), the other none (dynamic
membership, so the group rebalances when its coordinator moves), as users run them.

Quick: one kill, of the broker hosting the first worker's transaction coordinator (a broker
restart after SIGKILL takes a minute or two on 2 busy cores). ``--long``: each broker in
turn (the coordinator's first), 40,000 entities as in the issue.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fault_support import (
    Stream,
    collect_history,
    committed_offsets,
    full_isr,
    group_coordinator,
    lag,
    make_topics,
    seeded_rng,
    table_worker,
    txn_coordinator,
)
from kafka_fixtures import consume_all, make_settings, wait_until
from worker_support import WorkerProcess

from fifolane.config import Settings
from fifolane.testing import KINDS
from fifolane.testing.workload import Workload

pytestmark = [pytest.mark.faults, pytest.mark.integration]

ZERO = dict.fromkeys(KINDS, 0)


@dataclass(frozen=True)
class Plan:
    rounds: int  # 0: only the transaction coordinator's broker, once
    rate: float
    progress: int  # input records committed between faults
    groups: int
    entities: int


QUICK = Plan(rounds=0, rate=500, progress=1000, groups=200, entities=4000)
LONG = Plan(rounds=1, rate=700, progress=4000, groups=600, entities=40_000)


@pytest.fixture
def cluster(kafka_cluster3: Any) -> Iterator[Any]:
    """The 3-node cluster; every broker is running (and thawed) again after the test."""
    yield kafka_cluster3
    for i, broker in enumerate(kafka_cluster3.status().brokers):
        if broker.alive:
            kafka_cluster3.resume_broker(i)
        else:
            kafka_cluster3.start_broker(i, timeout=240)
    wait_until(lambda: full_isr(make_settings(kafka_cluster3.bootstrap_servers)), timeout=120, interval=1,
               message="every replica in sync after the test")


def _committed(settings: Settings, group: str) -> int:
    return sum(max(o, 0) for o in committed_offsets(settings, group).values())


def _logs(procs: list[WorkerProcess]) -> str:
    return "\n".join(f"--- {p.worker_id} (run {p.runs}):\n{p.log_tail(25)}" for p in procs)


def _count(procs: list[WorkerProcess], pattern: str) -> int:
    rx = re.compile(pattern)
    return sum(len(rx.findall(p.log_file.read_text(errors="replace"))) for p in procs if p.log_file.exists())


def test_each_broker_killed_in_turn_under_two_table_workers(cluster: Any, tmp_path: Path,
                                                            long_run: bool) -> None:
    plan = LONG if long_run else QUICK
    settings = make_settings(cluster.bootstrap_servers, home=tmp_path / "home", replication_factor=3,
                             partitions=6)
    make_topics(settings)
    group = f"fifolane-loss-{settings.input_topic}"
    workers = [table_worker(settings, "t1", tmp_path, group),
               table_worker(settings, "t2", tmp_path, group, static=False)]
    rng = seeded_rng(20260112)
    stream = Stream(settings, Workload(events=10**8, groups=plan.groups, entities=plan.entities,
                                       seed=rng.randrange(10**6)), plan.rate,
                    conf={"message.timeout.ms": 120_000})
    kills: list[dict[str, Any]] = []
    for w in workers:
        w.start()
    stream.start()
    try:
        wait_until(lambda: _committed(settings, group) >= plan.progress, timeout=120, interval=0.5,
                   message=lambda: f"first progress\n{_logs(workers)}")
        coordinator = txn_coordinator(settings, f"{group}-t1")
        others = [b for b in range(3) if b != coordinator]
        order = [coordinator, *others] * plan.rounds if plan.rounds else [coordinator]
        for victim in order:
            gc = group_coordinator(settings, group)
            before = _committed(settings, group)
            t0 = time.monotonic()
            cluster.kill_broker(victim)
            wait_until(lambda b=before: _committed(settings, group) >= b + plan.progress, timeout=240,
                       interval=0.5, message=lambda v=victim: f"progress with broker {v} down\n{_logs(workers)}")
            assert all(w.alive() for w in workers), f"a worker exited with broker {victim} down\n{_logs(workers)}"
            t_down = time.monotonic() - t0
            cluster.start_broker(victim, timeout=240)  # log recovery after SIGKILL is slow here
            t_back = time.monotonic() - t0
            wait_until(lambda: full_isr(settings), timeout=180, interval=1,
                       message=lambda v=victim: f"replicas in sync after broker {v} returned")
            kills.append({"broker": victim, "txn_coordinator_t1": victim == coordinator,
                          "group_coordinator": victim == gc, "carried_on_s": round(t_down, 1),
                          "restarted_s": round(t_back, 1), "in_sync_s": round(time.monotonic() - t0, 1)})
            assert stream.running(), "the stream ended before the faults did"
        produced = stream.finish()
        # Every input offset committed by the workers themselves, both still up.
        wait_until(lambda: lag(settings, group) == 0, timeout=240, interval=1,
                   message=lambda: f"lag {lag(settings, group)} after the stream\n{_logs(workers)}")
        alive = [w.worker_id for w in workers if w.alive()]
        renewals = _count(workers, r"producer unusable")
        aborts = _count(workers, r"aborting the transaction")
    finally:
        stream.stop_event.set()
        for w in workers:
            if w.alive():
                w.kill()
    tracked = stream.producer
    assert tracked.attempted == len(tracked.acked) + len(tracked.failed)
    _history, report = collect_history(settings, None, produced)
    dead = consume_all(settings, settings.dlq_topic)
    print(f"kills: {kills}; events {len(produced)} (acked {len(tracked.acked)}, failed {len(tracked.failed)}); "
          f"aborted transactions {aborts}, producers renewed {renewals}")
    assert alive == ["t1", "t2"], _logs(workers)
    assert report.counts == ZERO, report.summary()
    assert [m.headers() for m in dead] == []
    assert len(kills) == max(1, 3 * plan.rounds) and kills[0]["txn_coordinator_t1"]
    assert report.stats["table"] > plan.entities // 2
