"""The registry folded to its latest records: what readers (the CLI, clients) see.

:class:`RegistryState` never raises for a record's content: a registration that cannot be
parsed is kept as invalid (with its error), a bad progress or status record is ignored with a
warning (docs/formats.md, "Listener registry").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from fifolane.errors import ExpressionError, ListenerError
from listeners.follower import RegistryRecord
from listeners.model import ListenerSpec
from listeners.registry_records import (
    ListenerStatus,
    Progress,
    RegistryRecordError,
    parse_progress_key,
    parse_status_key,
)

__all__ = ["RegistryRecord", "RegistryState"]

log = logging.getLogger(__name__)


@dataclass
class RegistryState:
    """The registry folded to its latest records.

    ``listeners``: valid registrations by name. ``invalid``: registrations that cannot be
    parsed, by name (the error; workers dead-letter them as ``invalid-listener``).
    ``progress``: snapshot progress by (name, partition). ``statuses``: every status record by
    (name, worker); :attr:`status` keeps those of the registered instances.
    """

    listeners: dict[str, ListenerSpec] = field(default_factory=dict)
    progress: dict[tuple[str, int], Progress] = field(default_factory=dict)
    invalid: dict[str, str] = field(default_factory=dict)  # name -> error
    statuses: dict[tuple[str, str], ListenerStatus] = field(default_factory=dict)

    @property
    def status(self) -> dict[str, list[ListenerStatus]]:
        """Status records of the registered listeners, by name (sorted by worker).

        A status written for an earlier registration of the same name (its ``instance`` is
        not the registration's ``created_at``) is stale and left out.
        """
        out: dict[str, list[ListenerStatus]] = {}
        for (name, _worker), st in sorted(self.statuses.items()):
            spec = self.listeners.get(name)
            if spec is not None and st.is_for(spec.created_at):
                out.setdefault(name, []).append(st)
        return out

    def apply(self, rec: RegistryRecord) -> None:
        """Fold one record in (later records win). Never raises for a record's content."""
        sk = parse_status_key(rec.key)
        if sk is not None:
            self.statuses.pop(sk, None)
            if rec.value is not None:
                try:
                    self.statuses[sk] = ListenerStatus.from_json(rec.value)
                except RegistryRecordError as exc:
                    log.warning("ignoring bad status record %r at offset %d: %s", rec.key, rec.offset, exc)
            return
        pk = parse_progress_key(rec.key)
        if pk is not None:
            self.progress.pop(pk, None)  # a bad record supersedes the one before, as compaction will
            if rec.value is not None:
                try:
                    self.progress[pk] = Progress.from_json(rec.value)
                except RegistryRecordError as exc:
                    log.warning("ignoring bad snapshot progress record %r at offset %d: %s",
                                rec.key, rec.offset, exc)  # fmt: skip
            return
        self.listeners.pop(rec.key, None)
        self.invalid.pop(rec.key, None)
        if rec.value is None:
            return
        try:
            spec = ListenerSpec.from_json(rec.value)
        except (ListenerError, ExpressionError) as exc:
            self.invalid[rec.key] = str(exc)
            return
        except Exception as exc:  # a bug in from_json: still an invalid record, not a crash
            log.error("registration %r: unexpected %s", rec.key, type(exc).__name__, exc_info=True)
            self.invalid[rec.key] = f"{type(exc).__name__}: {exc}"
            return
        if spec.name != rec.key:
            self.invalid[rec.key] = (
                f"the registration's name {spec.name!r} differs from its record key {rec.key!r}"
            )
            return
        self.listeners[rec.key] = spec
