"""The query service of one worker: what the worker wires (a few lines in runtime.py).

- ``attach(worker)`` (``--query-port`` given) makes the parts: owner views
  (services/worker/query/views.py), their positions (positions.py), the roster
  (members.py), the standbys (standby.py) and the HTTP server (server.py);
  without ``--query-port`` it returns a :class:`NoQuery` with the same wiring doing nothing;
- the worker adds :meth:`QueryService.staged` to its checkpoint's staged parts, takes its
  partition hooks from :meth:`QueryService.start` (once its clients exist), calls
  :meth:`QueryService.committing` before each commit and :meth:`QueryService.close` when
  it leaves;
- a store's ``before_close`` withdraws its view (and waits for reads in flight) before
  RocksDB closes it.
"""

from __future__ import annotations

import logging
import socket
import ssl
from pathlib import Path
from typing import Any

from fifolane.errors import ConfigError
from services.worker.query.answers import Answers
from services.worker.query.members import MemberInfo, Roster, Routing
from services.worker.query.positions import CommitTracker, Resolver
from services.worker.query.readers import MirroredViews, Readers
from services.worker.query.server import QueryServer
from services.worker.query.views import View, Views, view_of

__all__ = ["NoQuery", "QueryService", "attach"]

log = logging.getLogger(__name__)


def attach(worker: Any) -> QueryService | NoQuery:
    """The worker's query service (a :class:`NoQuery` without ``--query-port``)."""
    return NoQuery() if worker.opts.query_port is None else QueryService(worker)


class NoQuery:
    """A worker without a query endpoint: the same wiring, doing nothing."""

    def staged(self) -> list[Any]:
        return []

    def start(self, parts: Any) -> Any:
        return parts

    def committing(self) -> None:
        """Nothing to track."""

    def close(self) -> None:
        """Nothing to stop."""


class _Hooks:
    """PartitionParts with the query service's hooks (see :meth:`QueryService.start`);
    everything else is the parts' own."""

    def __init__(self, service: QueryService, parts: Any) -> None:
        self._q = service
        self._parts = parts

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parts, name)

    def restore(self, topic: str, p: int) -> Any:
        q = self._q
        if topic == q._input:
            if q.standbys is not None:
                q.standbys.release(p)  # before the restore opens the store (RocksDB: one instance)
            # A partition restored again (its store fell behind another owner's commits) has
            # a view from before: withdrawn, so neither the readers nor the worker answer from
            # it until the partition is active again.
            q._closing(p)
        return self._parts.restore(topic, p)

    def make_table(self, p: int) -> Any:
        store = self._q._worker.stores.stores[p]
        self._q.views.publish(p, view_of(store, store.changelog_offset))
        return self._parts.make_table(p)

    def make_directory(self, p: int) -> Any:
        db = self._q._worker._dir_stores.stores[p].db  # committed state only: RocksDB has no other
        self._q.directory_views.publish(p, View(db, 0, db=db))
        return self._parts.make_directory(p)

    def released(self, topic: str, partitions: list[int]) -> None:
        q = self._q
        if q.standbys is not None and topic == q._input:
            q.standbys.released(partitions)
        self._parts.released(topic, partitions)


def _schemas_dir(worker: Any) -> Path:
    """Where the worker's catalog was loaded from (a reader loads it again)."""
    dirs = {t.source.parent for t in worker.catalog if getattr(t, "source", None) is not None}
    return dirs.pop() if len(dirs) == 1 else Path(worker.settings.schemas_dir)


def _tls(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("the query endpoint's TLS needs both --query-tls-cert and --query-tls-key")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the query endpoint's certificate {cert} / key {key}: {exc}") from exc
    return ctx


def _token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read the query token file {path}: {exc}") from exc
    if not token:
        raise ConfigError(f"the query token file {path} is empty: put the bearer token in it")
    return token


class QueryService:
    """See the module docstring; also the :class:`services.worker.query.answers.Local` of
    the answers."""

    def __init__(self, worker: Any) -> None:
        o, s = worker.opts, worker.settings
        self._worker = worker
        self._input = worker.topics.input
        self._codec = worker.codec
        self._types = sorted(t.name for t in worker.catalog)
        self.readers: Readers | None = None
        if o.query_readers > 0:
            self.readers = Readers(
                o.query_readers, host=o.query_host, port=o.query_port or 0,
                work_dir=worker.stores.root.with_name(worker.stores.root.name + ".readers"),
                schemas_dir=_schemas_dir(worker), registry_url=s.schema_registry_url,
                group_index=worker.stores.group_index, directory=worker.topics.directory is not None,
                tls=(o.query_tls_cert, o.query_tls_key) if o.query_tls_cert and o.query_tls_key else None,
                token_file=o.query_token_file)
            root = worker.stores.root
            self.views: Views = MirroredViews(self.readers, lambda p: root / f"p{p}")
        else:
            self.views = Views()
        self.standby_views = Views()
        self.directory_views = Views()
        self.directory = worker.topics.directory is not None
        self.group_index = worker.stores.group_index
        self._tls = _tls(o.query_tls_cert, o.query_tls_key)
        self._token = _token(o.query_token_file)
        conf = s.kafka_config()
        self.resolver = Resolver(conf, s.state_topic, self.views, transactional=worker.eos)
        self.tracker = CommitTracker(worker.stores, self.resolver, self.active, transactional=worker.eos)
        self.roster = Roster(conf, group_id=worker.group_id, input_topic=self._input,
                             directory_topic=worker.topics.directory, members_topic=s.members_topic,
                             standby_replicas=o.standby_replicas)
        self.standbys: Any = None
        if o.standby_replicas > 0:
            from services.worker.query.standby import Standbys

            self.standbys = Standbys(conf, worker_id=o.worker_id, state_topic=s.state_topic,
                                     state_dir=worker.stores.root.parent, store_name=worker.stores.root.name,
                                     group_index=worker.stores.group_index,
                                     read_value=worker.stores.read_value, read_state=worker._read_state,
                                     views=self.standby_views,
                                     tombstone_retention_ms=lambda: worker._retention_ms,
                                     topic_id=worker.clients.topic_id)
            self.roster.on_change(self.standbys.place)
        worker.stores.before_close = self._closing
        if worker._dir_stores is not None:
            worker._dir_stores.before_close = self.directory_views.withdraw
        # With readers, they serve the public port and the worker's own endpoint is their
        # upstream on loopback (services/worker/query/reader.py).
        private = self.readers is not None
        self.server = QueryServer(Answers(self), self._routing_json, self._partitions_json,
                                  host="127.0.0.1" if private else o.query_host,
                                  port=0 if private else o.query_port,
                                  tls=None if private else self._tls, token=self._token)
        self.me = MemberInfo(o.worker_id, None)
        self._advertise = o.query_advertise

    # -- wiring ------------------------------------------------------------------------------
    def staged(self) -> list[Any]:
        """The checkpoint's staged parts to add (after the stores)."""
        return [self.tracker]

    def start(self, parts: Any) -> Any:
        """Serve, publish the address, follow the group (the worker's clients exist now);
        returns ``parts`` (services.worker.partitions.PartitionParts) with the hooks of a
        partition's life: a standby of an assigned partition stops before its restore opens
        the store, and a partition's first view is published when it becomes active."""
        self.roster.check_topic()
        port = self.server.start()
        if self.readers is not None:
            upstream = f"http://127.0.0.1:{port}"
            port = self.readers.start()
        url = self._url(port)
        self.me = MemberInfo(self._worker.opts.worker_id, url)
        if self.readers is not None:
            readers = self.readers
            readers.hello(self.me.worker, url, upstream)
            self.roster.on_change(lambda r: readers.routing(r.input_partitions, r.directory_partitions))

            def moved(new_port: int) -> None:  # a restarted reader did not get the old port
                self.me = MemberInfo(self.me.worker, self._url(new_port))
                readers.hello(self.me.worker, self.me.url or "", upstream)
                self.roster.announce(self.me.worker, self.me.url)
            readers.on_port = moved
        self.resolver.start()
        self.roster.announce(self.me.worker, url)
        self.roster.start()
        if self.standbys is not None:
            self.standbys.start()
        log.info("query endpoint on %s", url)
        return _Hooks(self, parts)

    def _url(self, port: int) -> str:
        host = self._advertise or self._worker.opts.query_host
        if host in ("0.0.0.0", "::", ""):
            host = socket.getfqdn()
        return f"{'https' if self._tls else 'http'}://{host}:{port}"

    def committing(self) -> None:
        self.resolver.committing()

    def _closing(self, p: int) -> None:
        self.resolver.drop(p)
        self.views.withdraw(p)

    def close(self) -> None:
        """Stop serving and clear the address (a clean leave: clients stop asking here).
        Also after a start that failed half-way: what it started stops, its clients close."""
        if self.me.url is not None:
            try:
                self.roster.announce(self.me.worker, None)
            except Exception as exc:  # noqa: BLE001 - leaving anyway; the record then goes stale
                log.warning("members record not cleared: %s", exc)
        if self.readers is not None:
            self.readers.stop()
        self.server.stop()
        self.roster.stop()
        self.resolver.stop()
        if self.standbys is not None:
            self.standbys.stop()

    # -- Local (what the answers read) -------------------------------------------------------
    def routing(self) -> Routing:
        return self.roster.routing

    def active(self, p: int) -> bool:
        a = self._worker.assignment
        return a is not None and p in a.tables

    def restoring(self, p: int) -> tuple[int, int] | None:
        a = self._worker.assignment
        if a is None:
            return None
        task = a.restoring.get((self._input, p))
        if task is not None:
            return task.progress.done, task.progress.total
        if p not in a.tables and self.roster.routing.owners.get(p) == self.me.worker:
            return 0, 0  # restored, waiting to be activated (or to restore again)
        return None

    def decode(self, value: bytes) -> dict[str, Any]:
        record: dict[str, Any] = self._codec.decode(value).record
        return record

    def types(self) -> list[str]:
        return self._types

    def _routing_json(self) -> dict[str, Any]:
        return {**self.roster.routing.to_json(), "me": {"worker": self.me.worker, "url": self.me.url}}

    def _partitions_json(self) -> dict[str, Any]:
        a = self._worker.assignment
        restoring = {} if a is None else {
            str(p): {"done": t.progress.done, "total": t.progress.total}
            for (topic, p), t in list(a.restoring.items()) if topic == self._input}
        standbys = {}
        for p in self.standby_views.partitions():
            v = self.standby_views.get(p)
            if v is not None:
                standbys[str(p)] = {"position": v.position, "lag": v.lag}
        return {"worker": self.me.worker, "url": self.me.url,
                "active": {str(p): self._active_json(p) for p in self.views.partitions()},
                "restoring": restoring, "standbys": standbys}

    def _active_json(self, p: int) -> dict[str, Any]:
        why = self.views.stale(p)
        return {"position": self.views.position(p), **({} if why is None else {"stale": why})}
