"""Suite ``scaling``: 1, 2 and 3 worker processes on 6 and 12 partitions, 3 brokers.

A 3-broker :class:`fifolane.cluster.LocalCluster` (KRaft, replication factor 3, min ISR 2)
starts beside the run's own Kafka, on the same machine. For each partition count and
worker count, fresh role topics are created; the workers (one consumer group, exactly-once,
table handler, concurrency 16) join on the empty input and take all partitions; then the
pre-encoded events are produced in one burst, and the drain is timed from the first
commit to the commit covering the last event (:mod:`benchmarks.cpu_runs`), with the CPU
seconds of the workers and of the three brokers over the same interval.

The model's prediction (:func:`fifolane.capacity.predict_local_rate`, costs from this run's
``capacity.json`` if there is one, else the committed one) is shown beside each point: for 2
idle cores, and for the cores the run really got (workers + brokers CPU over wall time).
Results in ``scaling.json`` and ``scaling.png``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.cpu_runs import run_workers
from benchmarks.events import events, produce_raw
from benchmarks.harness import SHARED_LIBS, Bench, Metric
from benchmarks.meters import find_brokers, loadavg
from benchmarks.scaling_plot import scaling_plot
from fifolane.capacity import COSTS_FILE, Costs, load_costs, predict_local_rate
from fifolane.cluster import LocalCluster
from fifolane.config import PROJECT_ROOT, Settings
from fifolane.errors import ConfigError
from fifolane.serde import SchemaCatalog, make_codec

__all__ = ["PARTITIONS", "WORKERS", "run"]

PARTITIONS = (6, 12)
WORKERS = (1, 2, 3)
REPLICATION = 3


def _shown(path: Path) -> str:
    """``path`` relative to the project when inside it (results name no machine's folders)."""
    try:
        return str(path.resolve().relative_to(PROJECT_ROOT))
    except ValueError:
        return str(path)


def _costs(bench: Bench) -> tuple[Costs | None, str]:
    """This run's measured costs if the capacity suite ran, else the committed ones."""
    for path in (bench.results_dir / "capacity.json", COSTS_FILE):
        try:
            return load_costs(path), _shown(path)
        except ConfigError as exc:
            error = str(exc)
    return None, error


def _encoded(settings: Settings, n: int) -> list[tuple[bytes, bytes | None, Any]]:
    codec = make_codec(settings, SchemaCatalog.load(settings.schemas_dir))
    return [(g.encode(), codec.encode("reservation", rec), None) for g, _k, _v, rec in events(n)]


def run(bench: Bench) -> None:
    """Start 3 brokers; for 6 and 12 partitions, 1..3 workers, one round each."""
    started = time.monotonic()
    # quick: 30,000 fit in one commit of 3 workers once (CI), and 60,000 did once the general
    # path got faster (a commit on the loaded 3 brokers can take long enough for a whole burst)
    n = bench.size(150_000, 150_000)
    reps = 1  # one round: the six runs fit in about 15 minutes of a shared 2-core machine
    costs, costs_from = _costs(bench)
    home = bench.work / "cluster3"
    bench.step("scaling: starting a 3-broker Kafka (KRaft)")
    cluster = LocalCluster(home, 3, libs=SHARED_LIBS)
    cluster.up(timeout=240, fresh=True)
    try:
        boot = cluster.bootstrap_servers
        brokers = find_brokers(boot)
        encoded: list[tuple[bytes, bytes | None, Any]] = []
        runs: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for _r in range(reps):
            for partitions in PARTITIONS:
                for workers in WORKERS:
                    settings = bench.topic_set(f"scaling-p{partitions}-w{workers}", partitions,
                                               bootstrap_servers=boot)
                    if not encoded:
                        encoded = _encoded(settings, n)

                    def burst(s: Settings = settings, items: list[Any] = encoded) -> None:
                        bench.step(f"scaling: producing {n:,} events in one burst", n)
                        produce_raw(s, s.input_topic, iter(items), on_progress=bench.advance)

                    one = run_workers(bench, settings, n, label=f"scaling-p{partitions}-w{workers}",
                                      workers=workers, brokers=brokers, fresh_outputs=False,
                                      before_drain=burst)
                    runs.setdefault((partitions, workers), []).append(one.to_dict())
    finally:
        bench.step("scaling: stopping the 3-broker Kafka")
        cluster.down(timeout=30)
    rows = [_row(p, w, v, costs) for (p, w), v in sorted(runs.items())]
    png = bench.results_dir / "scaling.png"
    scaling_plot(png, rows)
    notes = [
        f"3 brokers (KRaft, replication factor {REPLICATION}, min ISR 2) on the same machine as the "
        "workers, the bench's own one-broker Kafka (idle) and this process; exactly-once, table "
        "handler, concurrency 16, 0.25 s commit interval.",
        "Warm start: the workers join on the empty input and hold every partition before the "
        "events are produced in one burst; timed from the first commit to the commit covering "
        f"the last event; {reps} round(s), the median shown, every round in raw/runs.",
        "CPU = user + system seconds of the worker processes / of the 3 broker JVMs over that "
        "interval; cores used = both over wall time.",
        f"Model: fifolane.capacity.predict_local_rate with the costs of {costs_from}.",
    ]
    bench.write_result("scaling", _metrics(rows), started=started, notes=notes, settings={
        "events": n, "partitions": list(PARTITIONS), "workers": list(WORKERS), "rounds": reps,
        "replication": REPLICATION, "guarantee": "exactly-once", "concurrency": 16,
    }, raw={"rows": rows, "runs": {f"p{p}-w{w}": v for (p, w), v in runs.items()},
            "costs_from": costs_from, "plot": str(png.name), "loadavg_end": loadavg()})


def _row(partitions: int, workers: int, reps: list[dict[str, Any]], costs: Costs | None) -> dict[str, Any]:
    ordered = sorted(reps, key=lambda r: r["events_per_s"])
    mid = ordered[len(ordered) // 2]
    row = {"partitions": partitions, "workers": workers, "events_per_s": mid["events_per_s"],
           "worker_us_per_event": mid["worker_us_per_event"], "broker_us_per_event": mid["broker_us_per_event"],
           "cores_used": mid["cores_used"], "loadavg": mid["loadavg"],
           "reps_events_per_s": [round(r["events_per_s"]) for r in reps],
           "median_loadavg": statistics.median(r["loadavg"][0] for r in reps)}
    if costs is not None:
        row["predicted_2_cores"] = predict_local_rate(costs, workers, 2.0, replication=REPLICATION)
        if mid["cores_used"]:
            row["predicted_got_cores"] = predict_local_rate(costs, workers, mid["cores_used"],
                                                            replication=REPLICATION)
    return row


def _metrics(rows: list[dict[str, Any]]) -> list[Metric]:
    one = {r["partitions"]: r["events_per_s"] for r in rows if r["workers"] == 1}
    m = []
    for r in rows:
        base = one.get(r["partitions"])
        m.append(Metric("scaling", f"{r['workers']} worker(s), {r['partitions']} partitions, 3 brokers",
                        r["events_per_s"], "events/s", "1 worker" if r["workers"] > 1 else "",
                        base if r["workers"] > 1 else None,
                        note=f"worker {r['worker_us_per_event']:.1f} us/event, brokers "
                             f"{(r['broker_us_per_event'] or 0):.1f} us/event, {r['cores_used']:.2f} cores used, "
                             f"model {r.get('predicted_2_cores', 0):,.0f}/s on 2 idle cores; "
                             f"load {r['loadavg'][0]:.1f}"))
    return m

