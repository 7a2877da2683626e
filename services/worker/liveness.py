"""One live worker per ``--worker-id`` across machines: a heartbeat in the members topic.

A second worker started with the ``--worker-id`` of a running one fences it: its
``init_transactions`` fences the running one's producer, its consumer joins with the same
``group.instance.id`` and fences the running one's consumer. On one machine the state
directory's lock stops the second one first (services.worker.storedirs); on another machine
the two fenced each other until the newcomer gave up (services.worker.rebalance,
``ConsumerFailures``). A supervisor that restarts the newcomer (docker-compose's
``restart: unless-stopped``) started that fight again and again, until the running worker
gave up too.

So every worker writes a heartbeat to the members topic (role ``members``, compacted, one
partition): key ``alive:<group>/<worker id>``, a small JSON value (``worker``, ``group``,
``instance``: a random id per process, ``host``, ``pid``, ``at``: epoch seconds), every
:data:`EVERY_S`, and a tombstone when it stops cleanly. Before a worker makes a
transactional producer or joins its group, :func:`check_alone` reads the topic: a heartbeat
of its key that is recent, or that is followed by a newer one within :data:`WAIT_S`, means
another process runs with this id, and the worker stops with a message naming it, before it
has touched anything. A predecessor that was killed (no tombstone) stops writing: the new
worker waits at most :data:`WAIT_S` to see that, and only if the last heartbeat is at most
:data:`RECENT_S` old by its own clock (clocks of two machines may differ by a little: the
wait decides, not the clock). A clean stop's tombstone costs no wait.

Best effort: a missing members topic, a principal without READ and WRITE on it, or a Kafka
that does not answer skips the check, and the heartbeat, with one warning (``fifolane topics
create`` makes the topic; ``fifolane acls apply --role worker`` grants it). The older rule
then still holds: a newcomer fenced twice within a minute of its start stops
(services.worker.rebalance).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from fifolane.errors import WorkerError
from fifolane.query import json_object

__all__ = ["EVERY_S", "RECENT_S", "WAIT_S", "Heartbeat", "alive_key", "check_alone", "read_alive"]

log = logging.getLogger(__name__)

#: Seconds between two heartbeats of a worker.
EVERY_S = 1.0
#: How long a newcomer waits for a newer heartbeat of its key after a recent one.
WAIT_S = 3.0
#: A heartbeat whose ``at`` is older than this by the newcomer's clock is a worker that is
#: gone: no wait. Generous: the clocks of two machines may differ (the wait decides).
RECENT_S = 600.0
#: A newcomer reads the topic's records of the last WINDOW_S (by record time), and at least
#: its last WINDOW_RECORDS: a live worker's last heartbeat is among them, and a members topic
#: that compaction has not caught up with yet costs no more than that.
WINDOW_S = 120.0
WINDOW_RECORDS = 10_000
#: How often a worker that started without the members topic looks for it again.
LOOK_AGAIN_S = 10.0


def alive_key(group: str, worker_id: str) -> bytes:
    """The heartbeat's key: apart from the query addresses' ``<group>/<worker id>``
    (fifolane.query.member_key), which readers of those skip (no ``url``)."""
    return f"alive:{group}/{worker_id}".encode()


def alive_value(group: str, worker_id: str, instance: str) -> bytes:
    return json.dumps({"worker": worker_id, "group": group, "instance": instance,
                       "host": socket.gethostname(), "pid": os.getpid(), "at": round(time.time(), 3)}).encode()


def read_alive(value: bytes | None) -> dict[str, Any] | None:
    """A heartbeat's body; None for a tombstone or a value that is not one (never fatal:
    anyone who may write the topic may write anything to it)."""
    body = None if value is None else json_object(value)
    return body if body is not None and isinstance(body.get("instance"), str) else None


def _at(body: dict[str, Any]) -> float | None:
    """The heartbeat's ``at`` if it is a usable time (not a bool, a huge int or NaN)."""
    at = body.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        return None
    try:
        value = float(at)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def _describe(body: dict[str, Any], now: float) -> str:
    at = _at(body)
    ago = f", its last heartbeat {max(0.0, now - at):.1f} s ago" if at is not None else ""
    return f"host {str(body.get('host'))[:100]!r}, pid {str(body.get('pid'))[:20]}{ago}"


def check_alone(conf: dict[str, Any], topic: str, group: str, worker_id: str, instance: str, *,
                wait_s: float = WAIT_S, recent_s: float = RECENT_S, timeout: float = 15.0) -> bool:
    """Stop (:class:`WorkerError`) if another live process has this ``worker_id`` in
    ``group`` (the module docstring). True: the id is free; False: not checked (no members
    topic, no access, or Kafka did not answer in time: warned)."""
    consumer = Consumer({**conf, "group.id": "fifolane-alive-check", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "client.id": f"{worker_id}-alive-check",
                         "allow.auto.create.topics": False, "enable.partition.eof": True})
    unchecked = "one worker per --worker-id not checked: the members topic %r: %s"
    try:
        found = consumer.list_topics(timeout=timeout).topics.get(topic)  # all topics: never creates one
        if found is None or found.error is not None:
            why = "it does not exist" if found is None else found.error.str()
            log.warning(unchecked + " (run `fifolane topics create`, or set FIFOLANE_MEMBERS_TOPIC)", topic, why)
            return False
        if not _check(consumer, topic, alive_key(group, worker_id), group, worker_id, instance,
                      wait_s, recent_s, timeout):
            log.warning(unchecked, topic, f"not read within {timeout:.0f} s")
            return False
        return True
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        why = err.str() if isinstance(err, KafkaError) else str(exc)
        log.warning(unchecked + " (the worker role needs READ and WRITE on it: `fifolane acls apply "
                    "--role worker`)", topic, why)
        return False
    finally:
        consumer.close()


def _window_start(consumer: Consumer, topic: str, low: int, high: int, timeout: float) -> int:
    since = consumer.offsets_for_times([TopicPartition(topic, 0, int((time.time() - WINDOW_S) * 1000))],
                                       timeout=timeout)[0].offset
    return max(low, min(high if since < 0 else since, high - WINDOW_RECORDS))


def _check(consumer: Consumer, topic: str, key: bytes, group: str, worker_id: str, instance: str,
           wait_s: float, recent_s: float, timeout: float) -> bool:
    """True: free (or :class:`WorkerError`); False: the window was not read in time."""
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout)
    if high <= low:
        return True
    consumer.assign([TopicPartition(topic, 0, _window_start(consumer, topic, low, high, timeout))])
    last: dict[str, Any] | None = None  # this key's last heartbeat before ``high`` (None: none, or a tombstone)
    newer: list[Any] = []  # records written since the check began (offset >= high)
    deadline, pos = time.monotonic() + timeout, low
    while pos < high:
        if time.monotonic() >= deadline:
            return False
        for msg in consumer.consume(10_000, timeout=0.5):
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                pos = max(pos, msg.offset() or pos)
            elif (msg.offset() or 0) >= high:
                newer.append(msg)
                pos = high
            else:
                pos = (msg.offset() or 0) + 1
                if msg.key() == key and (msg.value() is None or read_alive(msg.value()) is not None):
                    last = read_alive(msg.value())  # junk under the key is not a tombstone: skipped
    if last is None or last.get("instance") == instance:
        return True
    now, at = time.time(), _at(last)
    if at is not None and now - at > recent_s:
        return True  # written long ago: a worker that is gone
    # Recent: a worker killed a moment ago, or one that runs. Only a newer heartbeat tells.
    log.info("--worker-id %s has a recent heartbeat (%s): waiting up to %.0f s to see whether "
             "that worker still runs", worker_id, _describe(last, now), wait_s)
    until = time.monotonic() + wait_s
    while True:
        for msg in newer:
            if msg.error() is not None or msg.key() != key:
                continue
            if msg.value() is None:
                return True  # it stopped cleanly meanwhile
            body = read_alive(msg.value())
            if body is not None and body.get("instance") != instance:
                raise _taken(worker_id, group, body, time.time())
        if time.monotonic() >= until:
            return True
        newer = consumer.consume(1000, timeout=0.2)


def _taken(worker_id: str, group: str, body: dict[str, Any], now: float) -> WorkerError:
    return WorkerError(f"another worker runs with --worker-id {worker_id} in consumer group {group} "
                       f"({_describe(body, now)}): starting this one would fence it. Give each worker "
                       "its own --worker-id (or leave it out: host and pid), or stop the other one first")


class Heartbeat:
    """Writes this worker's heartbeat every :data:`EVERY_S` on a thread; :meth:`stop` writes
    the tombstone (a clean stop) or nothing (a failed start: the key may be another's).

    Started inactive (the members topic was missing or unreadable at the check), it looks for
    the topic every :data:`LOOK_AGAIN_S` and beats once it is there: a worker that was there
    first is protected once `fifolane topics create` has run. Its producer never creates the
    topic (a deleted members topic stays deleted: its beats fail, with one warning)."""

    def __init__(self, conf: dict[str, Any], topic: str, group: str, worker_id: str,
                 instance: str | None = None, every: float = EVERY_S, look_again: float = LOOK_AGAIN_S) -> None:
        self.topic, self.group, self.worker_id = topic, group, worker_id
        self.instance = instance or uuid.uuid4().hex
        self.every, self.look_again = every, look_again
        self._conf = {**conf, "enable.idempotence": True, "acks": "all", "linger.ms": 0,
                      "allow.auto.create.topics": False, "client.id": f"{worker_id}-alive"}
        self._producer: Producer | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = False
        self.active = False

    def start(self, active: bool = True) -> None:
        """Beat now and on a thread (``active``), or once the topic exists."""
        self._producer = Producer(self._conf)
        self.active = active
        if active:
            self._beat()
        self._thread = threading.Thread(target=self._run, name="alive-heartbeat", daemon=True)
        self._thread.start()

    def _topic_exists(self) -> bool:
        assert self._producer is not None
        try:  # the full list: naming the topic could create it
            found = self._producer.list_topics(timeout=5).topics.get(self.topic)
        except KafkaException:
            return False
        return found is not None and found.error is None

    def _on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is not None and not self._warned:
            self._warned = True
            log.warning("heartbeat not written to %r: %s (another worker with this --worker-id "
                        "would not be noticed before it starts)", self.topic, err.str())

    def _beat(self, alive: bool = True) -> None:
        """Queue a heartbeat (``alive``) or the tombstone."""
        assert self._producer is not None
        body = alive_value(self.group, self.worker_id, self.instance) if alive else None
        try:
            self._producer.produce(self.topic, body, alive_key(self.group, self.worker_id),
                                   on_delivery=self._on_delivery)
        except (BufferError, KafkaException) as exc:
            log.debug("heartbeat not queued: %s", exc)
        self._producer.poll(0)

    def _run(self) -> None:
        waited = 0.0
        while not self._stop.wait(self.every):
            if not self.active:
                waited += self.every
                if waited < self.look_again:
                    continue
                waited = 0.0
                if not self._topic_exists():
                    continue
                self.active = True
                log.info("the members topic %r exists now: this worker's heartbeat is on", self.topic)
            self._beat()

    def stop(self, clean: bool) -> None:
        """Stop beating; ``clean``: write the tombstone (a successor need not wait)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        if self._producer is None:
            return
        if clean and self.active:
            self._beat(alive=False)
        self._producer.flush(5 if clean else 0)
        self._producer = None
