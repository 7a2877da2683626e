"""Who owns what, and where to ask: the consumer group's assignment plus the members topic.

- Ownership comes from the consumer group (``describe_consumer_groups``, asked from a child
  process: services.worker.group_admin): each member's
  assigned input partitions, and with them the directory partitions that go with them
  (``d mod N``: services/worker/linked.py). A member's client id is
  ``<worker id>-consumer`` (services/worker/clients.py).
- Query addresses come from the members topic (role ``members``, compacted): each worker
  with ``--query-port`` writes ``<group>/<worker id>`` -> JSON ``{"worker", "group",
  "input_topic", "url", "at"}`` when it starts and a tombstone when it stops cleanly.
  A topic rather than the group's member metadata: librdkafka gives no way to put user
  data in the cooperative-sticky subscription, and a topic can be read by clients that are
  not members (``fifolane get``, :class:`fifolane.client.StateClient`).

:class:`Roster` refreshes both every second on a thread and publishes an immutable
:class:`Routing` that the handlers, the standby placement and ``GET /v1/routing`` read.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from fifolane.errors import WorkerError
from fifolane.partitioner import murmur2
from fifolane.query import member_key, member_value, read_member
from services.worker.group_admin import GroupAdmin

__all__ = ["MemberInfo", "Roster", "Routing", "standby_placement"]

log = logging.getLogger(__name__)

_CONSUMER_SUFFIX = "-consumer"
#: how long refreshes may fail before the admin clients are made anew
_RENEW_AFTER_S = 5.0
#: how often a worker writes its members record again (the topic may have been made anew)
_ANNOUNCE_EVERY_S = 30.0


@dataclass(frozen=True)
class MemberInfo:
    """A worker of the group and its query address (None: it serves no queries)."""

    worker: str
    url: str | None


@dataclass(frozen=True)
class Routing:
    """The group's map at one time: owners of input and directory partitions, and urls."""

    input_partitions: int
    directory_partitions: int
    owners: dict[int, str] = field(default_factory=dict)
    directory_owners: dict[int, str] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)
    members: tuple[str, ...] = ()
    standby_replicas: int = 0
    at: float = 0.0

    def owner(self, partition: int) -> MemberInfo | None:
        worker = self.owners.get(partition)
        return None if worker is None else MemberInfo(worker, self.urls.get(worker))

    def directory_owner(self, partition: int) -> MemberInfo | None:
        worker = self.directory_owners.get(partition)
        return None if worker is None else MemberInfo(worker, self.urls.get(worker))

    def standbys(self, partition: int) -> list[str]:
        return standby_placement(partition, self.owners.get(partition), self.members, self.standby_replicas)

    def to_json(self) -> dict[str, Any]:
        return {
            "input_partitions": self.input_partitions,
            "directory_partitions": self.directory_partitions,
            "partitions": {str(p): {"owner": w, "url": self.urls.get(w),
                                    "standbys": [{"worker": s, "url": self.urls.get(s)} for s in self.standbys(p)]}
                           for p, w in sorted(self.owners.items())},
            "directory": {str(p): {"owner": w, "url": self.urls.get(w)}
                          for p, w in sorted(self.directory_owners.items())},
            "members": [{"worker": m, "url": self.urls.get(m)} for m in self.members],
            "standby_replicas": self.standby_replicas,
        }


def standby_placement(partition: int, owner: str | None, members: tuple[str, ...] | list[str],
                      replicas: int) -> list[str]:
    """The workers that keep a standby of ``partition``: the ``replicas`` members other than
    its owner with the highest rendezvous weight murmur2("<partition>/<worker>"). Every
    worker computes the same from the same membership, and a change of membership moves
    only the standbys of the workers that came or went."""
    if replicas <= 0 or owner is None:
        return []
    others = [m for m in members if m != owner]
    others.sort(key=lambda m: (murmur2(f"{partition}/{m}".encode()), m), reverse=True)
    return others[:replicas]


class Roster:
    """Refreshes :class:`Routing` on a thread (see the module docstring)."""

    def __init__(self, kafka_conf: dict[str, Any], *, group_id: str, input_topic: str,
                 directory_topic: str | None, members_topic: str, standby_replicas: int,
                 interval: float = 1.0) -> None:
        self._conf = kafka_conf
        self.group_id = group_id
        self._input = input_topic
        self._directory = directory_topic
        self._members_topic = members_topic
        self._replicas = standby_replicas
        self._interval = interval
        self._admin_client: AdminClient | None = None
        # the describes, in a child process (librdkafka#4605), started at the first one
        self._groups = GroupAdmin({**kafka_conf, "client.id": "fifolane-query-roster"})
        self._urls: dict[str, str] = {}
        self._reader: Consumer | None = None
        self.routing = Routing(0, 0, standby_replicas=standby_replicas)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listeners: list[Callable[[Routing], None]] = []
        self._refresh_now = threading.Event()
        self.renewals = 0  # admin clients made anew (refreshes kept failing)
        self._announcing = threading.Lock()
        self._me: tuple[str, str] | None = None  # (worker id, url) while announced
        self._announced = 0.0

    @property
    def _admin(self) -> AdminClient:
        if self._admin_client is None:  # made when first used (a worker that never runs makes none)
            self._admin_client = AdminClient({**self._conf, "client.id": "fifolane-query-roster"})
        return self._admin_client

    # -- lifecycle -------------------------------------------------------------------------
    def check_topic(self) -> None:
        """Refuse to start without the members topic, saying what to do."""
        md = self._admin.list_topics(timeout=30)
        topic = md.topics.get(self._members_topic)
        if topic is None or topic.error is not None:
            raise WorkerError(f"the members topic {self._members_topic!r} is missing: the query endpoint "
                              f"publishes the worker's address there; run `fifolane topics create` (or "
                              f"set FIFOLANE_MEMBERS_TOPIC)")

    def announce(self, worker_id: str, url: str | None) -> None:
        """Write (url) or clear (None) this worker's members record, and wait for it. The
        record is written again every :data:`_ANNOUNCE_EVERY_S` while the url stands (a
        members topic deleted and made again gets it back); never after it was cleared."""
        with self._announcing:
            self._me = None if url is None else (worker_id, url)
            self._write(worker_id, url, 30.0)

    def _announce_again(self) -> None:
        with self._announcing:  # a clear (close) waits: nothing is written after it
            if self._me is None or time.monotonic() - self._announced < _ANNOUNCE_EVERY_S:
                return
            try:
                self._write(*self._me, 5.0)
            except KafkaException as exc:
                log.info("members record not written again: %s", exc)

    def _write(self, worker_id: str, url: str | None, wait: float) -> None:
        producer = Producer({**self._conf, "enable.idempotence": True, "acks": "all",
                             "allow.auto.create.topics": False,  # a deleted topic stays deleted
                             "client.id": f"{worker_id}-members"})
        value = None if url is None else member_value(worker_id, self.group_id, self._input, url)
        producer.produce(self._members_topic, value, member_key(self.group_id, worker_id))
        left = producer.flush(wait)
        self._announced = time.monotonic()
        if left:
            log.warning("members record of %s not acknowledged within %.0f s", worker_id, wait)

    def on_change(self, fn: Callable[[Routing], None]) -> None:
        self._listeners.append(fn)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="query-roster", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._refresh_now.set()
        if self._thread is not None:
            self._thread.join(10)
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self._groups.close()  # also while a refresh still waits for it (that one fails)
        if self._thread is None or not self._thread.is_alive():
            self._admin_client = None  # destroyed now, not at the interpreter's exit (fifolane.cli)

    def refresh_soon(self) -> None:
        """Refresh now (a rebalance happened here)."""
        self._refresh_now.set()

    # -- the loop --------------------------------------------------------------------------
    def _run(self) -> None:
        failing_since: float | None = None
        while not self._stop.is_set():
            try:
                self.refresh()
                failing_since = None
            except (KafkaException, OSError, ValueError) as exc:
                log.info("routing not refreshed: %s", exc)
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                elif now - failing_since >= _RENEW_AFTER_S and not self._stop.is_set():
                    self._renew()
                    failing_since = now
            if not self._stop.is_set():
                self._announce_again()
            self._refresh_now.wait(self._interval)
            self._refresh_now.clear()

    def _renew(self) -> None:
        """New admin clients after refreshes that kept failing: librdkafka's (2.16) that lived
        through a broker restart time out for good on group questions, and keep a stale
        leader epoch (``test_query_outage``)."""
        log.warning("routing not refreshed for %.0f s: making new admin clients", _RENEW_AFTER_S)
        old, self._groups = self._groups, GroupAdmin({**self._conf, "client.id": "fifolane-query-roster"})
        self._admin_client = None
        old.close()
        self.renewals += 1

    def refresh(self) -> Routing:
        self._read_members()
        md = self._admin.list_topics(timeout=10)
        inputs = len(md.topics[self._input].partitions) if self._input in md.topics else 0
        dirs = (len(md.topics[self._directory].partitions)
                if self._directory and self._directory in md.topics else 0)
        owners: dict[int, str] = {}
        dir_owners: dict[int, str] = {}
        members: list[str] = []
        desc = self._groups.describe_consumer_groups([self.group_id], request_timeout=10)[self.group_id].result(15)
        for m in desc.members:
            worker = m.client_id.removesuffix(_CONSUMER_SUFFIX)
            tps = m.assignment.topic_partitions if m.assignment is not None else []
            mine = False
            for tp in tps:
                if tp.topic == self._input:
                    owners[tp.partition] = worker
                    mine = True
            if mine or not tps:
                members.append(worker)
        if inputs:  # a directory partition goes with its input partition (services/worker/linked.py)
            dir_owners = {d: owners[d % inputs] for d in range(dirs) if d % inputs in owners}
        routing = Routing(inputs, dirs, owners, dir_owners, dict(self._urls), tuple(sorted(set(members))),
                          self._replicas, time.monotonic())
        self.routing = routing
        for fn in self._listeners:
            fn(routing)
        return routing

    def _read_members(self) -> None:
        if self._reader is None:
            self._reader = Consumer({**self._conf, "group.id": "fifolane-query-members",
                                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                     "client.id": "fifolane-query-members"})
            self._reader.assign([TopicPartition(self._members_topic, 0, 0)])
        for msg in self._reader.consume(10_000, timeout=0.05):
            found = None if msg.error() is not None else read_member(msg.key(), msg.value())
            if found is None or found[0] != self.group_id:
                continue
            _group, worker, body = found
            if body is None:
                self._urls.pop(worker, None)
            elif body.get("input_topic") == self._input:
                self._urls[worker] = body["url"]
