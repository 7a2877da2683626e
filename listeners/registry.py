"""The listener registry: a compacted, single-partition Kafka topic (docs/formats.md).

Records, by key:

- ``<name>``: a registration, value = :meth:`ListenerSpec.to_json`; a tombstone removes it.
- ``<name>/snapshot/<partition>``: include-current-state progress of one source partition
  (:class:`Progress`), written by the partition's owner *in the same Kafka transaction* as the
  snapshot notifications it covers, so a new owner resumes exactly where the committed
  notifications end.
- ``<name>/status/<worker>``: what a worker did with the listener (:class:`ListenerStatus`,
  e.g. suspended it, with the reason); a tombstone clears it.

Names cannot contain ``/``, so the kinds of keys never clash (:mod:`listeners.registry_records`).
Any record may come from another client or be written by hand: a registration that cannot be
parsed is kept as *invalid* (shown, removable), a bad progress or status record is ignored with
a warning. Reading the registry never raises for a record's content.

Clients (the CLI, the demo, :class:`listeners.client.ListenerClient`) use :func:`register`,
:func:`remove`, :func:`renew`, :func:`list_listeners`, :func:`get_listener`. Workers follow the
topic with :class:`RegistryFollower`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from fifolane.config import Settings
from fifolane.errors import ListenerError
from fifolane.produce import DEFAULT_DELIVERY_TIMEOUT_S
from fifolane.topics import create_topic
from listeners.model import ListenerSpec
from listeners.registry_records import (
    ListenerStatus,
    Progress,
    RegistryRecordError,
    parse_progress_key,
    parse_status_key,
    progress_key,
    status_key,
)
from listeners.registry_state import RegistryRecord, RegistryState

__all__ = [
    "ListenerStatus",
    "Progress",
    "RegistryFollower",
    "RegistryRecord",
    "RegistryRecordError",
    "RegistryState",
    "ensure_output_topic",
    "ensure_registry_topic",
    "get_listener",
    "list_listeners",
    "parse_progress_key",
    "parse_status_key",
    "progress_key",
    "read_registry",
    "register",
    "remove",
    "renew",
    "same_definition",
    "status_key",
]

log = logging.getLogger(__name__)

#: Fields that define what a listener delivers (not its lease bookkeeping).
_DEFINITION = ("filter", "convert", "kinds", "include_current_state", "output_topic", "type",
               "lease")  # fmt: skip


def same_definition(a: ListenerSpec, b: ListenerSpec) -> bool:
    """True if both registrations deliver the same notifications (leases aside)."""
    return all(getattr(a, f) == getattr(b, f) for f in _DEFINITION)


# -- topics --------------------------------------------------------------------------------
def ensure_registry_topic(settings: Settings) -> None:
    """Create the registry topic (compacted, 1 partition) if it is missing."""
    create_topic(settings, settings.registry_topic, 1, {"cleanup.policy": "compact"})


def _partitions_of(settings: Settings, topic: str, timeout: float = 10.0) -> int | None:
    c = Consumer(settings.kafka_config(**{"group.id": f"fifolane-meta-{uuid.uuid4().hex}"}))
    try:
        md = c.list_topics(topic, timeout=timeout).topics.get(topic)
        if md is None or md.error is not None:
            return None
        return len(md.partitions)
    finally:
        c.close()


def ensure_output_topic(settings: Settings, topic: str) -> int:
    """Create a listener output topic if missing, with the input topic's partition count
    (notifications of source partition p go to output partition p); return its count."""
    existing = _partitions_of(settings, topic)
    if existing is not None:
        return existing
    n = _partitions_of(settings, settings.input_topic) or settings.partitions
    create_topic(settings, topic, n, {"cleanup.policy": "delete"})
    return n


# -- reading -------------------------------------------------------------------------------
def _registry_consumer(settings: Settings) -> Consumer:
    return Consumer(settings.kafka_config(**{
        "group.id": f"fifolane-registry-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": 100,
    }))  # fmt: skip


def read_registry(settings: Settings, timeout: float = 30.0) -> RegistryState:
    """Read the whole registry (committed records) and fold it."""
    state = RegistryState()
    topic = settings.registry_topic
    consumer = _registry_consumer(settings)
    try:
        md = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if md is None or md.error is not None:
            return state
        tp = TopicPartition(topic, 0)
        _lo, high = consumer.get_watermark_offsets(tp, timeout=timeout)
        if high <= 0:
            return state
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                raise ListenerError(f"reading the registry {topic!r} timed out after {timeout}s")
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if (msg.offset() or 0) >= high:
                        return state
                    continue
                raise ListenerError(f"reading the registry {topic!r}: {err}")
            key = (msg.key() or b"").decode("utf-8", "replace")
            state.apply(RegistryRecord(key, msg.value(), msg.offset() or 0))
            if (msg.offset() or 0) + 1 >= high:
                return state
    finally:
        consumer.close()


def list_listeners(settings: Settings) -> list[ListenerSpec]:
    """Every registered listener, by name."""
    listeners = read_registry(settings).listeners
    return [listeners[n] for n in sorted(listeners)]


def get_listener(settings: Settings, name: str) -> ListenerSpec:
    """One registration; :class:`ListenerError` if there is no valid one with that name."""
    state = read_registry(settings)
    spec = state.listeners.get(name)
    if spec is None:
        if name in state.invalid:
            raise ListenerError(
                f"listener {name!r} is registered but invalid: {state.invalid[name]}; "
                f"remove it with `fifolane listeners remove {name}` and register it again"
            )
        raise ListenerError(f"unknown listener {name!r}: see `fifolane listeners list`")
    return spec


# -- writing -------------------------------------------------------------------------------
def _write(settings: Settings, key: str, value: bytes | None) -> None:
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    # Retried as long as `fifolane produce` does (longer than a leader election), and waited for.
    timeout_s = DEFAULT_DELIVERY_TIMEOUT_S
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all",
                                                 "delivery.timeout.ms": int(timeout_s * 1000)}))  # fmt: skip
    producer.produce(settings.registry_topic, value, key.encode(), on_delivery=on_delivery)
    left = producer.flush(timeout_s + 10)
    if left or errors:
        raise ListenerError(
            f"writing {key!r} to the registry {settings.registry_topic!r} failed: "
            f"{errors[0] if errors else f'not delivered within {timeout_s + 10:.0f}s'}; check the "
            f"cluster (`fifolane kafka status`) and try again"
        )


def register(settings: Settings, spec: ListenerSpec, replace: bool = False) -> ListenerSpec:
    """Register ``spec``; return what is registered.

    Registering the same definition again is a no-op (returns the existing registration). A
    different definition under an existing name is refused unless ``replace``; a replaced
    listener is a new instance (a new include-current-state snapshot, sequence numbers go on).
    The output topic is created if missing.
    """
    ensure_registry_topic(settings)
    existing = read_registry(settings).listeners.get(spec.name)
    if existing is not None and same_definition(existing, spec):
        return existing
    if existing is not None and not replace:
        raise ListenerError(
            f"listener {spec.name!r} already exists with another definition "
            f"(filter {existing.filter!r}); use --replace (replace=True) to change it"
        )
    ensure_output_topic(settings, spec.topic(settings))
    _write(settings, spec.name, spec.to_json())
    return spec


def renew(settings: Settings, spec: ListenerSpec) -> ListenerSpec:
    """Restart the lease of ``spec`` (re-writes the registration with a new ``renewed_at``)."""
    renewed = spec.renewed()
    _write(settings, spec.name, renewed.to_json())
    return renewed


def remove(settings: Settings, name: str) -> bool:
    """Remove a listener (tombstone); False if it was not registered."""
    state = read_registry(settings)
    if name not in state.listeners and name not in state.invalid:
        return False
    _write(settings, name, None)
    return True


# -- following (workers) -------------------------------------------------------------------
class RegistryFollower:
    """Follows the registry from its beginning on a background thread.

    The worker's poll thread takes the records with :meth:`drain` (in ``after_commit``) and
    waits with :meth:`sync` until everything committed before the call has been read (on
    partition assignment, so a worker never processes events with an outdated registry).
    """

    def __init__(self, settings: Settings, poll_timeout: float = 0.1) -> None:
        self.settings = settings
        self.poll_timeout = poll_timeout
        self._queue: queue.SimpleQueue[RegistryRecord] = queue.SimpleQueue()
        self._position = 0
        self._target: int | None = None
        self._want_target = threading.Event()
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._consumer: Consumer | None = None
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        ensure_registry_topic(self.settings)
        self._consumer = _registry_consumer(self.settings)
        self._consumer.assign([TopicPartition(self.settings.registry_topic, 0, OFFSET_BEGINNING)])
        self._thread = threading.Thread(target=self._run, name="registry-follower", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        tp = TopicPartition(self.settings.registry_topic, 0)
        try:
            while not self._stop.is_set():
                if self._want_target.is_set():
                    # librdkafka calls on one consumer are not made from two threads here.
                    _lo, high = consumer.get_watermark_offsets(tp, timeout=10)
                    self._want_target.clear()
                    with self._cond:
                        self._target = high
                        self._cond.notify_all()
                msgs = consumer.consume(500, timeout=self.poll_timeout)
                pos = self._position
                for msg in msgs:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            pos = max(pos, msg.offset() or 0)
                        else:
                            log.warning("registry follower: %s", err)
                        continue
                    key = (msg.key() or b"").decode("utf-8", "replace")
                    self._queue.put(RegistryRecord(key, msg.value(), msg.offset() or 0))
                    pos = max(pos, (msg.offset() or 0) + 1)
                if pos != self._position:
                    with self._cond:
                        self._position = pos
                        self._cond.notify_all()
        except BaseException as exc:  # surfaced by sync()
            self.error = exc
            log.exception("registry follower stopped")
        finally:
            consumer.close()

    def drain(self) -> list[RegistryRecord]:
        """The records read since the last call, in registry order."""
        out = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def sync(self, timeout: float = 30.0) -> bool:
        """Wait until every record before the registry's current end has been read.

        Records of transactions still open at the call are waited for too (a new partition
        owner then sees the previous owner's last snapshot progress). False on timeout.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            self._target = None
            self._want_target.set()
            while self._target is None or self._position < self._target:
                if self.error is not None or self._thread is None or not self._thread.is_alive():
                    return False
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("registry not caught up after %.0fs (at %d of %s)", timeout,
                                self._position, self._target)  # fmt: skip
                    return False
                self._cond.wait(min(left, 0.5))
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
