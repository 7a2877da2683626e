"""Describing the consumer group from a child process, so that librdkafka cannot abort the worker.

librdkafka's coordinator admin requests (DescribeConsumerGroups) can fail an assertion and abort
the process when their connection to the group coordinator is lost mid-request
(``rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0``: confluentinc/librdkafka
#4605, open in 2.16). A worker asks such questions on a timer while it runs (the orphan watch
of a static member, services.worker.orphans; the query endpoint's roster,
services.worker.query.members), so a broker that stalls at the wrong moment killed a worker
that was otherwise fine. :class:`GroupAdmin` asks them from a small child process instead
(``python -m services.worker.group_admin``) and answers like confluent-kafka's AdminClient:
``describe_consumer_groups`` and ``describe_topics`` return futures of objects with the same
attributes the callers read. If the child dies, its unanswered questions fail with a
:class:`KafkaException` (the caller asks again at its next look) and the next question starts
a new child. So does a child whose every answer has been an error for :attr:`GroupAdmin.renew_after`
seconds: librdkafka 2.16's admin client does not recover from a broker restart (it keeps the
partitions' old leader epochs and coordinator: ``FENCED_LEADER_EPOCH`` or time-outs for good),
while a new client answers at once.

The wire between the two is JSON lines: the first line to the child is the client
configuration (plain values only; never argv, which other users can read), then one request
per line, ``{"id", "op": "group" | "topic", "name", "timeout"}``; the child answers
``{"id", "ok": ...}`` or ``{"id", "error", "code"}``. The child exits when its input closes
(the worker stopped or died).
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import IO, Any

from confluent_kafka import ConsumerGroupState, KafkaError, KafkaException, TopicPartition

__all__ = ["GroupAdmin", "plain_config"]

log = logging.getLogger(__name__)

_ROOT = str(Path(__file__).resolve().parents[2])  # the directory that holds the services package


def plain_config(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a child can be given: callbacks and other objects stay behind."""
    return {k: v for k, v in conf.items() if isinstance(v, str | int | float | bool)}


class GroupAdmin:
    """``describe_consumer_groups`` / ``describe_topics`` answered by a child process (see the
    module docstring). ``command``: the child's command line (tests give another one)."""

    def __init__(self, conf: Mapping[str, Any], *, command: list[str] | None = None) -> None:
        self._conf = plain_config(conf)
        self._command = command or [sys.executable, "-m", "services.worker.group_admin"]
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pending: dict[int, Future[Any]] = {}
        self._due: dict[int, float] = {}  # question -> when its answer is overdue (the child hangs)
        self._ids = itertools.count(1)
        self.started = 0  # children started (the first one included)
        self.died: list[int] = []  # exit codes of children that ended while in use
        self.slack = 5.0  # seconds past twice its request time-out that an answer is overdue
        self._closed = False  # after close(), questions fail at once (no new child)
        self.renew_after = 20.0  # seconds of nothing but error answers before a new child
        self._failing_since: float | None = None  # the first error answer since the last good one
        self._reader: threading.Thread | None = None  # reads the current child's answers

    # -- AdminClient's shape ---------------------------------------------------------------
    def describe_consumer_groups(self, groups: list[str], request_timeout: float = 10.0) -> dict[str, Future[Any]]:
        return {g: self._ask("group", g, request_timeout) for g in groups}

    def describe_topics(self, topics: Any, request_timeout: float = 10.0) -> dict[str, Future[Any]]:
        names = list(getattr(topics, "topic_names", topics))
        return {t: self._ask("topic", t, request_timeout) for t in names}

    def close(self) -> None:
        """End the child now (its input closes, then a kill if it lingers); later questions fail."""
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
            pending, self._pending = list(self._pending.values()), {}
            self._due.clear()
        for future in pending:
            future.set_exception(KafkaException(KafkaError(KafkaError._DESTROY, "the group admin was closed")))
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        if self._reader is not None:
            self._reader.join(5)  # it ends with the child's output: no thread outlives close()

    # -- the parent's side -----------------------------------------------------------------
    def _ask(self, op: str, name: str, timeout: float) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                future.set_exception(KafkaException(KafkaError(KafkaError._DESTROY, "the group admin was closed")))
                return future
            rid = next(self._ids)
            now = time.monotonic()
            if self._proc is not None and any(due < now for due in self._due.values()):
                # A question unanswered well past its request time-out: the child hangs (a
                # librdkafka deadlock, a stopped process). Killed: its reader fails what it had.
                log.warning("the group admin process has not answered for %.0f s: killing it", now - min(self._due.values()))
                self._proc.kill()
                self._proc.wait()
            elif self._proc is not None and self._failing_since is not None and now - self._failing_since > self.renew_after:
                log.warning("the group admin process has answered nothing but errors for %.0f s: starting a new one "
                            "(its client may not have recovered from a broker restart)", now - self._failing_since)
                self._failing_since = None
                self._proc.kill()
                self._proc.wait()
            try:
                proc = self._child()
                self._pending[rid] = future
                self._due[rid] = now + 2 * timeout + self.slack
                assert proc.stdin is not None
                proc.stdin.write(json.dumps({"id": rid, "op": op, "name": name, "timeout": timeout}).encode() + b"\n")
                proc.stdin.flush()
            except OSError as exc:  # the child is gone: the reader thread fails what it had
                self._pending.pop(rid, None)
                self._due.pop(rid, None)
                future.set_exception(KafkaException(KafkaError(KafkaError._TRANSPORT,
                                                               f"the group admin process is gone: {exc}")))
        return future

    def _child(self) -> subprocess.Popen[bytes]:
        if self._proc is not None:
            if self._proc.poll() is None:
                return self._proc
            self._fail_pending(self._proc.returncode)  # before its reader got to them
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (_ROOT, os.environ.get("PYTHONPATH")) if p)}
        proc = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(self._conf).encode() + b"\n")
        proc.stdin.flush()
        self._proc = proc
        self.started += 1
        self._reader = threading.Thread(target=self._read, args=(proc,), name="group-admin-reader", daemon=True)
        self._reader.start()
        return proc

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                msg = json.loads(line)
                rid = int(msg["id"])
            except (ValueError, KeyError, TypeError):
                log.warning("group admin process: unreadable answer %r", line[:200])
                continue
            with self._lock:
                future = self._pending.pop(rid, None)
                self._due.pop(rid, None)
                if "ok" in msg:
                    self._failing_since = None
                elif self._failing_since is None:
                    self._failing_since = time.monotonic()
            if future is None:
                continue
            if "ok" in msg:
                try:
                    future.set_result(_answer(msg["op"], msg["ok"]))
                except (KeyError, TypeError, ValueError) as exc:
                    future.set_exception(KafkaException(KafkaError(KafkaError._BAD_MSG, f"unreadable answer: {exc!r}")))
            else:
                future.set_exception(KafkaException(KafkaError(int(msg.get("code", KafkaError._FAIL)), msg["error"])))
        code = proc.wait()
        with self._lock:
            if self._proc is not proc:
                return  # closed by us (close() failed what was pending)
            self._proc = None
            self._fail_pending(code)

    def _fail_pending(self, code: int) -> None:
        """The child ended with ``code`` (lock held): what it had not answered fails."""
        pending, self._pending = list(self._pending.values()), {}
        self._due.clear()
        self.died.append(code)
        why = " (SIGABRT: librdkafka#4605, a coordinator request's connection lost)" if code == -signal.SIGABRT else ""
        log.warning("the group admin process exited with code %s%s; %d question(s) unanswered, the next one "
                    "starts a new process", code, why, len(pending))
        for future in pending:
            future.set_exception(KafkaException(KafkaError(KafkaError._TRANSPORT,
                                                           f"the group admin process exited with code {code}")))


def _answer(op: str, ok: dict[str, Any]) -> Any:
    """The child's plain answer as the objects AdminClient's futures give."""
    if op == "topic":
        return SimpleNamespace(name=ok["name"], partitions=list(range(ok["partitions"])))
    members = [SimpleNamespace(
        member_id=m["member_id"], group_instance_id=m["group_instance_id"], client_id=m["client_id"],
        host=m["host"], assignment=None if m["assignment"] is None else SimpleNamespace(
            topic_partitions=[TopicPartition(t, p) for t, p in m["assignment"]]))
        for m in ok["members"]]
    return SimpleNamespace(group_id=ok["group_id"], state=ConsumerGroupState[ok["state"]], members=members)


# -- the child's side ----------------------------------------------------------------------
def _plain(op: str, result: Any) -> dict[str, Any]:
    if op == "topic":
        return {"name": result.name, "partitions": len(result.partitions)}
    return {"group_id": result.group_id, "state": result.state.name, "members": [{
        "member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
        "host": m.host, "assignment": None if m.assignment is None else [
            [tp.topic, tp.partition] for tp in m.assignment.topic_partitions]} for m in result.members]}


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """The child: answer requests from ``inp`` until it closes."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({**json.loads(inp.readline()), "client.id": "fifolane-group-admin"})
    lock = threading.Condition()
    open_questions = [0]
    longest = 0.0

    def reply(rid: int, op: str, future: Future[Any]) -> None:
        try:
            msg: dict[str, Any] = {"id": rid, "op": op, "ok": _plain(op, future.result())}
        except KafkaException as exc:
            err = exc.args[0]
            msg = {"id": rid, "op": op, "error": str(err), "code": err.code() if isinstance(err, KafkaError) else -1}
        except Exception as exc:  # noqa: BLE001 - any failure is the question's, not the child's
            msg = {"id": rid, "op": op, "error": f"{type(exc).__name__}: {exc}", "code": KafkaError._FAIL}
        with lock:
            try:
                out.write(json.dumps(msg).encode() + b"\n")
                out.flush()
            except (OSError, ValueError):
                pass  # the worker is gone
            open_questions[0] -= 1
            lock.notify_all()

    for line in inp:
        req = json.loads(line)
        rid, op, name, timeout = req["id"], req["op"], req["name"], float(req["timeout"])
        longest = max(longest, timeout)
        with lock:
            open_questions[0] += 1
        try:
            if op == "group":
                future = admin.describe_consumer_groups([name], request_timeout=timeout)[name]
            else:
                future = admin.describe_topics(TopicCollection([name]), request_timeout=timeout)[name]
        except KafkaException as exc:
            future = Future()
            future.set_exception(exc)
        future.add_done_callback(functools.partial(reply, rid, op))
    with lock:  # the input ended: answer what is open (each bounded by its request time-out)
        lock.wait_for(lambda: open_questions[0] <= 0, longest + 5)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's Ctrl-C is the worker's to handle
    serve(sys.stdin.buffer, sys.stdout.buffer)
