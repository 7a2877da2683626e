"""Worker counters: plain ints on the hot path, exported to Prometheus at scrape time."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["TRANSACTIONAL", "Stats", "lag_of", "serve_metrics", "update_lag"]


#: Counters of what transactions did: an abort takes them back to the last commit (the
#: replay counts its records again), so each input record is counted once, as committed.
TRANSACTIONAL = ("consumed", "processed", "superseded", "dead_lettered", "writes_superseded",
                 "replay_skipped", "parks", "replayed", "stage_superseded", "stage_failures",
                 "state_writes", "state_coalesced", "outputs", "claims_sent", "claims", "moves_sent", "moves_applied")


@dataclass
class Stats:
    """Every input record ends in exactly one of processed, superseded or dead_lettered.

    The :data:`TRANSACTIONAL` counters (and ``dead_letter_reasons``) count committed work:
    :meth:`committed` marks them at each commit, :meth:`rolled_back` takes them back to the
    mark after an abort. Prometheus sees the marked values only (its counters never go
    back); ``commits``, ``aborts`` and the rest count what happened.
    """

    worker_id: str = ""
    consumed: int = 0
    processed: int = 0
    superseded: int = 0
    dead_lettered: int = 0
    dead_letter_reasons: Counter[str] = field(default_factory=Counter)
    writes_superseded: int = 0
    replay_skipped: int = 0  # replayed records whose effects were committed already
    held: int = 0  # events held by parked groups now
    parks: int = 0  # groups parked (a handler failed after its retries, --on-failure park)
    replayed: int = 0  # held events replayed on a release
    parked_groups: int = 0
    stage_superseded: int = 0  # events of a later pipeline stage whose entity has a newer version
    stage_failures: int = 0  # events of a later pipeline stage that were dead-lettered
    handler_retries: int = 0
    state_writes: int = 0
    state_coalesced: int = 0  # state writes whose record a later write of the entity in its batch replaced
    outputs: int = 0
    claims_sent: int = 0  # entity directory claims produced
    claims: int = 0  # directory claims decided (owner of directory partitions)
    moves_sent: int = 0  # move-outs sent to the group an entity left
    moves_applied: int = 0  # copies removed from a group the entity left
    commits: int = 0
    aborts: int = 0
    consumer_renewals: int = 0  # consumers replaced after the group fenced them for good (rebalance.py)
    last_commit_ms: float = 0.0
    commit_ms_total: float = 0.0
    persist_ms_total: float = 0.0
    in_flight: int = 0
    ready_groups: int = 0
    max_in_flight: int = 0
    restored_records: int = 0
    restore_total: int = 0
    restoring: int = 0
    restore_progress: dict[str, list[int]] = field(default_factory=dict)  # "topic[p]": [done, total]
    bisecting: int = 0  # 1 while finding an input record whose output Kafka refuses
    producer_queue_full: int = 0  # records that waited for room in the producer's local queue
    sink: dict[str, float] = field(default_factory=dict)  # the change sink's own metrics
    lag: dict[int, int] = field(default_factory=dict)
    assigned: list[int] = field(default_factory=list)
    assigned_directory: list[int] = field(default_factory=list)  # directory partitions (linked.py)
    started_at: float = field(default_factory=time.time)
    mark: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.committed()

    def committed(self) -> None:
        """A transaction committed: its counts stay."""
        mark = {name: getattr(self, name) for name in TRANSACTIONAL}
        mark["dead_letter_reasons"] = Counter(self.dead_letter_reasons)
        self.mark = mark

    def rolled_back(self) -> None:
        """A transaction aborted: its counts go (its input is replayed and counted again)."""
        for name, value in self.mark.items():
            setattr(self, name, Counter(value) if name == "dead_letter_reasons" else value)

    def snapshot(self) -> dict[str, Any]:
        data = asdict(self)
        del data["mark"]
        data["dead_letter_reasons"] = dict(self.dead_letter_reasons)
        data["lag"] = {str(k): v for k, v in self.lag.items()}
        data["time"] = time.time()
        return data

    def write(self, path: Path) -> None:
        """Atomically replace a JSON snapshot (read by the demo, tests and operators)."""
        tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.snapshot()))
        tmp.replace(path)


class _Collector:
    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.stats
        m = s.mark  # committed counts only: a Prometheus counter never goes back
        labels = ["worker"]
        w = [s.worker_id]
        for name, value, doc in (
            ("fifolane_events_consumed", m["consumed"], "input records consumed (committed)"),
            ("fifolane_events_processed", m["processed"], "events handled and applied (committed)"),
            ("fifolane_events_superseded", m["superseded"], "stale or duplicate events dropped (committed)"),
            ("fifolane_events_dead_lettered", m["dead_lettered"], "records sent to the dead-letter topic (committed)"),
            ("fifolane_handler_retries", s.handler_retries, "handler retries after an exception"),
            ("fifolane_directory_claims_sent", m["claims_sent"], "entity directory claims produced"),
            ("fifolane_directory_claims", m["claims"], "entity directory claims decided"),
            ("fifolane_moves_sent", m["moves_sent"], "move-outs sent to a group an entity left"),
            ("fifolane_moves_applied", m["moves_applied"], "entity copies removed from a group they left"),
            ("fifolane_commits", s.commits, "checkpoints committed"),
            ("fifolane_aborts", s.aborts, "transactions aborted"),
            ("fifolane_consumer_renewals", s.consumer_renewals, "consumers replaced after the group fenced them"),
            ("fifolane_restored_records", s.restored_records, "changelog records restored"),
            ("fifolane_commit_seconds", s.commit_ms_total / 1000, "time spent committing checkpoints"),
            ("fifolane_persist_seconds", s.persist_ms_total / 1000, "time spent writing committed state to RocksDB"),
            ("fifolane_producer_queue_full", s.producer_queue_full,
             "records that waited for room in the producer's local queue (queue.buffering.max.*)"),
        ):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(w, value)
            yield c
        reasons = CounterMetricFamily("fifolane_dead_letters_by_reason", "dead letters by reason",
                                      labels=["worker", "reason"])
        for reason, n in m["dead_letter_reasons"].items():
            reasons.add_metric([s.worker_id, reason], n)
        yield reasons
        gauges: tuple[tuple[str, float, str], ...] = (
            ("fifolane_in_flight_groups", s.in_flight, "groups with an event in flight"),
            ("fifolane_ready_groups", s.ready_groups, "groups waiting for a handler slot"),
            ("fifolane_restoring_partitions", s.restoring, "partitions being restored"),
            ("fifolane_restore_total", s.restore_total, "changelog records to restore"),
            ("fifolane_commit_latency_seconds", s.last_commit_ms / 1000, "last checkpoint commit duration"),
            ("fifolane_bisecting", s.bisecting, "1 while finding an input record whose output Kafka refuses"),
            ("fifolane_parked_groups", s.parked_groups, "groups parked (--on-failure park)"),
            ("fifolane_held_events", s.held, "events held by parked groups"),
        )
        for gname, gvalue, gdoc in gauges:
            g = GaugeMetricFamily(gname, gdoc, labels=labels)
            g.add_metric(w, gvalue)
            yield g
        for name, value in sorted(s.sink.items()):
            g = GaugeMetricFamily(f"fifolane_{name}", f"change sink: {name}", labels=labels)
            g.add_metric(w, value)
            yield g
        lag = GaugeMetricFamily("fifolane_consumer_lag", "input records behind the end",
                                labels=["worker", "partition"])
        for p, n in s.lag.items():
            lag.add_metric([s.worker_id, str(p)], n)
        yield lag


def serve_metrics(stats: Stats, port: int, addr: str = "127.0.0.1") -> int:
    """Start the Prometheus endpoint (``/metrics``) in a daemon thread; returns the port."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    registry.register(_Collector(stats))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return int(server.server_port)


def lag_of(consumer: Any, topic: str, partition: int, start: int | None = None) -> int | None:
    """Records of ``topic[partition]`` behind the end the consumer (a WorkerConsumer) last
    fetched: cached watermarks, no round trip. Until the partition hands out its first record
    the client knows no position: then it is ``start`` (where consuming resumes: the committed
    offset), or without one the start of the log (the worker reads from the earliest). None:
    not known (no fetch yet, a client error)."""
    from confluent_kafka import TopicPartition

    from fifolane.errors import KafkaClientError

    tp = TopicPartition(topic, partition)
    try:
        low, high = consumer.watermarks(tp, cached=True)
        pos = consumer.position(tp)
    except KafkaClientError:
        return None
    if pos < 0:
        pos = start if start is not None else low
    return int(high - pos) if high >= 0 and pos >= 0 else None


def update_lag(stats: Stats, consumer: Any, topic: str, partitions: Iterable[int],
               starts: Mapping[int, int | None] | None = None) -> None:
    """Records behind the end per partition processed here (:func:`lag_of`; ``starts``: the
    committed offsets). A partition not among ``partitions`` any more (revoked, lost, being
    restored again) loses its gauge: another worker reports it now."""
    owned = set(partitions)
    for p in [p for p in stats.lag if p not in owned]:
        del stats.lag[p]
    for p in owned:
        lag = lag_of(consumer, topic, p, (starts or {}).get(p))
        if lag is not None:
            stats.lag[p] = lag
