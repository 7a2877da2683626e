"""Paused workers (SIGSTOP past the session timeout) and killed ones, under a stream.

A paused worker is the dangerous kind of failure: it does not know it was gone. While it
is frozen the group evicts it (session timeout 10 s), its partitions move to the others,
which restore them and go on; then it resumes (SIGCONT) in the middle of whatever it was
doing (a handler call, a transaction with records and offsets, a commit) and must not
commit any of it: a *zombie*. The checks are the history checker's: every fresh event has
exactly one committed effect (nothing lost, nothing duplicated), in group order, no two
committed calls of a group overlapped in time (a zombie's call that committed after the
new owner's would overlap it), and the table equals the reference.

Each pause is held until the group has evicted the worker; half of them are released at
once (its transaction may still be open on the broker: the transaction timeout is also
10 s, so the zombie is fenced by the group, not by the coordinator's abort), the other
half only after the others have made progress on its partitions (the zombie's transaction
was aborted meanwhile, and its local state is behind). After resuming it must rejoin and
work on: all workers are alive at the end, none was restarted for a pause.

Quick: two pauses. ``--long``: 10 pauses and 20 SIGKILLs (restarted at once or later),
shuffled.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from fault_support import (
    Stream,
    collect_history,
    committed_effects,
    fault_worker,
    group_members,
    seeded_rng,
    wait_settled,
)
from kafka_fixtures import wait_until
from worker_support import WorkerProcess

from fifolane.config import Settings
from fifolane.testing import KINDS
from fifolane.testing.workload import Workload
from fifolane.topics import create_topic

pytestmark = [pytest.mark.faults, pytest.mark.integration]

ZERO = dict.fromkeys(KINDS, 0)
QUICK = ["stop", "stop"]
LONG_STOPS, LONG_KILLS = 10, 20


def _logs(procs: list[WorkerProcess]) -> str:
    return "\n".join(f"--- {p.worker_id} (run {p.runs}):\n{p.log_tail(15)}" for p in procs)


def test_sigstop_past_the_session_timeout_and_sigkill_under_a_stream(
        settings: Settings, topics: Any, tmp_path: Path, long_run: bool) -> None:
    rng = seeded_rng(20260113)
    actions = ["stop"] * LONG_STOPS + ["kill"] * LONG_KILLS if long_run else list(QUICK)
    if long_run:
        rng.shuffle(actions)
    effect_topic = settings.input_topic + ".effects"
    create_topic(settings, effect_topic, settings.partitions, {})
    group = f"fifolane-fault-{settings.input_topic}"
    workers = [fault_worker(settings, f"w{i}", tmp_path, effect_topic) for i in (1, 2, 3)]
    stream = Stream(settings, Workload(events=10**7, groups=40, entities=300, seed=rng.randrange(10**6)), 150)
    done: list[dict[str, Any]] = []
    deferred: list[WorkerProcess] = []
    for w in workers:
        w.start()
    stream.start()
    seen = 0
    try:
        for i, action in enumerate([*actions, "end"]):
            target = seen + 200
            seen = wait_until(lambda t=target: (n := committed_effects(settings, effect_topic)) >= t and n,
                              timeout=180, interval=0.25,
                              message=lambda a=action, n=i: f"progress before {a} {n}\n{_logs(workers)}")
            for w in deferred:
                w.start()
            deferred.clear()
            crashed = [w.worker_id for w in workers if not w.alive()]
            assert crashed == [], f"workers stopped on their own: {crashed}\n{_logs(workers)}"
            if action == "end":
                break
            assert stream.running(), "the stream ended before the faults did"
            victim = rng.choice(workers)
            if action == "kill":
                victim.kill()
                (victim.start() if rng.random() < 0.5 else deferred.append(victim))
                done.append({"kill": victim.worker_id})
                continue
            t0 = time.monotonic()
            victim.pause()
            me = f"{victim.worker_id}-consumer"
            wait_until(lambda m=me: (got := group_members(settings, group)) is not None and m not in got,
                       timeout=60, interval=0.5, message=lambda v=victim: f"the group to evict {v.worker_id}")
            evicted = time.monotonic() - t0
            late = i % 2 == 1
            if late:  # the others take over its partitions and move on
                base = committed_effects(settings, effect_topic)
                wait_until(lambda b=base: committed_effects(settings, effect_topic) >= b + 200, timeout=120,
                           interval=0.25, message=lambda: f"progress without the paused worker\n{_logs(workers)}")
            victim.resume()
            done.append({"stop": victim.worker_id, "evicted_s": round(evicted, 1),
                         "paused_s": round(time.monotonic() - t0, 1), "late": late})
            wait_until(lambda m=me: (got := group_members(settings, group)) is not None and m in got,
                       timeout=90, interval=0.5,
                       message=lambda v=victim: f"{v.worker_id} to rejoin after SIGCONT\n{_logs(workers)}")
        produced = stream.finish()
        assert stream.producer.failed == []
        settled = wait_settled(settings, effect_topic, produced, timeout=120, describe=lambda: _logs(workers))
        alive = sorted(w.worker_id for w in workers if w.alive())
    finally:
        stream.stop_event.set()
        for w in workers:
            if w.alive():
                w.resume()
                w.kill()
    _history, report = collect_history(settings, effect_topic, produced)
    print(f"faults: {done}; events: {len(produced)}; effects: {report.stats['effects']}")
    assert settled, report.summary()
    assert report.counts == ZERO, report.summary()
    assert alive == ["w1", "w2", "w3"]
    assert [a for a in actions] == [next(iter(d)) for d in done]
    assert report.stats["required"] < len(produced)
