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
topic with :class:`listeners.follower.RegistryFollower`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from fifolane.access import KafkaAccess, principal_of
from fifolane.config import Settings
from fifolane.errors import ListenerError
from fifolane.produce import DEFAULT_DELIVERY_TIMEOUT_S
from fifolane.serde.catalog import SchemaCatalog
from fifolane.topics import create_topic
from listeners.follower import registry_consumer
from listeners.model import ListenerSpec
from listeners.outputs import check_output_topic, check_registry_access
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
from listeners.validate import check_registration, load_catalog

__all__ = [
    "ListenerStatus",
    "Progress",
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
    """Create the registry topic (compacted, 1 partition) if it is missing.

    Asked first, so that principals without CREATE (workers, listener admins on a secured
    cluster: docs/security.md) pass when it exists: Kafka refuses a create without CREATE
    even for a topic that is there.
    """
    if _partitions_of(settings, settings.registry_topic) is None:
        create_topic(settings, settings.registry_topic, 1, {"cleanup.policy": "compact"})


def _partitions_of(settings: Settings, topic: str, timeout: float = 10.0) -> int | None:
    """The partition count of ``topic``; None if it is missing or not visible to us.

    Looked up in the listing of all topics: a metadata request naming one topic makes a broker
    with ``auto.create.topics.enable`` (the local dev cluster) create it, with the broker's
    defaults (1 partition, cleanup.policy=delete), before we create it with ours. A full
    listing is heavier on a cluster of many topics; this runs rarely: at registration, when a
    worker starts following the registry, and once per output topic a worker activates.
    """
    md = AdminClient(settings.kafka_config()).list_topics(timeout=timeout).topics.get(topic)
    if md is None or md.error is not None:
        return None
    return len(md.partitions)


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


def read_registry(settings: Settings, timeout: float = 30.0) -> RegistryState:
    """Read the whole registry (committed records) and fold it."""
    return _read_registry(settings, timeout)[0]


def _read_registry(settings: Settings, timeout: float = 30.0) -> tuple[RegistryState, int]:
    """The registry folded, and the offset it was read to (the log end when asked)."""
    KafkaAccess(settings.kafka_config()).login()  # a wrong password: said at once, not a time-out
    state = RegistryState()
    topic = settings.registry_topic
    consumer = registry_consumer(settings)
    try:
        md = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if md is not None and md.error is not None and md.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            who = principal_of(settings.kafka_config()) or "this client"
            raise ListenerError(f"{who} may not read listener registrations: it lacks READ on the registry "
                                f"topic {topic!r} (docs/security.md)")
        if md is None or md.error is not None:
            return state, 0
        high = _log_end(settings, TopicPartition(topic, 0), timeout)

        def fold(msg: Any) -> None:
            key = (msg.key() or b"").decode("utf-8", "replace")
            state.apply(RegistryRecord(key, msg.value(), msg.offset() or 0))
        _scan(consumer, topic, OFFSET_BEGINNING, high, timeout, fold)
        return state, high
    finally:
        consumer.close()


def _scan(consumer: Consumer, topic: str, start: int, high: int, timeout: float, each: Any) -> None:
    """Hand ``each`` every committed record of the registry from ``start`` up to ``high``."""
    if high <= 0 or (start >= 0 and start >= high):
        return
    consumer.assign([TopicPartition(topic, 0, start)])
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
                    return
                continue
            raise ListenerError(f"reading the registry {topic!r}: {err}")
        if (msg.offset() or 0) >= high:
            return
        each(msg)
        if (msg.offset() or 0) + 1 >= high:
            return


_NOTHING = object()


def _written_meanwhile(settings: Settings, name: str, start: int, stop: int, timeout: float = 30.0) -> Any:
    """The last value written under ``name`` at offsets ``start`` up to ``stop`` (the registry
    as read before a write, and that write's offset): another client's write made in
    between, which ours would overwrite; :data:`_NOTHING` if there was none."""
    found: list[bytes | None] = []
    consumer = registry_consumer(settings)
    try:
        _scan(consumer, settings.registry_topic, start, stop, timeout,
              lambda msg: found.append(msg.value()) if msg.key() == name.encode() else None)
    finally:
        consumer.close()
    return found[-1] if found else _NOTHING


def _spec_or_none(value: bytes | None) -> ListenerSpec | None:
    try:
        return None if value is None else ListenerSpec.from_json(value)
    except Exception:  # noqa: BLE001 - a record that is not a registration
        return None


def _log_end(settings: Settings, tp: TopicPartition, timeout: float) -> int:
    """The partition's log end. Not a read_committed consumer's end: that is the last stable
    offset, which stops before a worker's open transaction (snapshot progress, status
    records) and so misses every registration written after it; reading on until the log
    end waits for such a transaction to be decided (a checkpoint, at most its time-out)."""
    probe = Consumer(settings.kafka_config(**{"group.id": f"fifolane-registry-{uuid.uuid4().hex}",
                                              "isolation.level": "read_uncommitted"}))
    try:
        return int(probe.get_watermark_offsets(tp, timeout=timeout)[1])
    finally:
        probe.close()


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
def _write(settings: Settings, key: str, value: bytes | None) -> int:
    """Write one registry record; its offset."""
    errors: list[str] = []

    offsets: list[int] = []

    def on_delivery(err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            offsets.append(msg.offset())

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
    return offsets[0]


def register(settings: Settings, spec: ListenerSpec, replace: bool = False, *,
             catalog: SchemaCatalog | None = None) -> ListenerSpec:
    """Register ``spec``; return what is registered (with the registering ``principal``).

    First, before the cluster is asked anything, a listener that can never work is refused
    (:func:`listeners.validate.check_registration`, against ``catalog``, by default the
    entity schemas of ``settings.schemas_dir``): an unknown ``type`` (ListenerError), a
    filter or converter reading fields the type does not have or with static type errors
    (ExpressionError, with the position).

    Registering the same definition again is a no-op (returns the existing registration),
    unless a worker suspended it: then it is registered anew, which lifts the suspension; or
    unless its lease ran out: then its lease is renewed (a new ``renewed_at``). A
    different definition under an existing name is refused unless ``replace``; a replaced
    listener is a new instance (a new include-current-state snapshot, sequence numbers go on).
    The output topic is checked (:func:`listeners.outputs.check_output_topic`: not a role
    topic, not used for something else, writable by the registering principal) and created
    if missing. A wrong password or a missing permission is a clear error, raised before
    anything is written (``ConfigError``, ``ListenerError``).
    """
    if spec.type is not None and catalog is None:
        catalog = load_catalog(settings)
    check_registration(spec, catalog)
    access = KafkaAccess(settings.kafka_config())
    check_registry_access(settings, access)
    ensure_registry_topic(settings)
    state, end = _read_registry(settings)
    existing = state.listeners.get(spec.name)
    same = existing is not None and same_definition(existing, spec)
    if existing is not None and same:
        if not any(st.state == "suspended" for st in state.status.get(spec.name, ())):
            if not existing.is_expired():
                return existing
            renewed = existing.renewed()  # its lease ran out: the same definition renews it
            _write(settings, spec.name, renewed.to_json())
            return renewed
        if spec.created_at <= existing.created_at:  # suspended on a worker: a new instance lifts it
            spec = dataclasses.replace(spec, created_at=datetime.now(UTC), renewed_at=None)
    elif existing is not None and not replace:
        raise ListenerError(
            f"listener {spec.name!r} already exists with another definition "
            f"(filter {existing.filter!r}); use --replace (replace=True) to change it"
        )
    topic = spec.topic(settings)
    check_output_topic(settings, access, topic, {s.topic(settings) for s in state.listeners.values()})
    ensure_output_topic(settings, topic)
    spec = dataclasses.replace(spec, principal=access.principal)
    at = _write(settings, spec.name, spec.to_json())
    other = _written_meanwhile(settings, spec.name, end, at)
    if other is not _NOTHING:  # two adds (or an add and a remove) of one name at once: the first stands
        _write(settings, spec.name, other)
        theirs = _spec_or_none(other)
        if theirs is not None and same_definition(theirs, spec):
            return theirs
        what = "removed it" if other is None else f"registered it (filter {theirs.filter!r})" if theirs else "wrote it"
        raise ListenerError(f"listener {spec.name!r} was changed at the same time: another client {what} "
                            f"first, and that stands. Check `fifolane listeners describe {spec.name}` and add it "
                            "again if needed")
    return spec


def renew(settings: Settings, spec: ListenerSpec) -> ListenerSpec | None:
    """Restart the lease of ``spec`` (re-writes the registration with a new ``renewed_at``).

    None, and nothing written, when ``spec`` is no longer the registration of its name: it
    was removed, or replaced (another ``created_at`` or definition). A renewal written then
    would bring the old registration back."""
    state, end = _read_registry(settings)
    current = state.listeners.get(spec.name)
    if current is None or current.created_at != spec.created_at or not same_definition(current, spec):
        return None
    renewed = current.renewed()
    at = _write(settings, spec.name, renewed.to_json())
    other = _written_meanwhile(settings, spec.name, end, at)
    if other is not _NOTHING:
        theirs = _spec_or_none(other)
        if theirs is None or theirs.created_at != spec.created_at or not same_definition(theirs, spec):
            _write(settings, spec.name, other)  # removed or replaced meanwhile: that stands
            return None
    return renewed


def remove(settings: Settings, name: str) -> bool:
    """Remove a listener (tombstone); False if it was not registered."""
    check_registry_access(settings, KafkaAccess(settings.kafka_config()))
    state = read_registry(settings)
    if name not in state.listeners and name not in state.invalid:
        return False
    _write(settings, name, None)
    return True
