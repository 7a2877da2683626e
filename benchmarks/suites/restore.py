"""Suite ``restore``: a worker rebuilding RocksDB from the state topic vs reading it raw.

E entities are written straight to a state topic (as workers write them). A bare consumer
reads it (baseline); then a worker with an empty state directory joins and restores every
partition before processing. The restore time is the worker's own, from its "restored ...
in X s" log lines: the span from the first partition's start to the last one's end (the
worker restores its partitions at the same time, one thread each); peak RSS is sampled with
psutil every 50 ms.
"""

from __future__ import annotations

import time
import uuid

import psutil

from benchmarks.consume import raw_consume
from benchmarks.events import events, produce_state
from benchmarks.harness import Bench, Metric
from benchmarks.meters import restore_span, restored_from_log
from benchmarks.procs import child_env, log_tail, read_stats, running, worker_cmd

__all__ = ["run"]

PARTITIONS = 6
RSS_LIMIT_MB = 512
def run(bench: Bench) -> None:
    """Write E entities, read them raw, then time a worker's restore and sample its RSS."""
    started = time.monotonic()
    n = bench.size(1_000_000, 100_000)
    settings = bench.topic_set("restore", PARTITIONS)
    bench.step(f"restore: writing {n:,} entities to the state topic", n)
    produce_state(settings, events(n, entities=n), PARTITIONS, on_progress=bench.advance)
    bench.step("restore: bare consumer over the state topic", n)
    raw_read = raw_consume(settings, settings.state_topic, PARTITIONS)
    bench.advance(n)

    wid = f"bench-restore-{uuid.uuid4().hex[:6]}"
    cmd = worker_cmd(settings, wid, f"bench-{wid}", guarantee="exactly-once")
    log = settings.home / f"{wid}.log"
    stats_file = settings.home / f"{wid}.stats.json"
    bench.step("restore: worker restoring", n)
    peak = 0
    samples: list[tuple[float, int]] = []
    with running(cmd, log, env=child_env(settings)) as proc:
        ps = psutil.Process(proc.pid)
        t0 = time.monotonic()
        deadline = t0 + 120 + n / 2000
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited during restore; log {log}:\n{log_tail(log)}")
            rss = ps.memory_info().rss
            peak = max(peak, rss)
            samples.append((round(time.monotonic() - t0, 2), rss >> 20))
            stats = read_stats(stats_file)
            bench.advance(stats.get("restored_records", 0))
            if stats.get("restored_records", 0) >= n and len(stats.get("assigned", [])) == PARTITIONS:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"restore not done after {deadline - t0:.0f}s; log:\n{log_tail(log)}")
            time.sleep(0.05)  # the RSS sampling interval
        held = ps.memory_info().rss
        peak = max(peak, held)
    parts = restored_from_log(log)
    restored = sum(c for c, _s in parts.values())
    seconds = restore_span(log) or 0.0
    rate = restored / seconds if seconds else None
    metrics = [
        Metric("restore", "changelog restore", rate, "entities/s", "bare consume", raw_read["records_per_s"],
               ">= 0.5x", None if rate is None else rate / raw_read["records_per_s"] >= 0.5,
               note=f"{restored:,} entities in {seconds:.2f} s"),
        Metric("restore", "worker peak RSS", peak / 2**20, "MB", target=f"<= {RSS_LIMIT_MB} MB",
               met=peak / 2**20 <= RSS_LIMIT_MB, note=f"holding {n:,} entities: {held / 2**20:.0f} MB"),
    ]
    bench.write_result("restore", metrics, started=started, settings={
        "entities": n, "partitions": PARTITIONS, "rss_sample_interval_s": 0.05,
    }, raw={"bare_consume": raw_read, "restore_by_partition": parts, "restored": restored,
            "restore_seconds": seconds, "peak_rss_mb": peak / 2**20, "rss_after_restore_mb": held / 2**20,
            "rss_samples_mb": samples[:: max(1, len(samples) // 200)]},
       notes=["Restore time: from the first partition's restore start to the last one's end (the "
              "worker's log); the worker restores its partitions at the same time, one thread each "
              "(restore_by_partition: each one's own time), the bare read reads them one after another."])
