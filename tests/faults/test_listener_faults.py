"""Listener faults: include-current-state and live notifications while workers are SIGKILLed.

Three workers (listener runtime on, as deployed) apply a filled table and then a continuous
stream of upserts and deletes, some with stale versions. Workers are SIGKILLed and restarted
(at once, or after the others took their partitions over) for a few cycles; meanwhile a
listener with ``include_current_state`` (a filter on a field and a converter) is registered
and a worker is killed as soon as its first snapshot notifications are committed. At the
end, with the stream done and everything committed:

- the :class:`~listeners.client.MaterializedView` that a :class:`~listeners.client.ListenerClient`
  fed from the beginning of the output topic equals the filtered, converted state table
  (read_committed; last record per key, tombstones absent);
- the history checker finds nothing: effects and table as in the worker fault test, and in
  the raw notification stream no gap within a run and no duplicate a consumer cannot drop;
- per key, notifications follow the table's updates: at most one snapshot notification and
  only as the first, versions strictly increasing.

Quick by default; ``--long`` for more cycles and a table large enough that every partition's
snapshot takes several chunks. ``FIFOLANE_FAULTS_SEED`` replays a run.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fault_support import (
    ClientFollower,
    Stream,
    committed_effects,
    fault_worker,
    seeded_rng,
    wait_settled,
)
from kafka_fixtures import consume_all, wait_until
from worker_support import CATALOG, WorkerProcess

from fifolane.config import Settings
from fifolane.serde import make_codec
from fifolane.testing import FAILOVER_DELTA, KINDS, History, TableEntry, check_history
from fifolane.testing.listener_check import materialize
from fifolane.testing.records import effects_from, notifications_from, table_from
from fifolane.testing.workload import Workload
from fifolane.topics import create_topic
from listeners.model import ListenerSpec
from listeners.registry import read_registry, register
from listeners.seq import DELTA

pytestmark = [pytest.mark.faults, pytest.mark.integration]

ZERO = dict.fromkeys(KINDS, 0)
NAME = "view"
FILTER = "value.seats >= 5"  # seats = version % 9 + 1: entities enter and leave the view
CONVERT = '{"id": value.reservation_id, "seats": value.seats, "amount": value.amount}'


def in_view(record: dict[str, Any]) -> bool:
    return int(record["seats"]) >= 5


def convert(record: dict[str, Any]) -> dict[str, Any]:
    return {"id": record["reservation_id"], "seats": record["seats"], "amount": record["amount"]}


@dataclass(frozen=True)
class Plan:
    """Kill cycles, the live stream's rate, effects between faults, table size, when to register."""

    cycles: int
    rate: float
    progress: int
    entities: int
    groups: int
    register_at: int


QUICK = Plan(cycles=4, rate=150, progress=200, entities=3000, groups=40, register_at=1)
# 20,000 entities: ~6,700 per partition, more than a snapshot chunk (5,000, or 2,500 on a
# worker that owns two partitions), so the kill can land between chunks.
LONG = Plan(cycles=12, rate=250, progress=400, entities=20_000, groups=80, register_at=3)


def _logs(procs: list[WorkerProcess]) -> str:
    return "\n".join(f"--- {p.worker_id} (run {p.runs}):\n{p.log_tail(15)}" for p in procs)


def expected_view(table: dict[str, TableEntry]) -> dict[str, dict[str, Any]]:
    """The filtered, converted table: ``"<type>/<key>" -> projection`` of present entities."""
    return {k: convert(dict(e.value)) for k, e in table.items() if e.value is not None and in_view(dict(e.value))}


def order_violations(notes: list[dict[str, Any]]) -> list[str]:
    """Per key: at most one snapshot notification and only first; versions strictly increasing."""
    out: list[str] = []
    per_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for n in notes:
        per_key[n["key"]].append(n)
    for key, ns in sorted(per_key.items()):
        snaps = [i for i, n in enumerate(ns) if n.get("snapshot")]
        if snaps not in ([], [0]):
            out.append(f"{key}: snapshot notifications at positions {snaps} of {len(ns)}")
        versions = [int(n["version"]) for n in ns]
        if any(b <= a for a, b in zip(versions, versions[1:], strict=False)):
            out.append(f"{key}: versions {versions} (kinds {[n['kind'] for n in ns]})")
    return out


def runs_per_stream(seqs: dict[int, list[int]]) -> dict[int, int]:
    """Runs (a first number, then every jump of at least DELTA) per source partition."""
    return {p: 1 + sum(1 for a, b in zip(s, s[1:], strict=False) if b - a >= DELTA) for p, s in seqs.items()}


def test_include_current_state_and_live_notifications_under_worker_kills(
        settings: Settings, topics: Any, tmp_path: Path, long_run: bool) -> None:
    assert FAILOVER_DELTA == DELTA  # the checker's notion of a new run is the runtime's
    plan = LONG if long_run else QUICK
    effect_topic = settings.input_topic + ".effects"
    create_topic(settings, effect_topic, settings.partitions, {})
    rng = seeded_rng(20240611)
    workers = [fault_worker(settings, f"w{i}", tmp_path, effect_topic) for i in (1, 2, 3)]
    workload = Workload(events=10**7, groups=plan.groups, entities=plan.entities, seed=rng.randrange(10**6),
                        initial=True)
    stream = Stream(settings, workload, plan.rate, burst=plan.entities)
    kills: list[str] = []
    deferred: list[WorkerProcess] = []
    follower: ClientFollower | None = None
    snapshot_kill: dict[str, Any] = {}
    for w in workers:
        w.start()
    stream.start()
    seen = plan.entities  # the table is filled first
    try:
        for cycle in range(plan.cycles + 1):
            target = seen + plan.progress
            seen = wait_until(lambda t=target: (n := committed_effects(settings, effect_topic)) >= t and n,
                              timeout=120, interval=0.5,
                              message=lambda c=cycle: f"progress before fault {c}\n{_logs(workers)}")
            assert stream.running(), "the stream ended before the faults did"
            for w in deferred:
                w.start()
            deferred.clear()
            crashed = [w.worker_id for w in workers if w.runs and not w.alive()]
            assert crashed == [], f"workers stopped on their own: {crashed}\n{_logs(workers)}"
            if cycle == plan.cycles:
                break
            victim = rng.choice(workers)
            victim.kill()
            kills.append(victim.worker_id)
            if cycle % 2 == 0:
                victim.start()  # at once: fences the dead incarnation's open transaction
            else:
                deferred.append(victim)  # later: its partitions move to the others first
            if cycle == plan.register_at:
                # Registered while a worker is down and partitions move; then a kill as soon
                # as the first snapshot notifications are committed.
                spec = register(settings, ListenerSpec(name=NAME, filter=FILTER, convert=CONVERT,
                                                       include_current_state=True))
                follower = ClientFollower(settings, spec)
                f = follower
                snaps = wait_until(lambda f=f: f.count(snapshot=True), timeout=90, interval=0.02,
                                   message=lambda: f"first snapshot notifications\n{_logs(workers)}")
                second = rng.choice([w for w in workers if w.alive()])
                second.kill()
                kills.append(second.worker_id)
                # What the kill interrupted: the committed snapshot progress per partition.
                progress = {p: (pr.done, pr.sent) for (n, p), pr in read_registry(settings).progress.items()
                            if n == NAME}
                second.start()
                snapshot_kill = {"worker": second.worker_id, "snapshot_notes_seen": snaps,
                                 "unfinished": sorted(set(range(settings.partitions))
                                                      - {p for p, (done, _) in progress.items() if done}),
                                 "progress": progress}
        produced = stream.finish()
        assert stream.producer.failed == []
        settled = wait_settled(settings, effect_topic, produced, timeout=120, describe=lambda: _logs(workers))
        assert settled, _logs(workers)
        assert follower is not None
        codec = make_codec(settings, CATALOG)
        table = table_from(consume_all(settings, settings.state_topic), codec)
        expected = expected_view(table)
        fol = follower
        view = wait_until(lambda: (v := fol.view_now()) == expected and v, timeout=90, interval=0.5,
                          message=lambda: f"view {len(fol.view_now())} entries vs {len(expected)} expected, "
                                          f"{sum(1 for k, v in fol.view_now().items() if expected.get(k) != v)}"
                                          f" differ\n{_logs(workers)}")
        alive = sorted(w.worker_id for w in workers if w.alive())
        raw = consume_all(settings, settings.listener_output_topic)
        wait_until(lambda: fol.count() + fol.client.duplicates >= len(raw), timeout=30,
                   message=lambda: f"the client read {fol.count()} + {fol.client.duplicates} "
                                   f"duplicates of {len(raw)} notifications")
        fol.close()
        follower = None
        client_notes = fol.notes
        client_gaps, client_dups, client_runs = fol.client.gaps, fol.client.duplicates, fol.client.tracker.runs
    finally:
        stream.stop_event.set()
        if follower is not None:
            follower.close()
        for w in workers:
            if w.alive():
                w.kill()

    effects = effects_from(consume_all(settings, effect_topic))
    notes = notifications_from(raw)
    report = check_history(History(produced, effects, table, notes, compare_values=True))
    seqs: dict[int, list[int]] = defaultdict(list)
    for n in notes:
        seqs[n.partition].append(n.seq)
    runs = runs_per_stream(seqs)
    kinds = Counter((n["kind"], n.get("table_change")) for n in client_notes)
    snapshot_notes = sum(1 for n in client_notes if n.get("snapshot"))
    print(report.summary())
    print(f"kills: {kills} (during the snapshot: {snapshot_kill}); events: {len(produced)}; "
          f"effects: {len(effects)}; table: {len(table)} entities, view: {len(view)}; "
          f"notifications: {len(notes)} raw, {len(client_notes)} delivered ({snapshot_notes} snapshot), "
          f"kinds {dict(kinds)}; runs per partition: {runs}; client: gaps {client_gaps}, "
          f"duplicates dropped {client_dups}, runs {client_runs}")

    assert report.counts == ZERO, report.summary()
    assert alive == ["w1", "w2", "w3"]
    assert len(kills) == plan.cycles + 1
    assert view == expected and len(expected) > plan.entities // 4
    assert materialize(notes, NAME) == {k.split("/", 1)[1]: v for k, v in expected.items()}
    assert client_gaps == []
    assert order_violations(client_notes) == []
    # The snapshot announced the table as of the registration, then live changes followed,
    # including both kinds of leaving the view: a delete, and an update out of the filter.
    assert snapshot_notes >= plan.entities // 4
    assert len(client_notes) == len(notes) - client_dups
    assert kinds[("removed", "removed")] > 0 and kinds[("removed", "modified")] > 0
    assert kinds[("created", "modified")] > 0 and kinds[("modified", "modified")] > 0
    # Failovers happened while the listener was delivering: more runs than partitions.
    assert sum(runs.values()) > settings.partitions
    assert report.stats["required"] < len(produced)  # the stream held stale events, dropped
