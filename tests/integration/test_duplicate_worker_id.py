"""Two workers started with the same ``--worker-id`` (a copy-pasted command line, a compose
file with a fixed id): they share the group's static member id, with which each one's
consumer fences the other's, and a transactional id, with which they fence each other at
every commit.

- Every worker with a stable id writes a heartbeat to the members topic, and a newcomer
  reads it before it makes anything that fences (services.worker.liveness): a live worker
  with its id stops it at once, naming that worker's host and pid, however often a
  supervisor starts it again, and the running worker is never fenced. A killed worker
  leaves a last heartbeat: its successor waits for a newer one (a few seconds), sees none,
  and starts.
- Without the heartbeat (no members topic), the two fence each other; the newcomer stops
  after two fencings within a minute of its start and says why; the worker that was there
  first goes on, and nothing is lost.
- On the same machine the state directory is claimed by the first one
  (services.worker.storedirs).

A fencing now and then (a broker failover can leave one behind, and so does a consumer that
used the id once) is survived."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka_fixtures import wait_until
from worker_support import WorkerProcess, processes, read_table, reservation, send_events

from fifolane.config import Settings

pytestmark = pytest.mark.integration


def _our_last_line(w: WorkerProcess) -> str:
    text = w.log_tail(200)
    assert "Traceback" not in text, text
    ours = [line for line in text.splitlines() if not line.startswith("%")]  # not librdkafka's
    return ours[-1] if ours else ""


def _running(settings: Settings, w: WorkerProcess, tag: str, n: int = 200) -> set[str]:
    """Wait until ``w`` (started) has processed ``n`` new reservations."""
    send_events(settings, [("reservation", reservation(f"{tag}{i}", f"LH{i % 30}", 1), "upsert") for i in range(n)])
    want = {f"reservation/{tag}{i}" for i in range(n)}
    wait_until(lambda: want <= set(read_table(settings)), timeout=90, interval=0.5, message=w.log_tail)
    return want


def test_a_second_worker_with_the_same_id_stops_before_it_fences_the_first(settings: Settings, topics: Any,
                                                                         tmp_path: Path) -> None:
    """On another machine (its own state directory), started again and again as a
    supervisor would: each start stops at once, naming the running worker, which is never
    fenced and loses nothing."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = WorkerProcess(settings, "same", tmp_path / "a"), WorkerProcess(settings, "same", tmp_path / "b")
    with processes(a):
        want = _running(settings, a, "A")
        assert a.proc is not None
        sent = 0
        for _start in range(4):  # restart: unless-stopped
            b.start()
            while b.alive():
                batch = [("reservation", reservation(f"R{i}", f"LH{i % 30}", 1), "upsert") for i in range(sent, sent + 50)]
                sent += send_events(settings, batch)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    b.proc.wait(0.2)  # until it stops, sending meanwhile
            assert b.proc is not None and b.proc.wait(30) == 2, b.log_tail()
            last = _our_last_line(b)
            assert re.match(r"error: another worker runs with --worker-id same in consumer group \S+ "
                            rf"\(host '[^']+', pid {a.proc.pid}, its last heartbeat \d+\.\d s ago\): starting "
                            "this one would fence it", last), last
            assert "joined group" not in b.log_tail(400), b.log_tail(400)
        assert a.alive(), a.log_tail()
        want |= {f"reservation/R{i}" for i in range(sent)}
        wait_until(lambda: {k for k, (_v, r) in read_table(settings).items() if r is not None} == want,
                   timeout=120, interval=1.0, message=lambda: a.log_tail())
        snap = a.snapshot()
        assert (snap["consumer_renewals"], snap["aborts"]) == (0, 0), snap  # never fenced
        assert a.terminate() == 0


def test_a_killed_worker_s_successor_with_its_id_starts(settings: Settings, topics: Any, tmp_path: Path) -> None:
    """SIGKILL leaves a recent heartbeat and no tombstone: the restarted worker waits for a
    newer one, sees none, and takes over; after a clean stop it does not wait."""
    w = WorkerProcess(settings, "phoenix", tmp_path)
    with processes(w):
        want = _running(settings, w, "A")
        w.kill()
        w.start()
        want |= _running(settings, w, "B")
        log = w.log_tail(400)
        assert "--worker-id phoenix has a recent heartbeat" in log, log
        assert w.terminate() == 0
        w.start()
        want |= _running(settings, w, "C")
        assert set(read_table(settings)) == want
        assert w.terminate() == 0
        log = w.log_file.read_text(errors="replace")
        assert log.count("joined group") == 3 and log.count("has a recent heartbeat") == 1, log  # the 2nd start only


def test_a_members_topic_deleted_and_made_again(settings: Settings, topics: Any, tmp_path: Path) -> None:
    """The heartbeat never creates the members topic (it would be made with the broker's
    defaults, not compacted); once `topics create` has made it again, the running worker
    beats again and a duplicate is refused."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    from fifolane.topics import ensure_topics

    admin = AdminClient(settings.kafka_config())
    a = WorkerProcess(settings, "kept", tmp_path / "a")
    (tmp_path / "a").mkdir()
    with processes(a):
        want = _running(settings, a, "A")
        admin.delete_topics([settings.members_topic])[settings.members_topic].result(30)
        wait_until(lambda: "heartbeat not written" in a.log_tail(400), timeout=60, message=a.log_tail)
        assert settings.members_topic not in admin.list_topics(timeout=10).topics
        ensure_topics(settings)
        res = ConfigResource(ResourceType.TOPIC, settings.members_topic)
        configs = admin.describe_configs([res])[res].result(30)
        assert (configs["cleanup.policy"].value, configs["segment.ms"].value) == ("compact", "3600000")
        group = re.search(r"joined group (\S+)", a.log_tail(400))
        assert group is not None, a.log_tail()
        key = f"alive:{group.group(1)}/kept".encode()
        reader = Consumer({"bootstrap.servers": settings.resolved_bootstrap(), "group.id": "t-members",
                           "auto.offset.reset": "earliest", "enable.auto.commit": False})
        reader.assign([TopicPartition(settings.members_topic, 0, 0)])
        try:  # the running worker beats into the new topic (its producer finds it again)
            wait_until(lambda: any(m.error() is None and m.key() == key for m in reader.consume(100, timeout=0.5)),
                       timeout=60, message=a.log_tail)
        finally:
            reader.close()
        b = WorkerProcess(settings, "kept", tmp_path / "b")
        (tmp_path / "b").mkdir()
        b.start()
        assert b.proc is not None and b.proc.wait(60) == 2, b.log_tail()
        assert "another worker runs with --worker-id kept" in _our_last_line(b), b.log_tail()
        want |= _running(settings, a, "B")
        assert set(read_table(settings)) == want
        snap = a.snapshot()
        assert (snap["consumer_renewals"], snap["aborts"]) == (0, 0), snap
        assert a.terminate() == 0


def test_without_the_heartbeat_the_newcomer_stops_after_two_fencings(settings: Settings, topics: Any,
                                                                    tmp_path: Path) -> None:
    """No members topic (the check is skipped with a warning, and no heartbeat is written:
    the topic is not auto-created): the two fence each other, and the newcomer stops."""
    settings = settings.model_copy(update={"members_topic": f"{settings.members_topic}.missing"})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = WorkerProcess(settings, "same", tmp_path / "a"), WorkerProcess(settings, "same", tmp_path / "b")
    with processes(a):
        want = _running(settings, a, "A")
        assert "one worker per --worker-id not checked" in a.log_tail(400), a.log_tail(400)
        started = time.monotonic()
        wait_until(lambda: time.monotonic() - started > 62, timeout=90, interval=1.0)  # a minute old: not new
        b.start()
        sent = 0
        deadline = time.monotonic() + 150
        while b.alive() and time.monotonic() < deadline:
            batch = [("reservation", reservation(f"R{i}", f"LH{i % 30}", 1), "upsert") for i in range(sent, sent + 200)]
            sent += send_events(settings, batch)
            time.sleep(0.2)
        assert not b.alive(), f"the newcomer runs on:\n{b.log_tail(80)}\n--- the first one:\n{a.log_tail(80)}"
        assert b.proc is not None and b.proc.wait(30) == 2, b.log_tail()
        last = _our_last_line(b)
        assert re.match(r"error: the Kafka consumer was fenced 2 times in the \d+ s since this worker started ",
                        last), last
        assert "it was there first: this one stops" in last and "each worker its own --worker-id" in last, last
        assert a.alive(), a.log_tail()
        want |= {f"reservation/R{i}" for i in range(sent)}
        wait_until(lambda: {k for k, (_v, r) in read_table(settings).items() if r is not None} == want,
                   timeout=120, interval=1.0, message=lambda: a.log_tail())
        assert a.alive()
        assert a.terminate() == 0
    reader = Consumer({"bootstrap.servers": settings.resolved_bootstrap(), "group.id": "t",
                       "allow.auto.create.topics": False})
    try:
        assert settings.members_topic not in reader.list_topics(timeout=10).topics  # never auto-created
    finally:
        reader.close()


def test_a_second_worker_on_the_same_state_directory_stops_at_once(settings: Settings, topics: Any,
                                                                   tmp_path: Path) -> None:
    """On the same machine (the same state directory): the newcomer stops before it makes a
    Kafka client, so the running worker is never fenced."""
    shared = tmp_path / "state"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = WorkerProcess(settings, "twin", tmp_path / "a", extra=["--state-dir", str(shared)])
    b = WorkerProcess(settings, "twin", tmp_path / "b", extra=["--state-dir", str(shared)])
    with processes(a):
        want = _running(settings, a, "A")
        b.start()
        assert b.proc is not None and b.proc.wait(60) == 2, b.log_tail()
        last = _our_last_line(b)
        assert last.startswith("error: another worker process uses the state directory "), last
        assert f"pid {a.proc.pid if a.proc else '?'} on " in last and "--worker-id twin" in last, last
        send_events(settings, [("reservation", reservation(f"B{i}", f"LH{i % 30}", 1), "upsert") for i in range(200)])
        want |= {f"reservation/B{i}" for i in range(200)}
        wait_until(lambda: want <= set(read_table(settings)), timeout=90, interval=0.5, message=a.log_tail)
        wait_until(lambda: a.snapshot().get("consumed", 0) >= 400, timeout=30, message=a.log_tail)
        snap = a.snapshot()
        assert (snap["consumer_renewals"], snap["aborts"]) == (0, 0), snap
        assert a.terminate() == 0
        # Once the first one has stopped, the directory is free: a worker starts on it.
        c = WorkerProcess(settings, "twin", tmp_path / "b", extra=["--state-dir", str(shared)])
        with processes(c):
            _running(settings, c, "C")
            assert c.alive()
            assert c.terminate() == 0


def test_a_consumer_that_used_the_id_once_is_survived(settings: Settings, topics: Any, tmp_path: Path) -> None:
    """A static member fenced once (by a consumer that joined once with the worker's id, as a
    group coordinator can after a broker failover) gets a new consumer and goes on."""
    w = WorkerProcess(settings, "once", tmp_path)
    with processes(w):
        first = [("reservation", reservation(f"A{i}", f"LH{i % 20}", 1), "upsert") for i in range(300)]
        send_events(settings, first)
        want = {f"reservation/A{i}" for i in range(300)}
        wait_until(lambda: set(read_table(settings)) == want, timeout=90, interval=0.5, message=w.log_tail)
        group = re.search(r"joined group (\S+)", w.log_tail(400))
        assert group is not None, w.log_tail()
        other = Consumer({"bootstrap.servers": settings.resolved_bootstrap(), "group.id": group.group(1),
                          "group.instance.id": "once", "enable.auto.commit": False,
                          "partition.assignment.strategy": "cooperative-sticky"})
        assigned: list[Any] = []
        other.subscribe([settings.input_topic], on_assign=lambda _c, ps: assigned.extend(ps))
        deadline = time.monotonic() + 60
        while not assigned and time.monotonic() < deadline:
            other.poll(0.2)
        other.close()  # a static member leaves no word: the group keeps its member id for "once"
        assert assigned, "the other consumer took nothing"
        wait_until(lambda: "the consumer failed for good" in w.log_tail(400), timeout=60, message=w.log_tail)
        second = [("reservation", reservation(f"B{i}", f"LH{i % 20}", 1), "upsert") for i in range(300)]
        send_events(settings, second)
        want |= {f"reservation/B{i}" for i in range(300)}
        wait_until(lambda: set(read_table(settings)) == want, timeout=120, interval=0.5, message=w.log_tail)
        assert w.alive() and w.snapshot()["consumer_renewals"] == 1
        assert w.terminate() == 0
