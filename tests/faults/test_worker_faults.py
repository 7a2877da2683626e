"""Worker faults under a continuous stream, checked as a history (Jepsen style).

SIGKILL random workers of 3 (restarted at once, which fences the dead incarnation's
transaction, or only after the others took its partitions over), scale out and in while
events keep coming, then check the committed history: every fresh event has exactly one
committed effect, in group order, no two committed calls of a group overlapped in time,
and the table equals the reference. Quick by default; ``--long`` for 20 cycles.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fault_support import (
    Stream,
    collect_history,
    committed_effects,
    fault_worker,
    seeded_rng,
    wait_settled,
)
from kafka_fixtures import make_settings, wait_until
from worker_support import WorkerProcess

from fifolane.config import Settings
from fifolane.testing import KINDS
from fifolane.testing.workload import Workload
from fifolane.topics import create_topic

pytestmark = [pytest.mark.faults, pytest.mark.integration]

ZERO = dict.fromkeys(KINDS, 0)


@pytest.fixture
def settings(kafka_bootstrap: str, tmp_path: Path) -> Settings:
    """Six partitions: three workers own two each, so the fourth one gets work when it joins
    (with three, the sticky assignor may leave it idle while a killed static member's
    partitions wait for that member to come back)."""
    return make_settings(kafka_bootstrap, home=tmp_path / "home", partitions=6)


@dataclass(frozen=True)
class Plan:
    """How hard to shake: kill cycles, stream rate, effects between faults, scaling moments."""

    cycles: int
    rate: float
    progress: int
    scale_out: tuple[int, ...]
    scale_in: tuple[int, ...]
    groups: int = 40
    entities: int = 300


QUICK = Plan(cycles=4, rate=150, progress=250, scale_out=(1,), scale_in=(3,))
LONG = Plan(cycles=20, rate=300, progress=500, scale_out=(3, 11), scale_in=(7, 15), groups=80, entities=1000)


def _logs(procs: list[WorkerProcess]) -> str:
    return "\n".join(f"--- {p.worker_id} (run {p.runs}):\n{p.log_tail(15)}" for p in procs)


def test_sigkill_restart_and_scaling_under_a_stream(settings: Settings, topics: Any, tmp_path: Path,
                                                    long_run: bool) -> None:
    plan = LONG if long_run else QUICK
    effect_topic = settings.input_topic + ".effects"
    create_topic(settings, effect_topic, settings.partitions, {})
    rng = seeded_rng(20240607)
    base = [fault_worker(settings, f"w{i}", tmp_path, effect_topic) for i in (1, 2, 3)]
    extra = fault_worker(settings, "w4", tmp_path, effect_topic)
    everyone = [*base, extra]
    stream = Stream(settings, Workload(events=10**7, groups=plan.groups, entities=plan.entities, seed=5), plan.rate)
    kills: list[str] = []
    deferred: list[WorkerProcess] = []
    for w in base:
        w.start()
    stream.start()
    seen = 0
    try:
        for cycle in range(plan.cycles + 1):
            target = seen + plan.progress
            seen = wait_until(lambda t=target: (n := committed_effects(settings, effect_topic)) >= t and n,
                              timeout=120, interval=0.25,
                              message=lambda c=cycle: f"progress before fault {c}\n{_logs(everyone)}")
            assert stream.running(), "the stream ended before the faults did; lower the rate"
            for w in deferred:
                w.start()
            deferred.clear()
            crashed = [w.worker_id for w in everyone if w.runs and not w.alive() and w not in deferred]
            assert crashed == [] or crashed == ["w4"] and extra.proc is not None and extra.proc.returncode == 0, \
                f"workers stopped on their own: {crashed}\n{_logs(everyone)}"
            if cycle == plan.cycles:
                break
            if cycle in plan.scale_out:
                extra.start()
            if cycle in plan.scale_in and extra.alive():
                assert extra.terminate() == 0, _logs([extra])
            victim = rng.choice([w for w in base if w.alive()])
            victim.kill()
            kills.append(victim.worker_id)
            if cycle % 2 == 0:
                victim.start()  # at once: fences the dead incarnation's open transaction
            else:
                deferred.append(victim)  # later: its partitions move to the others first
        produced = stream.finish()
        assert stream.producer.failed == []
        settled = wait_settled(settings, effect_topic, produced, timeout=120, describe=lambda: _logs(everyone))
        alive = sorted(w.worker_id for w in everyone if w.alive())
    finally:
        stream.stop_event.set()
        for w in everyone:
            if w.alive():
                w.kill()
    history, report = collect_history(settings, effect_topic, produced)
    print(f"kills: {kills}; events: {len(produced)}; effects: {report.stats['effects']}")
    assert settled, report.summary()
    assert report.counts == ZERO, report.summary()
    assert alive == ["w1", "w2", "w3"]
    assert len(kills) == plan.cycles
    assert report.stats["produced"] == len(produced) >= plan.progress * (plan.cycles + 1)
    assert report.stats["required"] < len(produced)  # the stream held stale events, dropped
    # The effects came from more incarnations than the three first workers.
    assert report.stats["workers"] >= 4
