"""services.worker.group_admin: the group describes answered by a child process, so that a
librdkafka abort there (librdkafka#4605) costs one answer, not the worker. The children here
are small scripts speaking the same JSON lines; the real child against a real broker is in
tests/integration/test_group_admin_live.py."""

from __future__ import annotations

import io
import json
import signal
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupState, KafkaException, TopicCollection
from kafka_fixtures import wait_until

from services.worker.group_admin import GroupAdmin, plain_config, serve

# Answers every request; the group's id is the bootstrap setting it was given (to show the
# configuration arrived). With ABORT_FIRST set in argv, the first child aborts on its first
# request, as librdkafka's failed assertion does.
CHILD = r'''
import json, os, sys
conf = json.loads(sys.stdin.readline())
mark = sys.argv[1] if len(sys.argv) > 1 else ""
for line in sys.stdin:
    req = json.loads(line)
    if mark and not os.path.exists(mark):
        open(mark, "w").close()
        os.abort()
    if req["op"] == "topic":
        ok = {"name": req["name"], "partitions": 3}
    elif req["name"] == "missing":
        print(json.dumps({"id": req["id"], "op": "group", "error": "no such group", "code": 69}), flush=True)
        continue
    else:
        ok = {"group_id": conf["bootstrap.servers"], "state": "STABLE", "members": [
            {"member_id": "m1", "group_instance_id": "w1", "client_id": "w1-consumer", "host": "/h",
             "assignment": [["in", 0], ["in", 2], ["dir", 1]]},
            {"member_id": "m2", "group_instance_id": None, "client_id": "w2-consumer", "host": "/h",
             "assignment": None}]}
    print(json.dumps({"id": req["id"], "op": req["op"], "ok": ok}), flush=True)
'''


def _admin(*args: str) -> GroupAdmin:
    return GroupAdmin({"bootstrap.servers": "b:9092", "error_cb": print}, command=[sys.executable, "-c", CHILD, *args])


def test_answers_have_the_shape_of_admin_clients_and_the_configuration_reaches_the_child() -> None:
    admin = _admin()
    try:
        desc = admin.describe_consumer_groups(["g"], request_timeout=5)["g"].result(20)
        topic = admin.describe_topics(TopicCollection(["in"]), request_timeout=5)["in"].result(20)
    finally:
        admin.close()
    assert desc.group_id == "b:9092" and desc.state == ConsumerGroupState.STABLE
    m1, m2 = desc.members
    assert (m1.member_id, m1.group_instance_id, m1.client_id) == ("m1", "w1", "w1-consumer")
    assert [(tp.topic, tp.partition) for tp in m1.assignment.topic_partitions] == [("in", 0), ("in", 2), ("dir", 1)]
    assert m2.group_instance_id is None and m2.assignment is None
    assert len(topic.partitions) == 3
    assert admin.started == 1 and admin.died == []


def test_an_error_answer_fails_that_question_only() -> None:
    admin = _admin()
    try:
        futures = admin.describe_consumer_groups(["missing", "g"], request_timeout=5)
        with pytest.raises(KafkaException, match="no such group") as err:
            futures["missing"].result(20)
        assert err.value.args[0].code() == 69
        assert futures["g"].result(20).group_id == "b:9092"
    finally:
        admin.close()


def test_a_child_that_aborts_fails_its_questions_and_the_next_question_starts_another(tmp_path: Path) -> None:
    admin = _admin(str(tmp_path / "aborted-once"))
    try:
        with pytest.raises(KafkaException, match="exited with code"):
            admin.describe_consumer_groups(["g"], request_timeout=5)["g"].result(20)
        assert admin.died == [-signal.SIGABRT]
        assert admin.describe_consumer_groups(["g"], request_timeout=5)["g"].result(20).group_id == "b:9092"
        assert admin.started == 2
    finally:
        admin.close()


def test_close_ends_the_child_and_fails_what_it_had_not_answered() -> None:
    admin = GroupAdmin({}, command=[sys.executable, "-c", "import sys\nfor line in sys.stdin: pass"])  # never answers
    future = admin.describe_consumer_groups(["g"], request_timeout=5)["g"]
    proc = admin._proc
    assert proc is not None
    admin.close()
    assert proc.returncode == 0  # ended: its input closed
    with pytest.raises(KafkaException, match="closed"):
        future.result(1)
    assert admin.died == []  # closed, not died
    late = admin.describe_consumer_groups(["g"])["g"]  # a refresh that raced the close: no new child
    with pytest.raises(KafkaException, match="closed"):
        late.result(1)
    assert admin.started == 1 and admin._proc is None


def test_only_plain_settings_go_to_the_child() -> None:
    conf = {"bootstrap.servers": "b", "retries": 3, "enable.idempotence": True, "error_cb": print, "x": object()}
    assert plain_config(conf) == {"bootstrap.servers": "b", "retries": 3, "enable.idempotence": True}


def test_the_real_child_answers_a_broker_it_cannot_reach_with_an_error_not_a_hang() -> None:
    """``serve`` (the child's loop) with confluent-kafka's AdminClient and no broker: the
    question fails after its request time-out and says so."""
    out = io.BytesIO()
    inp = io.BytesIO(json.dumps({"bootstrap.servers": "127.0.0.1:9", "socket.connection.setup.timeout.ms": 1000}
                                ).encode() + b"\n" + json.dumps({"id": 7, "op": "group", "name": "g",
                                                                 "timeout": 1.0}).encode() + b"\n")
    serve(inp, out)  # returns at the end of its input; the admin's destruction waits for the answer
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(answers) == 1 and answers[0]["id"] == 7 and "error" in answers[0], answers


def test_a_future_is_what_callers_get() -> None:
    admin = _admin()
    try:
        assert isinstance(admin.describe_topics(["in"])["in"], Future)
    finally:
        admin.close()


def test_a_child_that_hangs_is_killed_at_the_next_question_once_an_answer_is_overdue() -> None:
    """A child that never answers (a librdkafka deadlock, a stopped process): once a question
    is overdue (twice its request time-out, plus the slack), the next question kills it and
    starts another; the overdue question fails."""
    silent = "import sys\nfor line in sys.stdin: pass"
    admin = GroupAdmin({}, command=[sys.executable, "-c", silent])
    admin.slack = 0.0
    try:
        first = admin.describe_consumer_groups(["g"], request_timeout=0.05)["g"]
        hung = admin._proc
        wait_until(lambda: admin.describe_topics(["t"], request_timeout=60) and admin.started > 1,
                   timeout=10, interval=0.05, message="the hung child was not replaced")
        with pytest.raises(KafkaException, match="exited with code"):
            first.result(1)
        assert hung is not None and hung.returncode == -signal.SIGKILL and admin.died[0] == -signal.SIGKILL
    finally:
        admin.close()


def test_no_thread_outlives_close() -> None:
    before = {t.ident for t in threading.enumerate()}
    admin = _admin()
    admin.describe_consumer_groups(["g"])["g"].result(20)
    admin.close()
    assert [t.name for t in threading.enumerate() if t.ident not in before] == []


def test_a_child_that_answers_only_errors_for_a_while_is_replaced() -> None:
    """librdkafka's admin client does not recover from a broker restart (stale leader epochs
    and coordinator): a child whose answers have all been errors for ``renew_after`` is
    replaced at the next question; one good answer in between resets the clock."""
    admin = _admin()
    admin.renew_after = 0.3
    try:
        with pytest.raises(KafkaException, match="no such group"):
            admin.describe_consumer_groups(["missing"], request_timeout=5)["missing"].result(20)
        assert admin.describe_consumer_groups(["g"], request_timeout=5)["g"].result(20).group_id == "b:9092"
        with pytest.raises(KafkaException, match="no such group"):
            admin.describe_consumer_groups(["missing"], request_timeout=5)["missing"].result(20)
        assert admin.started == 1  # errors, but not for renew_after yet
        wait_until(lambda: admin._failing_since is not None and time.monotonic() - admin._failing_since > 0.3,
                   timeout=5, message="the failing clock")
        with pytest.raises(KafkaException, match="no such group"):
            admin.describe_consumer_groups(["missing"], request_timeout=5)["missing"].result(20)
        assert admin.started == 2  # a new child asked that one
        assert admin.died == [-signal.SIGKILL]
        assert admin.describe_consumer_groups(["g"], request_timeout=5)["g"].result(20).group_id == "b:9092"
        assert admin.started == 2
    finally:
        admin.close()
