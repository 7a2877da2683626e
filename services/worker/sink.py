"""The seam between the worker and what observes its table: :class:`ChangeSink`.

A change sink (the cluster listeners' :class:`listeners.runtime.ListenerRuntime` is one) is
told of every applied table write of the partitions the worker owns, and of the checkpoint's
safe points. It sees the worker only through a :class:`SinkContext`: produce a record in the
current transaction, read the committed rows of an owned partition, decode an entity value.

Calls come from the worker's poll thread, in this order for a partition: ``on_assign`` (after
its store is restored; the partition is processed once ``ready()`` says so), ``on_change`` for
each write, ``after_commit``/``after_abort`` at every checkpoint, ``on_release`` when it goes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from typing import Any, Protocol

from fifolane.errors import KafkaClientError
from fifolane.serde import SchemaCatalog
from fifolane.serde.entity import EntityType
from services.worker.checkpoint import Checkpoint
from services.worker.limits import Limits
from services.worker.state import Row, StoreManager

__all__ = ["ChangeSink", "Context", "Produce", "Row", "SinkContext"]


class SinkContext(Protocol):
    """What a change sink may do with the worker."""

    @property
    def worker_id(self) -> str: ...

    def produce(self, topic: str, value: bytes | str | None, key: bytes | str | None,
                partition: int = -1, headers: list[tuple[str, bytes]] | None = None) -> None:
        """Send a record in the open transaction: it commits with the state changes and input
        offsets of the same checkpoint (or not at all)."""

    def committed_rows(self, partition: int, after: bytes | None = None) -> Iterator[tuple[bytes, Row]]:
        """The committed live entities of an owned partition, in key order, after ``after``."""

    def decode(self, value: bytes) -> dict[str, Any]:
        """The record of an encoded entity value."""

    def entity_type(self, name: str) -> EntityType | None:
        """The declared entity type of that name (None if unknown)."""

    def room(self, topic: str) -> int:
        """The largest record (key + value + headers) ``topic`` takes, in bytes."""

    def dead_letter(self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]],
                    topic: str, partition: int, offset: int, reason: str, error: str) -> None:
        """Send a record to the dead-letter topic (in the open transaction), with the reason
        and origin in headers (docs/formats.md), cut to fit if it is too large."""

    def refresh_topic(self, topic: str) -> None:
        """Make the worker's producer read ``topic``'s metadata again (a topic created again
        after the producer saw it deleted)."""

    def answer_refusals(self, answer: Callable[[str | None, KafkaClientError], bool]) -> None:
        """When Kafka refuses a produced record for good (its topic deleted, not writable),
        ``answer(topic, error)`` is asked first (``topic`` None: records timed out, maybe to a
        deleted topic); True: the sink stopped producing there, and the transaction is
        replayed as it was instead of bisecting the input for the record to blame
        (services.worker.bisect)."""


class ChangeSink(Protocol):
    """Observes the table changes of a worker (see the module docstring)."""

    def open(self, ctx: SinkContext) -> None:
        """Bind to the worker (before any partition is assigned)."""

    def on_assign(self, partitions: list[int]) -> None:
        """Partitions restored and about to be processed."""

    def ready(self) -> bool:
        """Whether the partitions assigned so far may be processed now (False: ask again)."""

    def on_release(self, partitions: list[int]) -> None:
        """Partitions no longer owned (after their last commit, or lost)."""

    def needs_records(self, types: Collection[str]) -> bool:
        """Whether a change of these entity types needs its decoded record now (the worker
        then decodes up front instead of reading only key, group and version)."""

    def on_change(self, partition: int, offset: int | None, timestamp: int, ekey: bytes,
                  old: Row | None, new: Row, record: dict[str, Any] | None,
                  moved_to: str | None = None) -> None:
        """One applied write of ``ekey`` (``<type>/<key>``): ``old`` is the previous row (None
        if the entity was unknown), ``new`` the row written (deleted for a delete).
        ``record`` is the decoded new value if the worker has it. ``moved_to``: the write
        removes the entity from this partition because it moved to that group."""

    def after_commit(self) -> None:
        """A safe point: the transaction committed; nothing is in flight or staged."""

    def after_abort(self) -> None:
        """The transaction aborted: everything produced since the last commit is gone."""

    def close(self) -> None:
        """The worker stops."""

    def metrics(self) -> dict[str, float]:
        """The sink's own gauges and counters, exported with the worker's metrics."""


class Produce(Protocol):
    """Send a record in the open transaction (:meth:`Checkpoint.produce`)."""

    def __call__(self, topic: str, value: bytes | str | None, key: bytes | str | None,
                 partition: int = -1, headers: Any = None) -> None: ...


class Context:
    """The worker's :class:`SinkContext`: its transaction, committed rows, codec and limits."""

    def __init__(self, ckpt: Checkpoint, stores: StoreManager, codec: Any, catalog: SchemaCatalog,
                 limits: Limits, dead_letter: Callable[..., None], worker_id: str) -> None:
        self._ckpt = ckpt
        #: Send a record in the open transaction: it commits with the state changes and input
        #: offsets of the same checkpoint (or not at all). The checkpoint's own method, bound
        #: once: notifications go through here one by one.
        self.produce: Produce = ckpt.produce
        self._stores = stores
        self._decode = codec.decoder()
        self._catalog = catalog
        self._limits = limits
        self._dead_letter = dead_letter
        self.worker_id = worker_id

    def committed_rows(self, partition: int, after: bytes | None = None) -> Iterator[tuple[bytes, Row]]:
        store = self._stores.stores.get(partition)
        return iter(()) if store is None else store.iter_committed(after)

    def decode(self, value: bytes) -> dict[str, Any]:
        record: dict[str, Any] = self._decode(value).record
        return record

    def entity_type(self, name: str) -> EntityType | None:
        return self._catalog.types.get(name)

    def room(self, topic: str) -> int:
        return self._limits.room(topic)

    def dead_letter(self, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]],
                    topic: str, partition: int, offset: int, reason: str, error: str) -> None:
        self._dead_letter(key, value, headers, topic, partition, offset, reason, error)

    def refresh_topic(self, topic: str) -> None:
        self._ckpt.producer.refresh(topic)

    def answer_refusals(self, answer: Callable[[str | None, KafkaClientError], bool]) -> None:
        self._ckpt.bisection.answer = answer
