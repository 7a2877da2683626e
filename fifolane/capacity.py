"""The capacity model: partitions, worker processes, brokers and Spark cores for a target load.

Pure functions over a table of measured costs (:class:`Costs`), kept as data in the repo:
``benchmarks/results/capacity.json``, written by the ``capacity`` benchmark suite
(``python -m benchmarks run --only capacity``) and explained in ``docs/capacity.md``.
``fifolane plan`` prints :func:`plan` for the command line's :class:`Load`.

The model, per event (all costs measured on one machine, CPU time of the process concerned):

- **worker CPU** = the handler's cost (table handler or an app) + the listeners' (a fixed
  cost once indexed equality listeners exist, a per-listener cost for each CEL or prefix
  filter, a per-notification cost, plus a converter's per notification). A worker process is
  one Python interpreter: it gets at most one core, and ``concurrency`` groups in flight,
  so a handler that waits ``handler_ms`` per event caps it at ``concurrency / handler_ms``;
- **order**: a group is handled serially (the hottest group's rate times its service time
  must stay below 1), and a partition is owned by one process (the hottest partition's rate
  must stay below one process's);
- **brokers**: bytes written per event (input, state, notifications, dead letters,
  directory claims) times the replication factor, against each broker's network; broker
  CPU per event times the replication factor; partition replicas per broker.

Every limit is reported as its utilisation at the target load on the planned cluster;
the largest is the one that binds first as the load grows.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fifolane.config import PROJECT_ROOT
from fifolane.errors import ConfigError

__all__ = ["COSTS_FILE", "HANDLERS", "Costs", "Limit", "Load", "Plan", "load_costs", "plan",
           "predict_local_rate", "worker_cpu_us"]

#: Where the ``capacity`` benchmark suite writes the measured costs (the model's default).
COSTS_FILE = PROJECT_ROOT / "benchmarks" / "results" / "capacity.json"
#: Handlers with a measured cost: the built-in table handler and an app (examples.flights).
HANDLERS = ("table", "app")
#: Role topics with one partition per input partition (input, state, notifications, parked,
#: and the DLQ and directory, which follow the input's count by default); plus the registry.
PARTITIONED_ROLES = 6
_BYTES = ("input", "state", "notification", "dead_letter", "directory_claim")
_LISTENER = ("equality_fixed", "filter_per_listener", "prefix_per_listener")
_RERUN = "run `python -m benchmarks run --only capacity` to measure them"


@dataclass(frozen=True)
class Costs:
    """Measured costs: CPU microseconds per event (or per listener, per notification),
    restore and Spark rates, broker bytes per record. ``measured`` says where and when."""

    worker_us: dict[str, float]  # handler -> worker CPU us per event, no listeners
    listener_us: dict[str, float]  # _LISTENER -> us per event
    notification_us: float  # worker CPU per notification sent
    converter_us: float  # extra worker CPU per notification of a listener with a converter
    broker_us: float  # broker CPU per event (table handler path, replication factor 1)
    restore_entities_per_s: float  # one worker restoring its state
    spark_rows_per_core_s: float  # views build, per executor core
    bytes: dict[str, float]  # _BYTES -> broker bytes per record (on disk, batches included)
    measured: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any, source: str = "costs") -> Costs:
        """Costs from their JSON form; every missing or non-positive number is named."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a JSON object of costs; {_RERUN}")
        problems: list[str] = []

        def number(obj: Any, key: str, where: str, zero_ok: bool = False) -> float:
            value = obj.get(key) if isinstance(obj, dict) else None
            if (isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
                    and (value > 0 or (value == 0 and zero_ok))):
                return float(value)
            wanted = "a non-negative" if zero_ok else "a positive"
            problems.append(f"{where}{key} = {value!r} (expected {wanted} number)")
            return 1.0

        def table(key: str, names: tuple[str, ...], zero_ok: bool = False) -> dict[str, float]:
            return {n: number(data.get(key), n, f"{key}.", zero_ok) for n in names}

        measured = data.get("measured")
        costs = cls(
            worker_us=table("worker_us", HANDLERS),
            listener_us=table("listener_us", _LISTENER, zero_ok=True),
            notification_us=number(data, "notification_us", "", zero_ok=True),
            converter_us=number(data, "converter_us", "", zero_ok=True),
            broker_us=number(data, "broker_us", ""),
            restore_entities_per_s=number(data, "restore_entities_per_s", ""),
            spark_rows_per_core_s=number(data, "spark_rows_per_core_s", ""),
            bytes=table("bytes", _BYTES),
            measured=measured if isinstance(measured, dict) else {},
        )
        if problems:
            raise ConfigError(f"{source}: invalid costs: {'; '.join(problems)}; {_RERUN}")
        return costs

    def to_dict(self) -> dict[str, Any]:
        """The JSON form read by :meth:`from_dict`."""
        return {"worker_us": self.worker_us, "listener_us": self.listener_us,
                "notification_us": self.notification_us, "converter_us": self.converter_us,
                "broker_us": self.broker_us, "restore_entities_per_s": self.restore_entities_per_s,
                "spark_rows_per_core_s": self.spark_rows_per_core_s, "bytes": self.bytes,
                "measured": self.measured}


def load_costs(path: Path | None = None) -> Costs:
    """The ``costs`` of a capacity result file (default :data:`COSTS_FILE`)."""
    path = Path(path) if path is not None else COSTS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"no measured costs at {path}; {_RERUN}, or pass --costs FILE") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the costs in {path}: {exc}; {_RERUN}") from exc
    costs = data.get("costs") if isinstance(data, dict) and "costs" in data else data
    return Costs.from_dict(costs, str(path))


@dataclass(frozen=True)
class Load:
    """A target load and the deployment's choices (every default is printed by the plan)."""

    events_per_s: float
    listeners: int
    handler: str = "table"
    handler_ms: float = 0.0  # wall time a handler waits per event (I/O), not CPU
    groups: int = 100_000
    skew: float = 10.0  # the hottest group's rate over the average group's
    entities: int | None = None  # live entities (default 100 per group)
    filter_share: float = 0.0  # share of listeners with a CEL filter the index cannot serve
    prefix_share: float = 0.0  # share with a startsWith (prefix) filter
    converter_share: float = 0.0  # share of notifications that run a converter
    notifications_per_event: float = 1.0
    dead_letter_share: float = 0.001  # share of events that end in the DLQ
    creates_per_event: float = 0.1  # directory claims: entities new to a partition, per event
    concurrency: int = 16  # groups in flight per worker (fifolane worker --concurrency)
    headroom: float = 0.7  # plan every resource to this share of its measured capacity
    growth: float = 2.0  # partitions per worker: room to add workers without re-partitioning
    replication: int = 3
    broker_mb_s: float = 125.0  # network per broker and direction (1 Gbit/s)
    broker_cores: int = 8
    replicas_per_broker: int = 4000  # partition replicas one broker carries comfortably
    views_within_s: float = 600.0  # a full views build must finish within this

    def __post_init__(self) -> None:
        problems = []

        def need(ok: bool, text: str) -> None:
            if not ok:
                problems.append(text)

        finite = all(math.isfinite(float(v)) for v in (self.events_per_s, self.handler_ms, self.skew,
                                                        self.notifications_per_event, self.broker_mb_s,
                                                        self.views_within_s, self.growth))
        need(finite, "numbers must be finite")
        need(self.events_per_s > 0, f"--events-per-second must be > 0, got {self.events_per_s:g}")
        need(self.listeners >= 0, f"--listeners must be >= 0, got {self.listeners}")
        need(self.handler in HANDLERS, f"--handler must be one of {', '.join(HANDLERS)}, got {self.handler!r}")
        need(self.handler_ms >= 0, f"--handler-ms must be >= 0, got {self.handler_ms:g}")
        need(self.groups >= 1, f"--groups must be >= 1, got {self.groups}")
        need(self.skew >= 1, f"--skew must be >= 1 (the hottest group is at least average), got {self.skew:g}")
        need(self.entities is None or self.entities >= 0, f"--entities must be >= 0, got {self.entities}")
        for name, share in (("--filter-share", self.filter_share), ("--prefix-share", self.prefix_share),
                            ("--converter-share", self.converter_share),
                            ("--dead-letter-share", self.dead_letter_share), ("--headroom", self.headroom)):
            need(0 <= share <= 1, f"{name} must be between 0 and 1, got {share:g}")
        need(self.filter_share + self.prefix_share <= 1,
             f"--filter-share + --prefix-share must be <= 1, got {self.filter_share + self.prefix_share:g}")
        need(self.headroom > 0, "--headroom must be > 0 (the share of capacity to plan for)")
        need(self.notifications_per_event >= 0, "--notifications-per-event must be >= 0")
        need(self.creates_per_event >= 0, "--creates-per-event must be >= 0")
        need(self.concurrency >= 1, f"--concurrency must be >= 1, got {self.concurrency}")
        need(self.growth >= 1, f"--growth must be >= 1, got {self.growth:g}")
        need(self.replication >= 1, f"--replication must be >= 1, got {self.replication}")
        need(self.broker_mb_s > 0 and self.broker_cores >= 1 and self.replicas_per_broker >= 1,
             "--broker-mb-s, --broker-cores and --replicas-per-broker must be > 0")
        need(self.views_within_s > 0, "--views-within must be > 0 seconds")
        if problems:
            raise ConfigError("impossible load: " + "; ".join(problems))

    @property
    def live_entities(self) -> int:
        """Live entities (``entities``, else 100 per group)."""
        return self.entities if self.entities is not None else 100 * self.groups

    @property
    def notes_per_event(self) -> float:
        """Notifications per event: none without listeners."""
        return self.notifications_per_event if self.listeners > 0 else 0.0


@dataclass(frozen=True)
class Limit:
    """One limit at the target load: its utilisation on the planned cluster (1.0 = saturated)
    and whether adding workers or brokers can raise it (``scales``)."""

    name: str
    utilisation: float
    scales: bool
    detail: str


@dataclass(frozen=True)
class Plan:
    """The sizing for a :class:`Load` (see :func:`plan`)."""

    load: Load
    worker_cpu_us: float  # per event
    breakdown: dict[str, float]  # us per event by part
    process_rate: float  # events/s one worker process can take at 100%
    workers: int
    worker_cores: float  # cores busy at the target load
    partitions: int
    brokers: int
    broker_reasons: dict[str, int]  # brokers needed by network, CPU, replicas, replication
    bytes_per_event: float  # written (before replication)
    network_in_mb_s: float  # cluster-wide, replication included
    network_out_mb_s: float
    spark_cores: int
    spark_rows: int
    restore_s: float  # one worker restoring its share of the entities
    hot_group_rate: float
    hot_group_latency_ms: float  # mean, serial M/D/1 queue; inf when saturated
    limits: list[Limit]
    ceiling_events_per_s: float  # with more workers and brokers, before order binds

    @property
    def binding(self) -> Limit:
        """The limit that binds first as the load grows on the planned cluster."""
        return max(self.limits, key=lambda lim: lim.utilisation)

    @property
    def feasible(self) -> bool:
        return all(lim.utilisation < 1 for lim in self.limits)


def worker_cpu_us(load: Load, costs: Costs) -> dict[str, float]:
    """Worker CPU microseconds per event, by part (handler, index, filters, notifications)."""
    m = load.listeners
    equality = m * (1 - load.filter_share - load.prefix_share)
    notes = load.notes_per_event
    return {
        "handler": costs.worker_us[load.handler],
        "equality index": costs.listener_us["equality_fixed"] if equality > 0 else 0.0,
        "CEL filters": m * load.filter_share * costs.listener_us["filter_per_listener"],
        "prefix filters": m * load.prefix_share * costs.listener_us["prefix_per_listener"],
        "notifications": notes * costs.notification_us,
        "converters": notes * load.converter_share * costs.converter_us,
    }


def _process_rate(load: Load, cpu_us: float) -> float:
    """Events/s of one worker process at 100%: one core, ``concurrency`` waits in flight."""
    rate = 1e6 / cpu_us
    if load.handler_ms > 0:
        rate = min(rate, load.concurrency * 1000.0 / (load.handler_ms + cpu_us / 1000))
    return rate


def plan(load: Load, costs: Costs) -> Plan:
    """Size workers, partitions, brokers and Spark cores for ``load`` from ``costs``."""
    parts = worker_cpu_us(load, costs)
    cpu_us = sum(parts.values())
    n, h = load.events_per_s, load.headroom
    per_proc = _process_rate(load, cpu_us)
    hot = min(n, load.skew * n / load.groups)
    service_ms = load.handler_ms + cpu_us / 1000  # one event of one group, start to end
    rho = hot * service_ms / 1000
    latency = service_ms + rho * service_ms / (2 * (1 - rho)) if rho < 1 else math.inf

    workers = max(1, math.ceil(n / (per_proc * h)))
    partitions = max(workers, math.ceil(workers * load.growth))
    # The hottest partition holds the hot group and its share of the rest, and one process
    # owns it: hot + (n - hot) / P <= per_proc * h. Past the hot group alone no P will do.
    room = per_proc * h - hot
    if room > 0:
        partitions = max(partitions, math.ceil((n - hot) / room))
    while math.ceil(partitions / workers) * n / partitions > per_proc * h and workers < partitions:
        workers += 1  # uneven shares: the worker with the most partitions must keep up
    worker_load = math.ceil(partitions / workers) * n / partitions
    hot_partition = hot + (n - hot) / partitions

    b = costs.bytes
    claims = load.creates_per_event
    notes = load.notes_per_event
    per_event = (b["input"] + b["state"] + notes * b["notification"]
                 + load.dead_letter_share * b["dead_letter"] + claims * b["directory_claim"])
    rf = load.replication
    written = n * per_event
    inbound = written * rf
    reads = n * (b["input"] + notes * b["notification"] + claims * b["directory_claim"])
    outbound = written * (rf - 1) + reads
    nic = load.broker_mb_s * 1e6
    broker_cpu = n * costs.broker_us * rf / 1e6
    replicas = (PARTITIONED_ROLES * partitions + 1) * rf
    reasons = {
        "network": math.ceil(max(inbound, outbound) / (nic * h)),
        "CPU": math.ceil(broker_cpu / (load.broker_cores * h)),
        "partition replicas": math.ceil(replicas / load.replicas_per_broker),
        "replication factor": rf,
    }
    brokers = max(reasons.values())

    rows = load.live_entities
    spark = max(1, math.ceil(rows / (costs.spark_rows_per_core_s * load.views_within_s)))
    restore_s = rows / workers / costs.restore_entities_per_s

    limits = [
        Limit("worker CPU", worker_load / (1e6 / cpu_us), True,
              f"{worker_load:,.0f} events/s on the busiest worker, {1e6 / cpu_us:,.0f}/s per core"),
        Limit("hot-group latency", rho, False,
              f"hottest group {hot:,.1f} events/s x {service_ms:.3f} ms each, handled serially"),
        Limit("per-partition order", hot_partition / per_proc, False,
              f"hottest partition {hot_partition:,.0f} events/s, one process takes {per_proc:,.0f}/s"),
        Limit("broker network", max(inbound, outbound) / (brokers * nic), True,
              f"{max(inbound, outbound) / 1e6:,.1f} MB/s busiest direction over {brokers} brokers"),
        Limit("broker CPU", broker_cpu / (brokers * load.broker_cores), True,
              f"{broker_cpu:,.1f} cores over {brokers} x {load.broker_cores}"),
    ]
    if load.handler_ms > 0:
        conc = load.concurrency * 1000.0 / (load.handler_ms + cpu_us / 1000)
        limits.insert(1, Limit("handler concurrency", worker_load / conc, True,
                               f"{load.concurrency} groups in flight per worker x {load.handler_ms:g} ms"))
    # Scale-out ceiling: one partition per worker at most, and the hot group stays serial.
    # Both bounds grow linearly with the load factor f: f * hot * s < 1 and
    # f * (hot + (n - hot) / P) < per_proc.
    fixed = [lim.utilisation for lim in limits if not lim.scales]
    ceiling = n / max(fixed) if max(fixed) > 0 else math.inf
    return Plan(load=load, worker_cpu_us=cpu_us, breakdown=parts, process_rate=per_proc, workers=workers,
                worker_cores=n * cpu_us / 1e6, partitions=partitions, brokers=brokers, broker_reasons=reasons,
                bytes_per_event=per_event, network_in_mb_s=inbound / 1e6, network_out_mb_s=outbound / 1e6,
                spark_cores=spark, spark_rows=rows, restore_s=restore_s, hot_group_rate=hot,
                hot_group_latency_ms=latency, limits=limits, ceiling_events_per_s=ceiling)


def predict_local_rate(costs: Costs, workers: int, cores: float, *, replication: int = 1,
                       handler: str = "table") -> float:
    """Events/s that ``workers`` worker processes reach when they share ``cores`` with the
    brokers (all replicas on the same machine, as in the benchmarks' scaling run): each
    process takes at most one core, and each event costs the worker's CPU plus the brokers'
    CPU once per replica."""
    if workers < 1 or cores <= 0 or replication < 1:
        raise ConfigError(f"workers, cores and replication must be positive, got {workers}, {cores}, {replication}")
    worker = costs.worker_us[handler]
    return min(workers * 1e6 / worker, cores * 1e6 / (worker + replication * costs.broker_us))
