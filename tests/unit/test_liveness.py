"""One live worker per ``--worker-id``: the heartbeat in the members topic and the check a
worker makes before anything that fences (services.worker.liveness), with fake clients.
Against a real broker: tests/integration/test_duplicate_worker_id.py."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from fake_kafka import FakeClients, FakeMsg
from kafka_fixtures import wait_until

from fifolane.config import Settings
from fifolane.errors import WorkerError
from fifolane.query import member_key, member_value, read_member
from fifolane.serde import SchemaCatalog
from services.worker import liveness
from services.worker.liveness import Heartbeat, alive_key, alive_value, check_alone, read_alive
from services.worker.options import WorkerOptions
from services.worker.runtime import Worker

KEY = alive_key("g", "w1")
_BLOCK = threading.Event()  # never set: what a fake's blocking call waits on


class _Topic:
    """The members topic: records written before the check, and records that appear
    ``later`` seconds after the check began reading (another worker's heartbeats)."""

    def __init__(self, before: list[tuple[bytes, bytes | None]],
                 later: Sequence[tuple[float, bytes, bytes | None]] = (), refuse: KafkaError | None = None,
                 listed: Any = "ok") -> None:
        self.before = [FakeMsg(0, i, k, v) for i, (k, v) in enumerate(before)]
        self.later = [(t, FakeMsg(0, len(before) + i, k, v)) for i, (t, k, v) in enumerate(later)]
        self.refuse = refuse  # raised when its offsets are asked for
        self.listed = listed  # "ok", None (not in the topic list) or a KafkaError (the topic's error)
        self.waited = 0  # consume calls after everything written before was read
        self.closed = False
        self.since = 0  # offsets_for_times' answer (-1: no record that recent)
        self.assigned_at = -1
        self.slow = False  # consume returns nothing while records are due (a broker too slow)


def _consumer_of(topic: _Topic) -> type:
    class _Consumer:
        def __init__(self, conf: dict[str, Any]) -> None:
            self.conf = conf
            self._pending = list(topic.before)
            self._t0 = 0.0

        def list_topics(self, timeout: float) -> Any:
            assert "allow.auto.create.topics" in self.conf and not self.conf["allow.auto.create.topics"]
            if topic.listed is None:
                return SimpleNamespace(topics={"other": SimpleNamespace(error=None)})
            error = None if isinstance(topic.listed, str) else topic.listed
            return SimpleNamespace(topics={"members": SimpleNamespace(error=error)})

        def get_watermark_offsets(self, tp: Any, timeout: float) -> tuple[int, int]:
            if topic.refuse is not None:
                raise KafkaException(topic.refuse)
            return 0, len(topic.before)

        def offsets_for_times(self, tps: list[Any], timeout: float) -> list[Any]:
            return [SimpleNamespace(offset=topic.since)]

        def assign(self, tps: list[Any]) -> None:
            self._t0 = time.monotonic()
            topic.assigned_at = tps[0].offset
            self._pending = [m for m in self._pending if m.offset() >= tps[0].offset]

        def consume(self, n: int, timeout: float) -> list[FakeMsg]:
            if topic.slow:
                _BLOCK.wait(min(timeout, 0.05))  # as the real call blocks for its timeout
                return []
            if self._pending:
                out, self._pending = self._pending[:n], self._pending[n:]
                return out
            topic.waited += 1
            due = [m for t, m in topic.later if time.monotonic() - self._t0 >= t]
            topic.later = [(t, m) for t, m in topic.later if m not in due]
            if not due:
                _BLOCK.wait(min(timeout, 0.02))  # as the real call blocks for its timeout
            return due

        def close(self) -> None:
            topic.closed = True
    return _Consumer


def _beat(instance: str, *, ago: float = 0.0, host: str = "h1", pid: int = 42) -> bytes:
    data = json.loads(alive_value("g", "w1", instance))
    data.update(at=time.time() - ago, host=host, pid=pid)
    return json.dumps(data).encode()


def _check(monkeypatch: pytest.MonkeyPatch, topic: _Topic, wait_s: float = 0.5, timeout: float = 15.0) -> bool:
    monkeypatch.setattr(liveness, "Consumer", _consumer_of(topic))
    return check_alone({"bootstrap.servers": "x:1"}, "members", "g", "w1", "mine", wait_s=wait_s, timeout=timeout)


def test_an_empty_members_topic_lets_the_worker_start(monkeypatch: pytest.MonkeyPatch) -> None:
    topic = _Topic([])
    assert _check(monkeypatch, topic) is True
    assert topic.waited == 0 and topic.closed


def test_a_clean_stop_lets_the_next_worker_start_without_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    topic = _Topic([(KEY, _beat("old")), (KEY, None)])
    _check(monkeypatch, topic)
    assert topic.waited == 0


def test_a_heartbeat_written_long_ago_is_a_worker_that_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    topic = _Topic([(KEY, _beat("old", ago=3600))])
    _check(monkeypatch, topic)
    assert topic.waited == 0


def test_a_live_worker_with_the_id_stops_the_newcomer_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    topic = _Topic([(KEY, _beat("other", ago=0.5))], later=[(0.1, KEY, _beat("other", host="box-7", pid=4711))])
    with pytest.raises(WorkerError) as caught:
        _check(monkeypatch, topic, wait_s=5.0)
    text = str(caught.value)
    assert text.startswith("another worker runs with --worker-id w1 in consumer group g (host 'box-7', pid 4711, "
                           "its last heartbeat "), text
    assert "starting this one would fence it" in text and "its own --worker-id" in text, text
    assert topic.closed


def test_a_killed_worker_s_recent_heartbeat_costs_a_short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """No tombstone (SIGKILL): the newcomer waits for a newer heartbeat, sees none, starts."""
    topic = _Topic([(KEY, _beat("old", ago=1.0))])
    assert _check(monkeypatch, topic, wait_s=0.3) is True
    assert topic.waited > 0


def test_a_worker_that_stops_cleanly_during_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    topic = _Topic([(KEY, _beat("old", ago=0.2))], later=[(0.05, KEY, None), (0.1, KEY, _beat("new"))])
    _check(monkeypatch, topic, wait_s=5.0)  # the tombstone ends the wait: the later beat is not read


def test_junk_under_the_key_after_a_live_heartbeat_is_not_a_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Anyone who may write the topic may write junk under the key: it is skipped, never
    taken for the tombstone of a clean stop, before the check or during its wait."""
    deep = b"[" * 100_000 + b"]" * 100_000
    topic = _Topic([(KEY, _beat("other", ago=0.3)), (KEY, b"junk"), (KEY, deep), (KEY, b'{"instance": 1}')],
                   later=[(0.05, KEY, b"junk"), (0.1, KEY, deep), (0.15, KEY, _beat("other", pid=77))])
    with pytest.raises(WorkerError, match="pid 77"):
        _check(monkeypatch, topic, wait_s=5.0)


@pytest.mark.parametrize("at", ["10" + "0" * 400, "1e999", "NaN", "true", '"yesterday"', "null"])
def test_a_heartbeat_with_an_unusable_time_still_waits_and_names_the_worker(
        monkeypatch: pytest.MonkeyPatch, at: str) -> None:
    odd = b'{"instance": "other", "host": "h9", "pid": 9, "at": ' + at.encode() + b"}"
    topic = _Topic([(KEY, odd)], later=[(0.05, KEY, odd)])
    with pytest.raises(WorkerError) as caught:
        _check(monkeypatch, topic, wait_s=5.0)
    assert "(host 'h9', pid 9): starting this one" in str(caught.value), caught.value


def test_only_heartbeats_written_after_the_check_began_count_as_newer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The backlog's older heartbeats of the same worker are not proof that it runs."""
    topic = _Topic([(KEY, _beat("other", ago=5.0)), (KEY, _beat("other", ago=4.0)), (KEY, _beat("other", ago=3.5))])
    assert _check(monkeypatch, topic, wait_s=0.3) is True


def test_the_check_reads_a_window_not_the_whole_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    """From the first record of the last two minutes; a heartbeat before it (a worker gone
    long ago, not compacted yet) is not read."""
    topic = _Topic([(KEY, _beat("other", ago=1.0))] + [(alive_key("g", f"x{i}"), _beat("x")) for i in range(20)])
    topic.since = 5
    monkeypatch.setattr(liveness, "WINDOW_RECORDS", 3)  # and at least the last 3 records
    assert _check(monkeypatch, topic, wait_s=5.0) is True
    assert topic.assigned_at == 5 and topic.waited == 0
    topic.since, topic.waited = -1, 0  # nothing written in the window: the last 3 records are read
    assert _check(monkeypatch, topic, wait_s=5.0) is True
    assert topic.assigned_at == 18


def test_a_topic_not_read_in_time_is_not_checked(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    topic = _Topic([(KEY, _beat("other", ago=0.5))])
    topic.slow = True
    with caplog.at_level(logging.WARNING):
        assert _check(monkeypatch, topic, timeout=0.3) is False
    assert "not checked: the members topic 'members': not read within 0 s" in caplog.text, caplog.text


def test_other_workers_groups_and_garbage_are_not_this_id(monkeypatch: pytest.MonkeyPatch) -> None:
    other = alive_key("g", "w2")
    topic = _Topic([(other, _beat("x")), (alive_key("h", "w1"), _beat("y")),
                    (member_key("g", "w1"), member_value("w1", "g", "in", "http://a:1")),
                    (KEY, b"\xff not json"), (KEY, b'{"instance": 7}')],
                   later=[(0.05, other, _beat("x"))])
    _check(monkeypatch, topic, wait_s=0.3)
    assert topic.waited == 0


@pytest.mark.parametrize(("listed", "refuse", "why"), [
    (None, None, "it does not exist"),
    (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), None, "Authorization"),
    ("ok", KafkaError(KafkaError._TIMED_OUT), "Timed out"),
])
def test_no_members_topic_or_no_access_skips_the_check_with_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, listed: Any, refuse: Any, why: str) -> None:
    """Not checked: False, so the caller writes no heartbeat (which could create the topic)."""
    topic = _Topic([], refuse=refuse, listed=listed)
    with caplog.at_level(logging.WARNING):
        assert _check(monkeypatch, topic) is False
    assert "one worker per --worker-id not checked: the members topic 'members': " in caplog.text
    assert why.lower() in caplog.text.lower(), caplog.text
    assert topic.closed


def test_query_readers_skip_the_heartbeats() -> None:
    """The members topic also holds the query addresses: a heartbeat is never one of them."""
    for value in (alive_value("g", "w1", "i"), None):
        found = read_member(KEY, value)
        assert found is None or found[0] != "g", found
    assert read_alive(member_value("w1", "g", "in", "http://a:1")) is None
    assert read_alive(None) is None
    deep = b"[" * 100_000 + b"]" * 100_000  # whoever wrote it: never a crash of a reader
    assert read_member(member_key("g", "w1"), deep) is None and read_alive(deep) is None


class _Producer:
    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.sent: list[tuple[str, bytes | None, bytes]] = []
        self.flushed: list[float] = []

    def produce(self, topic: str, value: bytes | None, key: bytes, on_delivery: Any = None) -> None:
        self.sent.append((topic, value, key))

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float) -> int:
        self.flushed.append(timeout)
        return 0

    def list_topics(self, timeout: float) -> Any:
        self.looked += 1
        return SimpleNamespace(topics={t: SimpleNamespace(error=None) for t in self.topics})

    topics: list[str] = []
    looked = 0


@pytest.mark.parametrize("clean", [True, False])
def test_the_heartbeat_beats_and_a_clean_stop_leaves_a_tombstone(monkeypatch: pytest.MonkeyPatch,
                                                                  clean: bool) -> None:
    made: list[_Producer] = []
    monkeypatch.setattr(liveness, "Producer", lambda conf: made.append(_Producer(conf)) or made[-1])
    beat = Heartbeat({"bootstrap.servers": "x:1"}, "members", "g", "w1", every=0.01)
    beat.start()
    wait_until(lambda: len(made[0].sent) >= 3, timeout=5, interval=0.01)  # beats from the heartbeat's thread
    beat.stop(clean=clean)
    (producer,) = made
    assert producer.conf["client.id"] == "w1-alive" and producer.conf["enable.idempotence"] is True
    beats = [v for _t, v, _k in producer.sent[:-1]]
    assert len(beats) >= 2 and all(_t == "members" and k == KEY for _t, _v, k in producer.sent)
    bodies = [read_alive(v) for v in beats]
    assert all(b is not None and b["instance"] == beat.instance and b["worker"] == "w1" and b["group"] == "g"
               for b in bodies), bodies
    assert (producer.sent[-1][1] is None) is clean  # the tombstone: only when the worker left cleanly
    assert beat._thread is None  # stopped and joined: no more beats


def test_a_worker_started_without_the_topic_beats_once_it_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[_Producer] = []
    monkeypatch.setattr(liveness, "Producer", lambda conf: made.append(_Producer(conf)) or made[-1])
    beat = Heartbeat({"bootstrap.servers": "x:1"}, "members", "g", "w1", every=0.01, look_again=0.05)
    beat.start(active=False)
    (producer,) = made
    assert producer.conf["allow.auto.create.topics"] is False  # a deleted members topic stays deleted
    wait_until(lambda: producer.looked >= 2, timeout=5, interval=0.01)  # it looked for the topic twice
    assert producer.sent == [] and not beat.active  # no topic: nothing written (it could be created)
    producer.topics = ["members"]
    wait_until(lambda: producer.sent, timeout=5, interval=0.01)
    beat.stop(clean=True)
    assert beat.active and producer.sent and producer.sent[-1][1] is None
    assert read_alive(producer.sent[0][1]) is not None


def test_an_inactive_heartbeat_leaves_no_tombstone(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[_Producer] = []
    monkeypatch.setattr(liveness, "Producer", lambda conf: made.append(_Producer(conf)) or made[-1])
    beat = Heartbeat({"bootstrap.servers": "x:1"}, "members", "g", "w1", every=0.01, look_again=10)
    beat.start(active=False)
    beat.stop(clean=True)
    assert made[0].sent == []


class _Alive(FakeClients):
    def __init__(self) -> None:
        super().__init__({("in", 0): 0})
        self.calls: list[str] = []

    def alive(self, topic: str, group: str, worker_id: str) -> Any:
        self.calls.append(f"alive {topic} {group} {worker_id}")
        calls = self.calls

        class _Beat:
            def stop(self, clean: bool) -> None:
                calls.append(f"stop clean={clean}")
        return _Beat()

    def producer(self, conf: dict[str, Any], *, transactional: bool) -> Any:
        p = super().producer(conf, transactional=transactional)
        original = p.init

        def init(timeout: float = 60.0) -> None:
            self.calls.append("init_transactions")
            original(timeout)
        p.init = init
        return p


@pytest.mark.parametrize("static", [True, False])
def test_a_worker_with_a_stable_id_checks_before_it_fences(tmp_path: Path, static: bool) -> None:
    clients = _Alive()
    settings = Settings(home=tmp_path / "home", input_topic="in", state_topic="state", dlq_topic="dlq",
                        members_topic="mem")
    w = Worker(settings, None, WorkerOptions(worker_id="w1", state_dir=tmp_path / "state", static_membership=static),
               catalog=SchemaCatalog.load(), clients=clients)
    w.connect()
    w.stop()
    w.close()
    if static:
        assert clients.calls == ["alive mem fifolane-table w1", "init_transactions", "stop clean=True"]
    else:  # host-pid ids are never reused: nothing to check
        assert clients.calls == ["init_transactions"]
