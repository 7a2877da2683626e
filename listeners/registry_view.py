"""A worker's view of the listener registry: the registrations, folded from the topic.

Records by key (docs/formats.md, "Listener registry"):

- ``<name>``: a registration (JSON), or a tombstone (removed). A record that does not parse,
  whatever is wrong with it, is an *invalid registration*: never active, dead-lettered once
  (reason ``invalid-listener``) by the housekeeper (:class:`Housekeeper`);
- ``<name>/snapshot/<partition>``: include-current-state progress;
- ``<name>/status/<worker>``: what a worker says of the listener (suspended, failing, or an
  invalid registration it dead-lettered).

Workers never delete registrations: an expired lease makes a listener inactive on every
worker at once, and it stays listed (expired) until it is renewed or removed. (A worker's
tombstone could land after the user registered the same name again, and delete that.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from fifolane.errors import ExpressionError, ListenerError
from listeners.follower import RegistryRecord
from listeners.model import ListenerSpec
from listeners.registry_records import (
    ListenerStatus,
    Progress,
    RegistryRecordError,
    parse_progress_key,
    parse_status_key,
    status_key,
)

__all__ = ["Housekeeper", "RegistryView", "status_record"]

log = logging.getLogger(__name__)

Produce = Callable[..., None]


def status_record(name: str, worker: str, state: str, reason: str, instance: str,
                  errors: int | None = None) -> tuple[bytes, bytes]:
    """Key and value of a ``<name>/status/<worker>`` record (:class:`ListenerStatus`)."""
    status = ListenerStatus(name, worker, state, reason[:2000], instance, datetime.now(UTC), errors)
    return status_key(name, worker).encode(), status.to_json()


@dataclass(frozen=True, slots=True)
class Invalid:
    """A registration record that does not parse, and why."""

    record: RegistryRecord
    error: str


class RegistryView:
    """Registrations and progress as the registry has them (see the module docstring).

    ``progress``: called with each progress record (key, Progress or None for a tombstone).
    """

    def __init__(self, progress: Callable[[tuple[str, int], Progress | None], None]) -> None:
        self._progress = progress
        self.specs: dict[str, ListenerSpec] = {}  # the valid registrations
        self.invalid: dict[str, Invalid] = {}
        #: invalid registrations already dead-lettered: name -> their registry offsets
        self.dead_lettered: dict[str, set[int]] = {}
        #: (name, worker) -> (registration, reason) of the suspensions workers said (status
        #: records): a worker restarted keeps the ones it made (listeners.suspensions)
        self.suspended: dict[tuple[str, str], tuple[str, str]] = {}

    def apply(self, records: Iterable[RegistryRecord]) -> list[str]:
        """Fold records in (later win); the names whose registration changed, in order."""
        latest: dict[str, RegistryRecord] = {}
        for rec in records:
            pk = parse_progress_key(rec.key)
            if pk is not None:
                self._progress(pk, _progress(rec))
                continue
            sk = parse_status_key(rec.key)
            if sk is not None:
                self._status(sk, rec)
                continue
            latest.pop(rec.key, None)  # keep registry order of the last records
            latest[rec.key] = rec
        for name, rec in latest.items():
            self.specs.pop(name, None)
            self.invalid.pop(name, None)
            if rec.value is None:
                continue
            try:
                spec = ListenerSpec.from_json(rec.value)
                if spec.name != name:
                    raise ListenerError(f"the registration's name {spec.name!r} differs from its "
                                        f"record key {name!r}")
            except (ListenerError, ExpressionError) as exc:
                self.invalid[name] = Invalid(rec, str(exc))
                log.warning("invalid listener registration %r: %s", name, exc)
            else:
                self.specs[name] = spec
        return list(latest)

    def _status(self, key: tuple[str, str], rec: RegistryRecord) -> None:
        name = key[0]
        self.suspended.pop(key, None)
        if rec.value is None:
            return
        try:
            status = ListenerStatus.from_json(rec.value)
        except RegistryRecordError as exc:
            log.warning("ignoring a malformed status record %r: %s", rec.key, exc)
            return
        if status.state == "suspended":
            self.suspended[key] = (status.instance, status.reason)
        marker = status.instance
        if status.state == "invalid" and marker.startswith("offset:") and marker[7:].isdigit():
            self.dead_lettered.setdefault(name, set()).add(int(marker[7:]))


def _progress(rec: RegistryRecord) -> Progress | None:
    if rec.value is None:
        return None
    try:
        return Progress.from_json(rec.value)
    except RegistryRecordError as exc:
        log.warning("ignoring bad progress record %r: %s", rec.key, exc)
        return None


class Housekeeper:
    """The duties of the worker that owns input partition 0: dead-letter each invalid
    registration once (reason ``invalid-listener``), noting it in a status record in the same
    transaction so that no later housekeeper repeats it. Registrations are never deleted."""

    def __init__(self, registry_topic: str, dlq_topic: str, worker_id: str,
                 dead_letter: Callable[[RegistryRecord, str], None], produce: Produce) -> None:
        self._registry = registry_topic
        self._dlq = dlq_topic
        self._worker = worker_id
        self._dead_letter = dead_letter
        self._produce = produce
        self._sent: dict[str, int] = {}  # in the open transaction: name -> offset
        self.dead_lettered = 0

    def run(self, view: RegistryView) -> None:
        for name, bad in view.invalid.items():
            offset = bad.record.offset
            if offset in view.dead_lettered.get(name, ()) or self._sent.get(name) == offset:
                continue
            self._dead_letter(bad.record, bad.error)
            key, value = status_record(name, self._worker, "invalid", bad.error, f"offset:{offset}")
            self._produce(self._registry, value, key, 0)
            self._sent[name] = offset
            self.dead_lettered += 1

    def commit(self, view: RegistryView) -> None:
        for name, offset in self._sent.items():
            view.dead_lettered.setdefault(name, set()).add(offset)
        self._sent.clear()

    def rollback(self) -> None:
        self._sent.clear()
