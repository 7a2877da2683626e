"""The worker's sends and commits by the rate of its input (services.worker.pacing), with fake
clients: caught up with the input, at-least-once sends what its producer holds at once;
behind (a backlog the consumer has seen), it keeps batching. Exactly-once commits when the
input goes idle or on the interval, not merely when caught up. The same against real Kafka:
tests/integration/test_commit_pacing.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fake_kafka import FakeClients
from test_worker_guarantees import _msg, _state, _worker

from services.worker.runtime import Worker


def _ends(clients: FakeClients, ends: dict[int, int]) -> None:
    """The consumer's cached end offsets; its position is after the last record handed out."""
    consumer = clients.fake_consumer
    handed: dict[int, int] = {0: 100, 1: 200}
    real_consume = consumer.consume

    def consume(n: int, timeout: float = 0) -> list[Any]:
        batch = real_consume(n, timeout)
        for m in batch:
            handed[m.partition()] = m.offset() + 1
        return batch

    consumer.consume = consume  # type: ignore[method-assign]
    consumer.watermarks = lambda tp, timeout=None, cached=False: (0, ends[tp.partition])  # type: ignore[method-assign]
    consumer.position = lambda tp: handed[tp.partition]  # type: ignore[method-assign]


def _flushes(clients: FakeClients) -> list[float]:
    calls: list[float] = []
    fake = clients.fake_producer

    def flush(timeout: float) -> int:
        calls.append(timeout)
        return 0

    fake.flush = flush  # type: ignore[method-assign]
    return calls


def _feed(w: Worker, clients: FakeClients, batches: list[list[Any]]) -> None:
    for batch in batches:
        clients.fake_consumer.batches.append(batch)
        w.poll_once()


def test_exactly_once_commits_when_idle_not_merely_when_caught_up(tmp_path: Path) -> None:
    """Caught up after a partial batch, exactly-once keeps its transaction open (committing
    then cost the broker more than the events gained: benchmarks/README.md, "Commits when
    caught up"); the next empty fetch, an idle input, commits at once, and the interval does
    under load."""
    w, clients = _worker(tmp_path, commit_interval=600.0)
    _ends(clients, {0: 102, 1: 200})
    _feed(w, clients, [[_msg(0, 100, "R1", "F0", 1), _msg(0, 101, "R2", "F0", 1)]])
    assert (w.stats.consumed, w.stats.commits, clients.fake_producer.commits) == (2, 0, 0)
    _feed(w, clients, [[]])  # the input went idle
    assert (w.stats.commits, clients.fake_producer.commits) == (1, 1)
    assert clients.fake_producer.offsets[-1] == [("in", 0, 102), ("in", 1, 200)]
    w.calls.shutdown()


def test_exactly_once_keeps_to_the_interval_while_a_backlog_waits(tmp_path: Path) -> None:
    """Draining a backlog the batches can come back partial too (the worker outran its
    fetches): no commit until the interval."""
    w, clients = _worker(tmp_path, commit_interval=600.0)
    _ends(clients, {0: 10_100, 1: 200})
    _feed(w, clients, [[_msg(0, 100 + i, f"R{i}", "F0", 1)] for i in range(5)])
    assert (w.stats.consumed, w.stats.commits, clients.fake_producer.commits) == (5, 0, 0)
    w._next_checkpoint = 0.0  # the interval is up
    _feed(w, clients, [[_msg(0, 105, "R5", "F0", 1)]])
    assert (w.stats.commits, clients.fake_producer.commits) == (1, 1)
    w.calls.shutdown()


def test_a_partition_that_handed_out_nothing_does_not_hold_sends_back(tmp_path: Path) -> None:
    """Partition 1 has had no record since the worker took it (the client reports no
    position); it resumes at its committed offset, the end: the worker is caught up and
    at-least-once sends at once. At offset 150 instead, 50 records wait there: it is not."""
    for committed_at, sends in ((200, [0.001]), (150, [])):
        w, clients = _worker(tmp_path / str(committed_at), guarantee="at-least-once", commit_interval=600.0)
        _ends(clients, {0: 101, 1: 200})
        w.ckpt.add_source("in").base[1] = committed_at  # type: ignore[union-attr]
        consumer = clients.fake_consumer
        consumer.position = lambda tp: 101 if tp.partition == 0 else -1001  # type: ignore[method-assign]
        flushes = _flushes(clients)
        _feed(w, clients, [[_msg(0, 100, "R1", "F0", 1)]])
        assert flushes == sends
        w.calls.shutdown()


@pytest.mark.parametrize("behind", [False, True])
def test_at_least_once_sends_at_once_when_caught_up_and_commits_on_the_interval(
        tmp_path: Path, behind: bool) -> None:
    """At-least-once output is visible once the broker has it: caught up, the worker pushes
    out what its producer holds (instead of waiting for the producer's linger), and leaves
    the offsets to the interval; behind, it sends nothing early."""
    w, clients = _worker(tmp_path, guarantee="at-least-once", commit_interval=600.0)
    _ends(clients, {0: 100 + 201 if behind else 101, 1: 200})  # behind: 200 waiting
    flushes = _flushes(clients)
    _feed(w, clients, [[_msg(0, 100, "R1", "F0", 1)]])
    assert w.stats.commits == 0
    assert flushes == ([] if behind else [0.001])
    assert [k for k, _v in _state(clients)] == [b"reservation/R1"]
    w.calls.shutdown()


def test_the_end_of_a_backlog_is_not_a_low_rate(tmp_path: Path) -> None:
    """What may wait and still count as caught up is what arrives during a batch at a low
    rate (pacing.SMALL records), not all that the open transaction took: near the end of a
    drained backlog a large transaction would otherwise send (or commit) batch by batch."""
    w, clients = _worker(tmp_path, guarantee="at-least-once", commit_interval=600.0)
    _ends(clients, {0: 700, 1: 200})
    flushes = _flushes(clients)
    _feed(w, clients, [[_msg(0, 100 + i, f"R{i}", f"F{i % 5}", 1) for i in range(300)]])
    assert (w.stats.consumed, flushes) == (300, [])  # 300 taken, 300 more fetched: a backlog
    w.calls.shutdown()


def test_a_burst_after_a_pause_commits_an_interval_after_its_first_record(tmp_path: Path) -> None:
    """The interval counts from a transaction's first record: a burst after a pause (when the
    interval from the last commit is long up) does not commit right after its first batch,
    but once the interval is up, as under steady load."""
    w, clients = _worker(tmp_path, commit_interval=600.0)
    _ends(clients, {0: 10_100, 1: 200})  # a backlog: no idle commit
    w._next_checkpoint = 0.0  # the interval from the last commit is long up (a pause)
    _feed(w, clients, [[_msg(0, 100, "R1", "F0", 1)], [_msg(0, 101, "R2", "F0", 1)]])
    assert (w.stats.consumed, w.stats.commits, clients.fake_producer.commits) == (2, 0, 0)
    w._next_checkpoint = 0.0  # now the transaction's interval is up
    _feed(w, clients, [[_msg(0, 102, "R3", "F0", 1)]])
    assert (w.stats.commits, clients.fake_producer.commits) == (1, 1)
    assert clients.fake_producer.offsets[-1] == [("in", 0, 103), ("in", 1, 200)]
    w.calls.shutdown()
