"""Listener changes while a client follows: replace, remove and add again, lease expiry.

Two table workers (listener runtime on) apply a filled table and then a live stream. A
client (:class:`~listeners.client.ListenerClient` into a
:class:`~listeners.client.MaterializedView`, from the beginning of the output topic)
follows one listener name through three registrations, all with include-current-state:

1. registered (filter A), followed until its snapshot arrives;
2. replaced by filter B while the client follows;
3. removed, and added again (filter C) while the client follows.

Each registration is a new stream for the client (``registration`` in every notification,
sequence numbers jump by at least ``DELTA``). At the end the view must equal the table
filtered and converted by C, and the client must have seen no gap and no duplicate; the
raw notification stream must pass the history checker (no gap within a run, no duplicate
it cannot drop, no order violation), per key and registration versions must only grow,
and the table must equal the reference. ``--long``: three workers, one SIGKILLed (and
restarted at once) at each seam, as soon as the new registration's first snapshot
notifications are committed.

A separate test registers a listener with a short lease, lets it expire and registers it
again under the same name: the new registration must be active and stay registered
(workers never tombstone registrations).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from fault_support import ClientFollower, Stream, committed_offsets, lag, seeded_rng, table_worker
from kafka_fixtures import consume_all, wait_until
from worker_support import CATALOG, WorkerProcess

from fifolane.config import Settings
from fifolane.serde import make_codec
from fifolane.testing import KINDS, History, check_history
from fifolane.testing.records import notifications_from, table_from
from fifolane.testing.workload import Workload
from listeners.model import ListenerSpec
from listeners.registry import read_registry, register, remove

pytestmark = [pytest.mark.faults, pytest.mark.integration]

ZERO = dict.fromkeys(KINDS, 0)
NAME = "seams"
# (filter, converter, python filter, python converter); seats = version % 9 + 1
DEFS = {
    "A": ("value.seats >= 5", '{"id": value.reservation_id, "seats": value.seats}',
          lambda r: r["seats"] >= 5, lambda r: {"id": r["reservation_id"], "seats": r["seats"]}),
    "B": ("value.seats <= 4", '{"id": value.reservation_id, "amount": value.amount}',
          lambda r: r["seats"] <= 4, lambda r: {"id": r["reservation_id"], "amount": r["amount"]}),
    "C": ("value.seats % 2 == 0", '{"id": value.reservation_id, "v": value.version}',
          lambda r: r["seats"] % 2 == 0, lambda r: {"id": r["reservation_id"], "v": r["version"]}),
}


def spec_of(name: str, which: str, **kw: Any) -> ListenerSpec:
    f, c, _pf, _pc = DEFS[which]
    return ListenerSpec(name=name, filter=f, convert=c, include_current_state=True, **kw)


def _logs(procs: list[WorkerProcess]) -> str:
    return "\n".join(f"--- {p.worker_id} (run {p.runs}):\n{p.log_tail(15)}" for p in procs)


def _version_regressions(notes: list[dict[str, Any]]) -> list[str]:
    """Per registration and key: versions strictly grow, a snapshot note only first."""
    per: dict[tuple[Any, str], list[dict[str, Any]]] = defaultdict(list)
    for n in notes:
        per[(n.get("registration"), n["key"])].append(n)
    out = []
    for (reg, key), ns in sorted(per.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        versions = [int(n["version"]) for n in ns]
        snaps = [i for i, n in enumerate(ns) if n.get("snapshot")]
        if any(b <= a for a, b in zip(versions, versions[1:], strict=False)) or snaps not in ([], [0]):
            out.append(f"{reg} {key}: versions {versions}, snapshots at {snaps}")
    return out


def test_replace_and_readd_while_a_client_follows(settings: Settings, topics: Any, tmp_path: Path,
                                                   long_run: bool) -> None:
    rng = seeded_rng(20260115)
    entities = 6000 if long_run else 2000
    group = f"fifolane-seams-{settings.input_topic}"
    workers = [table_worker(settings, f"s{i}", tmp_path, group) for i in range(1, 4 if long_run else 3)]
    stream = Stream(settings, Workload(events=10**7, groups=40, entities=entities, initial=True,
                                       seed=rng.randrange(10**6)), 200, burst=entities)
    follower: ClientFollower | None = None
    kills: list[str] = []
    registrations: list[str] = []

    def seam(spec: ListenerSpec) -> None:
        """Wait for the new registration's snapshot notes; under --long, kill a worker then."""
        reg = spec.created_at.isoformat()
        registrations.append(reg)
        f = follower
        assert f is not None
        wait_until(lambda: f.count(reg, snapshot=True) > 0, timeout=90, interval=0.05,
                   message=lambda: f"snapshot notifications of {reg}\n{_logs(workers)}")
        if long_run:
            victim = rng.choice(workers)
            victim.kill()
            victim.start()
            kills.append(victim.worker_id)

    for w in workers:
        w.start()
    stream.start()
    try:
        wait_until(lambda: sum(max(o, 0) for o in committed_offsets(settings, group).values()) >= entities,
                   timeout=120, interval=0.5, message=lambda: f"the table filled\n{_logs(workers)}")
        spec = register(settings, spec_of(NAME, "A"))
        follower = ClientFollower(settings, spec)
        seam(spec)
        spec = register(settings, spec_of(NAME, "B"), replace=True)
        seam(spec)
        assert remove(settings, NAME)
        spec = register(settings, spec_of(NAME, "C"))
        seam(spec)
        produced = stream.finish()
        assert stream.producer.failed == []
        wait_until(lambda: lag(settings, group) == 0, timeout=120, interval=0.5,
                   message=lambda: f"lag {lag(settings, group)}\n{_logs(workers)}")
        codec = make_codec(settings, CATALOG)
        table = table_from(consume_all(settings, settings.state_topic), codec)
        _f, _c, keep, convert = DEFS["C"]
        expected = {k: convert(dict(e.value)) for k, e in table.items() if e.value is not None and keep(dict(e.value))}
        fol = follower
        wait_until(lambda: fol.view_now() == expected, timeout=90, interval=0.5,
                   message=lambda: f"view {len(fol.view_now())} entries, expected {len(expected)}, "
                                   f"{sum(1 for k, v in expected.items() if fol.view_now().get(k) != v)} differ"
                                   f"\n{_logs(workers)}")
        alive = sorted(w.worker_id for w in workers if w.alive())
        raw = consume_all(settings, settings.listener_output_topic)
        wait_until(lambda: len(fol.notes) + fol.client.duplicates >= len(raw), timeout=30,
                   message="the client read every notification")
        fol.close()
        follower = None
        client_notes, gaps, dups = fol.notes, fol.client.gaps, fol.client.duplicates
    finally:
        stream.stop_event.set()
        if follower is not None:
            follower.close()
        for w in workers:
            if w.alive():
                w.kill()
    notes = notifications_from(raw)
    report = check_history(History(produced, table=table, notifications=notes, compare_values=True))
    seen_regs = [r for r in dict.fromkeys(n.get("registration") for n in client_notes)]
    print(report.summary())
    print(f"kills at seams: {kills}; events {len(produced)}; notifications {len(notes)} raw, "
          f"{len(client_notes)} delivered; per registration: "
          f"{ {r[-15:]: sum(1 for n in client_notes if n.get('registration') == r) for r in seen_regs} }; "
          f"view {len(expected)}")
    assert report.counts == ZERO, report.summary()
    assert alive == sorted(w.worker_id for w in workers)
    assert (gaps, dups) == ([], 0)
    assert _version_regressions(client_notes) == []
    assert seen_regs == registrations
    assert len(expected) > entities // 10


def test_expired_lease_then_registered_again(settings: Settings, topics: Any, tmp_path: Path) -> None:
    group = f"fifolane-lease-{settings.input_topic}"
    worker = table_worker(settings, "l1", tmp_path, group).start()
    stream = Stream(settings, Workload(events=10**7, groups=10, entities=200, seed=3), 100)
    stream.start()
    follower: ClientFollower | None = None
    try:
        wait_until(lambda: sum(max(o, 0) for o in committed_offsets(settings, group).values()) > 100,
                   timeout=60, interval=0.5, message=lambda: f"the worker at work\n{worker.log_tail()}")
        first = register(settings, spec_of("leased", "A", lease="6s"))
        # Follow without renewing (a client with a lease renews it): let it run out.
        follower = ClientFollower(settings, spec_of("leased", "A"))
        f = follower
        wait_until(lambda: f.count(first.created_at.isoformat()) > 0, timeout=60, message="first notifications")
        wait_until(lambda: read_registry(settings).listeners["leased"].is_expired(), timeout=30, interval=0.2,
                   message="the lease to run out")
        before = f.count()
        again = register(settings, spec_of("leased", "A", lease="1h"), replace=True)
        wait_until(lambda: f.count(again.created_at.isoformat()) > 0, timeout=60, interval=0.2,
                   message=lambda: f"notifications of the new registration\n{worker.log_tail()}")
        # Still registered and active a few housekeeping rounds later: nobody deleted it.
        t0 = time.monotonic()
        wait_until(lambda: time.monotonic() - t0 > 3 and f.count() > before, timeout=30, interval=0.5)
        state = read_registry(settings)
        assert "leased" in state.listeners and not state.listeners["leased"].is_expired()
        assert state.listeners["leased"].created_at == again.created_at
        assert worker.alive()
    finally:
        stream.stop_event.set()
        if follower is not None:
            follower.close()
        if worker.alive():
            worker.kill()


def test_registry_reads_see_writes_behind_an_open_transaction(settings: Settings, topics: Any) -> None:
    """A worker's transaction on the registry topic (snapshot progress, status records) is
    open for a checkpoint interval at a time. A registry read must not stop at the start of
    that transaction (the last stable offset, which is what a read_committed consumer gets
    as the partition's end): it would miss every registration and removal written after it,
    so ``listeners remove X`` followed by ``listeners add X`` was refused ("already exists"),
    and a listener just added was "unknown"."""
    from confluent_kafka import Producer

    register(settings, spec_of("behind", "A"))
    txn = Producer(settings.kafka_config(**{"transactional.id": f"open-{settings.registry_topic}"}))
    txn.init_transactions(60)
    txn.begin_transaction()
    txn.produce(settings.registry_topic, b'{"progress": 1}', b"behind/snapshot/0", partition=0)
    assert txn.flush(10) == 0
    # Decided a moment later, as a worker's checkpoint does (reads until then must wait).
    decide = threading.Timer(1.5, txn.abort_transaction, args=(30,))
    decide.start()
    assert remove(settings, "behind")
    again = register(settings, spec_of("behind", "B"))  # was refused: the removal unseen
    added = register(settings, spec_of("other", "C"))
    got = read_registry(settings, timeout=60)
    assert set(got.listeners) == {"behind", "other"}
    assert got.listeners["behind"].filter == again.filter
    assert got.listeners["other"].created_at == added.created_at
    assert got.progress == {}  # the aborted transaction's record is not read
    decide.join(30)
