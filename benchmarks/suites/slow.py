"""Suite ``slow``: handlers sleeping 0-5 ms, fifolane at concurrency 1/16/100 vs a serial loop.

The Parallel Consumer README's setup: 1 partition, 1,000 groups (keys), 10,000 events. The
baseline is the partition-serial consumer (one loop, sleep per event). Every event sleeps a
delay derived from its bytes, so all systems sleep exactly the same total.

Timing is a warm start: each system first joins the group on its own empty input topic;
then the pre-encoded events are produced in one burst, and the time runs from the first
produce to the offset commit covering the last event (start-up excluded entirely).
"""

from __future__ import annotations

import sys
import time
import uuid
from typing import Any

from benchmarks.events import events, sleep_for
from benchmarks.harness import COMMIT_INTERVAL, Bench, Metric
from benchmarks.plots import slow_plot
from benchmarks.procs import child_env, worker_cmd
from benchmarks.warm import timed_burst
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.topics import create_topic

__all__ = ["PC_README", "run"]

#: The Parallel Consumer README's table (10,000 events, 0-5 ms handlers, 1 partition).
PC_README = {"PARTITION (serial)": 22.2, "KEY, 1k keys": 2.06}
CONCURRENCY = (1, 16, 100)
#: Bursts per concurrency above 1 (the median is reported). One burst at concurrency 100
#: lasts ~0.6 s, and single bursts on a warm broker gave 42.1x, 47.5x and 34.4x in a row.
ROUNDS = 5


def run(bench: Bench) -> None:
    """The serial baseline, then fifolane (exactly-once) at each concurrency."""
    started = time.monotonic()
    n = bench.size(10_000, 2_000)
    groups = 1000
    proto = bench.settings("slow", 1)
    codec = make_codec(proto, SchemaCatalog.load(proto.schemas_dir))
    values = [(g.encode(), codec.encode("reservation", rec)) for g, _k, _v, rec in
              events(n, groups=groups, entities=n)]
    sleep_total = sum(sleep_for(v) for _k, v in values)
    raw: dict[str, Any] = {"sleep_total_s": sleep_total}
    notes = ["Warm start: each system joined its group on an empty topic before the events were "
             "produced; time = first produce -> commit covering the last event.",
             f"Handler sleep per event is deterministic: {sleep_total:.2f} s in total."]

    s = bench.topic_set("slow-serial", 1)
    out = f"{s.input_topic}.out"
    create_topic(s, out, 1)
    group = f"bench-serial-{uuid.uuid4().hex[:6]}"
    cmd = [sys.executable, "-m", "benchmarks.passthrough", "serial", "--bootstrap", bench.bootstrap,
           "--input", s.input_topic, "--output", out, "--group", group,
           "--commit-interval", str(COMMIT_INTERVAL)]
    raw["serial"] = timed_burst(bench, s, cmd, group, values, None, "partition-serial loop", "slow")

    rounds = bench.size(ROUNDS, 1)
    notes.append(f"Concurrency {', '.join(str(c) for c in CONCURRENCY if c > 1)}: the median of {rounds} bursts, "
                 "each on a fresh topic and a fresh worker (every burst in raw); the serial loop and "
                 "concurrency 1 run once (about 27 s each, bound by the sleeps).")
    for c in CONCURRENCY:
        runs: list[dict[str, Any]] = []
        for r in range(rounds if c > 1 else 1):
            s = bench.topic_set(f"slow-c{c}", 1)
            wid = f"bench-slow-{c}-{uuid.uuid4().hex[:6]}"
            group = f"bench-{wid}"
            cmd = worker_cmd(s, wid, group, guarantee="exactly-once", concurrency=c,
                             commit_interval=COMMIT_INTERVAL, app="benchmarks.slow_app:app")
            try:
                runs.append(timed_burst(bench, s, cmd, group, values, child_env(s),
                                        f"fifolane concurrency {c} (burst {r + 1})", "slow"))
            except RuntimeError as exc:  # record it and go on with the other concurrencies
                raw[f"fifolane_c{c}"] = {"error": str(exc)[-3000:]}
                notes.append(f"concurrency {c}: failed: {str(exc).splitlines()[0]}")
                break
        else:
            seconds = sorted(x["seconds"] for x in runs)
            raw[f"fifolane_c{c}"] = {"seconds": seconds[len(seconds) // 2], "events": n,
                                     "bursts_s": [x["seconds"] for x in runs]}

    serial = raw["serial"]["seconds"]
    metrics = []
    for c in CONCURRENCY:
        t = raw[f"fifolane_c{c}"].get("seconds")
        if t is None:
            metrics.append(Metric("slow", f"fifolane concurrency {c} speed-up", None, "x serial",
                                  "partition-serial loop", 1.0, ">= 40x" if c == 100 else "",
                                  False if c == 100 else None, note="failed, see notes"))
            continue
        target = ">= 40x" if c == 100 else ""
        bursts = raw[f"fifolane_c{c}"]["bursts_s"]
        spread = (f"; median of {len(bursts)} bursts, {serial / max(bursts):.1f}x-{serial / min(bursts):.1f}x"
                  if len(bursts) > 1 else "")
        metrics.append(Metric("slow", f"fifolane concurrency {c} speed-up", serial / t, "x serial",
                              "partition-serial loop", 1.0, target, serial / t >= 40 if c == 100 else None,
                              note=f"{t:.2f} s vs serial {serial:.2f} s{spread}"))
    done = {c: raw[f"fifolane_c{c}"]["seconds"] for c in CONCURRENCY if "seconds" in raw[f"fifolane_c{c}"]}
    if done:
        slow_plot(bench.results_dir / "slow.png", done, serial, PC_README, sleep_total)
    bench.write_result("slow", metrics, started=started, raw=raw, settings={
        "events": n, "groups": groups, "partitions": 1, "handler_sleep_ms": "0-5 (uniform, per event)",
        "guarantee": "exactly-once", "commit_interval_s": COMMIT_INTERVAL, "concurrency": list(CONCURRENCY),
        "parallel_consumer_readme_s": PC_README,
    }, notes=notes)
