"""``StateClient``: read the live state from the workers' query endpoints.

    client = StateClient.from_settings(load_settings())   # addresses from the members topic
    r = client.get("Reservation", "R-1")                  # an Entity, or None
    for e in client.scan("F-100"): ...                    # every entity of a FIFO group

Routing (docs/formats.md, "Query API"): the client keeps the group's map (``GET
/v1/routing``: partition -> owner's address) and computes a key's partition itself
(:mod:`fifolane.query`). A worker that does not own the partition answers ``moved`` with the
owner: the client asks there, and refreshes its map (the "stale locator" of the seed). It
retries ``restoring`` and ``unavailable`` answers (a rebalance, a restore) until its timeout.

Reads are *monotonic* by default: the client remembers the highest position it has seen per
partition and asks every later read of that partition for at least that position, so it
never sees an entity go back to an older version, also across owners.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from fifolane.errors import ConfigError
from fifolane.partitioner import partition_for
from fifolane.query import (
    API,
    BAD_REQUEST,
    MOVED,
    NOT_FOUND,
    OK,
    RESTORING,
    TIMEOUT,
    UNAVAILABLE,
    QueryError,
    entity_key,
    read_member,
)

__all__ = ["Entity", "Owner", "StateClient", "member_urls"]

_RETRYABLE = {RESTORING, UNAVAILABLE}
_REFRESH_MIN_S = 0.2  # at most this often a routing refresh after a moved answer


@dataclass(frozen=True, slots=True)
class Owner:
    """The worker that owns (or, for a stale read, served) a partition."""

    worker: str
    url: str | None


@dataclass(frozen=True, slots=True)
class Entity:
    """An entity as a worker answered it."""

    type: str
    key: str
    group: str
    version: int
    value: dict[str, Any]
    partition: int
    #: the state-topic position the answer reflects (every committed record below it)
    position: int
    owner: Owner | None
    stale: bool = False  # served by a standby (``stale=True``)
    lag: int = 0  # a standby's records not applied yet


def _owner(data: Any) -> Owner | None:
    if not isinstance(data, dict) or not isinstance(data.get("worker"), str):
        return None
    return Owner(data["worker"], data.get("url"))


def member_urls(settings: Any, group_id: str | None = None, timeout: float = 10.0, *,
                strict: bool = False) -> list[str]:
    """The query addresses in the members topic of the workers of ``settings.input_topic``
    (of consumer group ``group_id`` if given). A members topic that cannot be read (Kafka
    down) gives none, or with ``strict`` a :class:`ConfigError` saying so."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

    consumer = Consumer(settings.kafka_config(**{"group.id": "fifolane-client", "enable.auto.commit": False}))
    urls: dict[tuple[str, str], str] = {}
    try:
        tp = TopicPartition(settings.members_topic, 0)
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout)
        except KafkaException as exc:  # Kafka not reachable now: no addresses found
            err = exc.args[0] if exc.args else None
            missing = isinstance(err, KafkaError) and err.code() in (
                KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION)
            if strict and not missing:
                why = err.str() if isinstance(err, KafkaError) else str(exc)
                raise ConfigError(
                    f"cannot read the workers' query addresses: the members topic {settings.members_topic!r} "
                    f"did not answer within {timeout:.0f}s ({why}); is Kafka at {settings.resolved_bootstrap()} "
                    "down or restarting? Try again when it is up, or pass --url") from None
            return []
        if high <= low:
            return []
        consumer.assign([TopicPartition(settings.members_topic, 0, low)])
        deadline = time.monotonic() + timeout
        pos = low
        while pos < high and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.2):
                if msg.error() is not None:
                    continue
                pos = max(pos, (msg.offset() or 0) + 1)
                found = read_member(msg.key(), msg.value())
                if found is None or (group_id is not None and found[0] != group_id):
                    continue
                group, worker, body = found
                if body is None:
                    urls.pop((group, worker), None)
                elif body.get("input_topic") == settings.input_topic:
                    urls[(group, worker)] = body["url"]
    finally:
        consumer.close()
    return sorted(set(urls.values()))


class StateClient:
    """Reads entities and groups from the owners (see the module docstring).

    ``urls``: query addresses to start from (any worker of the group). ``token``: the
    endpoint's bearer token. ``verify``: TLS verification (a CA file, or False).
    """

    def __init__(self, urls: list[str], *, token: str | None = None, verify: bool | str | ssl.SSLContext = True,
                 timeout: float = 30.0, monotonic: bool = True,
                 discover: Callable[[], list[str]] | None = None, refresh_every: float = 5.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        if not urls:
            raise ConfigError("no query endpoint to ask: start the workers with --query-port, or pass a url")
        self._seeds = list(urls)
        #: finds addresses again when none of the known ones answers (from_settings: the
        #: members topic), so a client outlives the workers it started with
        self._discover = discover
        self._refresh_every = refresh_every
        self.timeout = timeout
        self.monotonic = monotonic
        #: the answer of the last :meth:`get` that found nothing (where it looked, and for a
        #: deleted entity its last version and group)
        self.not_found: dict[str, Any] | None = None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if isinstance(verify, str):  # a CA file
            verify = ssl.create_default_context(cafile=verify)
        self._http = httpx.Client(headers=headers, verify=verify, timeout=min(timeout, 35.0), transport=transport)
        self._lock = threading.Lock()
        self._routing: dict[str, Any] = {}
        self._refreshed = 0.0
        self._seen: dict[int, int] = {}  # partition -> highest position seen
        self._where: dict[bytes, int] = {}  # entity key -> input partition (from moved answers)
        #: answers retried after moved / restoring / unavailable (tests, diagnostics)
        self.retries = {MOVED: 0, RESTORING: 0, UNAVAILABLE: 0}

    @classmethod
    def from_settings(cls, settings: Any, *, group_id: str | None = None, **kw: Any) -> StateClient:
        """A client that finds the endpoints in the members topic."""
        urls = member_urls(settings, group_id, strict=True)
        if not urls:
            raise ConfigError(f"no worker of input topic {settings.input_topic!r} publishes a query "
                              f"address in {settings.members_topic!r}: start workers with --query-port")
        return cls(urls, discover=lambda: member_urls(settings, group_id), **kw)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> StateClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- routing -----------------------------------------------------------------------------
    def routing(self, refresh: bool = False) -> dict[str, Any]:
        """The group's map as a worker last gave it (``GET /v1/routing``), refreshed every
        ``refresh_every`` seconds (and after moved or unreachable answers)."""
        if refresh or not self._routing or time.monotonic() - self._refreshed > self._refresh_every:
            if self._routing:
                self._routing_stale()  # keep the old map if no worker answers now
            else:
                self._refresh()
        return self._routing

    def _refresh(self) -> None:
        with self._lock:
            if time.monotonic() - self._refreshed < _REFRESH_MIN_S and self._routing:
                return
            self._refreshed = time.monotonic()
            last = self._routing_from(self._candidates())
            if last is not None and self._discover is not None:
                found = self._discover()
                if found:
                    self._seeds = list(dict.fromkeys(found + self._seeds))
                    last = self._routing_from(found)
            if last is not None and not self._routing:
                raise QueryError(f"no query endpoint answered ({last})", status=UNAVAILABLE)

    def _routing_from(self, urls: list[str]) -> Exception | None:
        """Take the routing map from the first of ``urls`` that answers (None), or the last
        error."""
        last: Exception | None = None
        for url in urls:
            try:
                r = self._http.get(url + API + "/routing")
                routing = r.json() if r.status_code == 200 else None
            except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:  # not an endpoint of ours
                last = exc
                continue
            if isinstance(routing, dict):
                self._routing = routing
                return None
            last = QueryError(f"{url}: routing answered {r.status_code}", status=str(r.status_code))
        return last if last is not None else QueryError("no query endpoint known", status=UNAVAILABLE)

    def _candidates(self) -> list[str]:
        urls = [m["url"] for m in self._routing.get("members", []) if m.get("url")]
        return list(dict.fromkeys(urls + self._seeds))

    def _url_of(self, partition: int | None, directory: int | None) -> str:
        r = self.routing()
        table = r.get("directory", {}) if directory is not None else r.get("partitions", {})
        owner = table.get(str(directory if directory is not None else partition), {})
        return owner.get("url") or self._candidates()[0]

    # -- requests ----------------------------------------------------------------------------
    def _ask(self, path: str, params: dict[str, Any], partition: int | None, directory: int | None,
             ekey: bytes | None = None) -> dict[str, Any]:
        """Ask until an answer with data (or not found): follows moved, waits out restoring."""
        deadline = time.monotonic() + self.timeout
        url = self._url_of(partition, directory)
        attempt = 0
        while True:
            p = self._where.get(ekey) if ekey is not None else partition
            q = dict(params)
            if p is not None:
                if ekey is not None:
                    q["partition"] = p
                if self.monotonic and p in self._seen and "min_position" not in params:
                    q["min_position"] = self._seen[p]
                    q.setdefault("wait_ms", 5000)
            body: dict[str, Any]
            try:
                r = self._http.get(url + path, params=q)
            except httpx.InvalidURL as exc:  # a key or group too long for a URL: final
                raise QueryError(f"{path}: the request cannot be sent ({exc}); is the key or group that "
                                 "long?", status=BAD_REQUEST) from None
            except httpx.HTTPError as exc:
                r = None
                status, body = UNAVAILABLE, {"error": f"{url}: {exc}"}
                self._routing_stale()
            if r is not None:
                try:
                    body = r.json()
                    status = body.get("status", str(r.status_code))
                except ValueError:  # not JSON: a proxy's or the HTTP server's own answer
                    if 400 <= r.status_code < 500:  # the request itself was refused: final
                        raise QueryError(f"{url}{path}: HTTP {r.status_code}: {r.text.strip()[:300]}",
                                         status=BAD_REQUEST) from None
                    status, body = UNAVAILABLE, {"error": f"{url}: HTTP {r.status_code}: {r.text.strip()[:300]}"}
                    self._routing_stale()
            if status in (OK, NOT_FOUND):
                got = body.get("partition")
                if isinstance(got, int) and isinstance(body.get("position"), int) and not body.get("stale"):
                    self._seen[got] = max(self._seen.get(got, 0), body["position"])
                return dict(body)
            if status == TIMEOUT or status not in (MOVED, *_RETRYABLE):
                raise QueryError(f"{url}{path}: {body.get('error') or status}", status=status, answer=body)
            if time.monotonic() >= deadline:
                raise QueryError(f"{path}: still {status} after {self.timeout:.0f}s "
                                 f"({body.get('error') or body.get('progress') or ''})", status=status, answer=body)
            self.retries[status] += 1
            attempt += 1
            if status == MOVED:
                if ekey is not None and isinstance(body.get("partition"), int):
                    self._where[ekey] = body["partition"]
                owner = _owner(body.get("owner"))
                self._routing_stale()
                if owner is not None and owner.url and owner.url != url:
                    url = owner.url
                    continue
                p = self._where.get(ekey) if ekey is not None else partition
                url = self._url_of(p, None if p is not None else directory)
            else:
                time.sleep(min(0.5, 0.02 * attempt))
                p = self._where.get(ekey) if ekey is not None else partition
                if status == UNAVAILABLE:
                    url = self._url_of(p, None if p is not None else directory)

    def _routing_stale(self) -> None:
        with contextlib.suppress(QueryError):  # the next attempt says what is wrong
            self._refresh()

    def get(self, type_name: str, key: str, *, group: str | None = None, min_position: int | None = None,
            wait_ms: int | None = None, stale: bool = False) -> Entity | None:
        """The entity's committed state (None: no such entity, or deleted)."""
        params: dict[str, Any] = {}
        if min_position is not None:
            params["min_position"] = min_position
        if wait_ms is not None:
            params["wait_ms"] = wait_ms
        if stale:
            params["stale"] = "true"
        ekey = entity_key(type_name, key)
        r = self.routing()
        partition = directory = None
        if group is not None:
            params["group"] = group
            partition = partition_for(group.encode(), int(r.get("input_partitions") or 1))
        elif ekey in self._where:
            partition = self._where[ekey]
        elif r.get("directory_partitions"):
            directory = partition_for(ekey, int(r["directory_partitions"]))
        else:
            partition = 0
        path = f"{API}/entities/{_quote(type_name)}/{_quote(key)}"
        body = self._ask(path, params, partition, directory, ekey if group is None else None)
        if body["status"] == NOT_FOUND:
            self.not_found = body
            return None
        return _entity(body, body["type"], body["key"])

    def scan(self, group: str, *, type_name: str | None = None, prefix: str | None = None,
             start: str | None = None, end: str | None = None, page: int = 1000,
             min_position: int | None = None, stale: bool = False) -> Iterator[Entity]:
        """Every live entity of a FIFO group (of one type, a key prefix, a key range), page by page."""
        params: dict[str, Any] = {"limit": page}
        for name, value in (("type", type_name), ("prefix", prefix), ("start", start), ("end", end),
                            ("min_position", min_position)):
            if value is not None:
                params[name] = value
        if stale:
            params["stale"] = "true"
        r = self.routing()
        partition = partition_for(group.encode(), int(r.get("input_partitions") or 1))
        after: str | None = None
        while True:
            q = dict(params) if after is None else {**params, "after": after}
            body = self._ask(f"{API}/groups/{_quote(group)}", q, partition, None)
            for e in body.get("entities", []):
                yield Entity(e["type"], e["key"], group, e["version"], e["value"], body["partition"],
                             body["position"], _owner(body.get("owner")), bool(body.get("stale")),
                             int(body.get("lag") or 0))
            after = body.get("next")
            if after is None:
                return


def _entity(body: dict[str, Any], type_name: str, key: str) -> Entity:
    return Entity(type_name, key, body["group"], body["version"], body["value"], body["partition"],
                  body["position"], _owner(body.get("owner")), bool(body.get("stale")), int(body.get("lag") or 0))


def _quote(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")


def read_token(path: Path | None) -> str | None:
    """The bearer token in a file (None: no file)."""
    if path is None:
        return None
    token = path.read_text().strip()
    if not token:
        raise ConfigError(f"the token file {path} is empty")
    return token
