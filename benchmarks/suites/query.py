"""Suite ``query``: key reads from the query API under write load, and failover with standbys.

Reads under load (one worker, table handler, exactly-once, ``--query-port``):

1. the worker's maximum write rate: it applies a backlog of N events, no reads;
2. the same backlog again while a closed-loop reader (benchmarks/query_load.py, its own
   process, 32 requests in flight) reads keys: what the reads cost the write rate;
3. events produced at ~50% of the maximum rate while the reader runs: reads/s, p50/p99.

Failover (two workers, a partition holding E entities): SIGKILL the partition's owner and
measure until reads of the partition answer again and until a write made after the kill is
visible, without a standby and with ``--standby-replicas 1``. Both include the group's
failure detection (the worker's session timeout, 10 s); the part after it (restore and
activation) is reported too.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from confluent_kafka import Producer

from benchmarks.events import events, produce_avro
from benchmarks.harness import Bench, Metric
from benchmarks.meters import Brokers, cpu_seconds, find_brokers
from benchmarks.plots import bar_plot, reads_plot
from benchmarks.procs import child_env, log_tail, read_stats, running, worker_cmd
from fifolane.client import StateClient, member_urls
from fifolane.config import PROJECT_ROOT, Settings
from fifolane.partitioner import PARTITIONER, partition_for
from fifolane.query import QueryError
from fifolane.serde import SchemaCatalog, make_codec

__all__ = ["run"]

MURMUR2 = {"partitioner": PARTITIONER}  # the query routing's partitioner (and Java's)
READERS = 32
#: write loads (shares of the maximum write rate) the reads are measured at
LOADS = (0.0, 0.25, 0.5)


def _done(stats: dict[str, Any]) -> int:
    return int(stats.get("processed", 0)) + int(stats.get("superseded", 0)) + int(stats.get("dead_lettered", 0))


def _apply_rate(stats_file: Path, target: int, timeout: float, log: Path) -> float:
    """Events/s while the worker applies a backlog up to ``target`` (10% to 90% of it)."""
    start = _done(read_stats(stats_file))
    t0 = time.monotonic()
    lo, hi = start + (target - start) // 10, start + (target - start) * 9 // 10
    t_lo: float | None = None
    t_hi: float | None = None
    deadline = t0 + timeout
    while t_hi is None:
        done = _done(read_stats(stats_file))
        now = time.monotonic()
        if t_lo is None and done >= lo:
            t_lo, lo = now, done
        if done >= hi:
            t_hi, hi = now, done
        if now > deadline:
            raise TimeoutError(f"the worker applied {done - start:,} of {target - start:,}; log:\n{log_tail(log)}")
        time.sleep(0.05)  # a poll interval
    if t_lo is None or t_hi - t_lo < 0.5:  # too fast to see the middle: the whole backlog
        return (hi - start) / max(t_hi - t0, 1e-6)
    return (hi - lo) / (t_hi - t_lo)


def _reader(url: str, keys_file: Path, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "benchmarks.query_load", url, str(keys_file),
                             "--seconds", str(seconds), "--concurrency", str(READERS)],
                            stdout=subprocess.PIPE, text=True, cwd=PROJECT_ROOT)


def encoded(settings: Settings, evs: Any) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` of each event, encoded ahead of :func:`paced`."""
    codec = make_codec(settings, SchemaCatalog.load(settings.schemas_dir))
    return [(g.encode(), codec.encode("reservation", rec)) for g, _k, _v, rec in evs]


def paced(settings: Settings, records: list[tuple[bytes, bytes]], rate: float, stop: threading.Event) -> None:
    """Produce encoded records at ``rate`` a second. They are encoded before (:func:`encoded`):
    the load generator shares the 2 cores with what it loads, so it does as little as it can
    while it runs (encoding on the way cost ~0.2 cores at 30,000 events/s)."""
    producer = Producer(settings.kafka_config(**{"linger.ms": 5, "enable.idempotence": True}))
    produce, topic = producer.produce, settings.input_topic
    t0 = time.monotonic()
    for i in range(0, len(records), 100):
        if stop.is_set():
            break
        for key, value in records[i:i + 100]:
            produce(topic, value, key)
        producer.poll(0)
        ahead = t0 + (i + 100) / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)  # pacing
    producer.flush(30)


def reads_under_load(bench: Bench) -> tuple[list[Metric], dict[str, Any]]:
    n = bench.size(300_000, 60_000)
    entities = n // 2
    seconds = bench.size(30, 10)
    settings = bench.topic_set("query", 3, librdkafka=MURMUR2)
    wid = "bench-query"
    cmd = worker_cmd(settings, wid, f"bench-{wid}", guarantee="exactly-once") + ["--query-port", "0"]
    log, stats_file = settings.home / f"{wid}.log", settings.home / f"{wid}.stats.json"
    keys_file = settings.home / "keys.json"
    keys_file.parent.mkdir(parents=True, exist_ok=True)
    keys_file.write_text(json.dumps([["reservation", k, g] for g, k, _v, _r in events(entities, entities=entities)]))
    bench.step(f"query: {n:,} events, the worker's max write rate", n)
    produce_avro(settings, events(n, entities=entities), on_progress=bench.advance)
    raw: dict[str, Any] = {}
    with running(cmd, log, env=child_env(settings)) as proc:
        max_rate = _apply_rate(stats_file, n, 120 + n / 1000, log)
        url = member_urls(settings)[0]
        bench.step(f"query: {n:,} more events while {READERS} readers read", n)
        # The next versions of the same entities (a repeat of the first backlog would all be
        # stale), produced beside the measurement: the producer outpaces the worker, and the
        # rate is taken while the worker applies them (measured after a blocking produce, the
        # worker had applied most of them already and the "rate" was nonsense).
        reader = _reader(url, keys_file, 3600)
        backlog = threading.Thread(target=produce_avro, daemon=True, args=(
            settings, itertools.islice(events(2 * n, entities=entities), n, None)),
            kwargs={"on_progress": bench.advance})
        backlog.start()
        loaded_rate = _apply_rate(stats_file, 2 * n, 120 + n / 1000, log)
        backlog.join(120)
        reader.terminate()
        reader.communicate(timeout=30)
        loads = {}
        offset = 2 * n
        for share in LOADS:
            secs = seconds if share == 0.5 else bench.size(10, 5)
            bench.step(f"query: reads for {secs}s while writing at {share:.0%} of {max_rate:,.0f}/s", secs)
            loads[share], offset = _reads_at(settings, url, keys_file, entities, offset, max_rate * share, secs,
                                             proc.pid, stats_file)
    load = loads[0.5]
    raw.update(max_write_rate=max_rate, write_rate_with_reads=loaded_rate, reads=load,
               write_rate_during_reads=load["write_rate"], entities=entities,
               reads_by_write_load={f"{k:.2f}": v for k, v in loads.items()})
    ok = load["statuses"].get("ok", 0) / max(1, load["reads"])
    cpu = ", ".join(f"{k} {v:.2f}" for k, v in load["cpu_cores"].items())
    idle = loads[0.0]
    metrics = [
        Metric("query", "key reads at 50% write load", load["reads_per_s"], "reads/s", target=">= 5,000",
               met=load["reads_per_s"] >= 5000,
               note=f"{READERS} in flight; {ok:.1%} ok; writes {load['write_rate']:,.0f}/s; CPU cores: {cpu}"),
        Metric("query", "read p50", load["p50_ms"], "ms", note="closed loop, keep-alive"),
        Metric("query", "read p99", load["p99_ms"], "ms", target="< 20 ms", met=(load["p99_ms"] or 1e9) < 20),
        Metric("query", "key reads, no writes", idle["reads_per_s"], "reads/s", target=">= 5,000",
               met=idle["reads_per_s"] >= 5000, note=f"p50 {idle['p50_ms']} ms, p99 {idle['p99_ms']} ms"),
        Metric("query", "key reads at 25% write load", loads[0.25]["reads_per_s"], "reads/s",
               note=f"p50 {loads[0.25]['p50_ms']} ms, p99 {loads[0.25]['p99_ms']} ms"),
        Metric("query", "max write rate with reads", loaded_rate, "events/s", "no reads", max_rate,
               note=f"reads cost {1 - loaded_rate / max_rate:.0%} of the write rate"),
    ]
    png = bench.results_dir / "query_reads.png"
    reads_plot(png, {share: (v["reads_per_s"], v["p50_ms"] or 0.0, v["p99_ms"] or 0.0) for share, v in loads.items()},
               max_rate)
    return metrics, raw


def _reads_at(settings: Settings, url: str, keys_file: Path, entities: int, offset: int, rate: float,
              seconds: float, worker_pid: int, stats_file: Path) -> tuple[dict[str, Any], int]:
    """Reads for ``seconds`` while events are produced at ``rate`` (0: none): the reader's
    result, the write rate, and the CPU cores each process used (so a reader of the result
    sees whether the machine had any to spare)."""
    stop = threading.Event()
    count = int(rate * seconds * 1.3) + 1000 if rate else 0
    newer = encoded(settings, itertools.islice(events(offset + count, entities=entities), offset, None))
    writer = threading.Thread(target=paced, args=(settings, newer, rate, stop), daemon=True)
    if rate:
        writer.start()
        time.sleep(1.0)  # the worker at the rate before the reads start
    before = (_done(read_stats(stats_file)), time.monotonic())
    reader = _reader(url, keys_file, seconds)
    roles = {"worker": [worker_pid], "readers": [c.pid for c in psutil.Process(worker_pid).children()],
             "broker": (find_brokers(settings.resolved_bootstrap()) or Brokers([], [])).pids,
             "read load": [reader.pid], "write load": [os.getpid()]}
    time.sleep(min(2.0, seconds / 4))  # the reader's start-up (imports) is not its load
    c0, t0 = {k: cpu_seconds(v) for k, v in roles.items()}, time.monotonic()
    time.sleep(seconds / 2)
    c1, t1 = {k: cpu_seconds(v) for k, v in roles.items()}, time.monotonic()
    out, _ = reader.communicate(timeout=seconds + 60)
    after = (_done(read_stats(stats_file)), time.monotonic())
    stop.set()
    if rate:
        writer.join(60)
    result = json.loads(out)
    result["write_rate"] = (after[0] - before[0]) / (after[1] - before[1])
    result["cpu_cores"] = {k: round((c1[k] - c0[k]) / (t1 - t0), 2) for k in roles}
    return result, offset + count


def _fill_state(settings: Settings, group: str, n: int, partition: int, on_progress: Any) -> None:
    from benchmarks.events import produce_raw

    codec = make_codec(settings, SchemaCatalog.load(settings.schemas_dir))
    items = ((f"reservation/R{i}".encode(),
              codec.encode("reservation", {"reservation_id": f"R{i}", "flight_number": group, "customer_id": "c",
                                           "seats": 1, "amount": 1.0, "state": "NEW", "version": 1}),
              (partition, None)) for i in range(n))
    produce_raw(settings, settings.state_topic, items, on_progress)


def failover(bench: Bench, standbys: int, n: int) -> dict[str, Any]:
    settings = bench.topic_set(f"failover{standbys}", 2, librdkafka=MURMUR2)
    group = next(f"G{i}" for i in range(100) if partition_for(f"G{i}".encode(), 2) == 0)
    bench.step(f"failover ({standbys} standby): {n:,} entities in partition 0", n)
    _fill_state(settings, group, n, 0, bench.advance)
    ids = [f"fo{standbys}-a", f"fo{standbys}-b"]
    cmds = {w: worker_cmd(settings, w, f"bench-fo{standbys}", guarantee="exactly-once")
            + ["--query-port", "0", "--standby-replicas", str(standbys)] for w in ids}
    env = child_env(settings)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    with running(cmds[ids[0]], settings.home / f"{ids[0]}.log", env=env) as pa, \
            running(cmds[ids[1]], settings.home / f"{ids[1]}.log", env=env) as pb:
        procs = {ids[0]: pa, ids[1]: pb}
        deadline = time.monotonic() + 300 + n / 2000
        bench.step(f"failover ({standbys} standby): restore and standby catch-up", None)
        client = None
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError("the partition was not served (and followed) in time")
            urls = member_urls(settings)
            if len(urls) == 2:
                client = client or StateClient(urls, timeout=2, monotonic=False)
                try:
                    if client.get("reservation", f"R{n - 1}", group=group) is not None and _followed(
                            client, standbys):
                        break
                except QueryError:
                    pass
            time.sleep(0.2)  # a poll interval
        assert client is not None
        owner = client.routing(refresh=True)["partitions"]["0"]["owner"]
        writes: list[tuple[int, float]] = []
        stop = threading.Event()
        writer = threading.Thread(target=_write_probe, args=(settings, group, writes, stop), daemon=True)
        writer.start()
        time.sleep(1.0)  # writes flowing before the kill
        t_kill, kill_wall = time.monotonic(), time.time()
        procs[owner].kill()
        read_back = write_back = None
        probe = StateClient(member_urls(settings), timeout=1, monotonic=False)
        while time.monotonic() - t_kill < 300 and (read_back is None or write_back is None):
            try:
                e = probe.get("reservation", "W", group=group)
            except QueryError:
                e = None
            now = time.monotonic()
            if e is not None and read_back is None and now > t_kill + 0.05:
                read_back = now - t_kill
            if e is not None and write_back is None:
                after = [v for v, t in writes if t > t_kill]
                if after and e.version >= after[0]:
                    write_back = now - t_kill
            time.sleep(0.01)  # probe interval
        stop.set()
        writer.join(10)
        survivor = next(w for w in ids if w != owner)
        text = (settings.home / f"{survivor}.log").read_text(errors="replace")
    assigned = _assigned_at(text, settings.input_topic, kill_wall)
    unavailable = None if read_back is None or write_back is None else max(read_back, write_back)
    return {"standbys": standbys, "entities": n, "reads_resume_s": read_back, "writes_resume_s": write_back,
            "unavailable_s": unavailable,
            # failure detection: SIGKILL -> the survivor is assigned the partition (the group's
            # session timeout and rebalance); the rest is restore and activation
            "detected_s": None if assigned is None else assigned - kill_wall,
            "after_detection_s": None if assigned is None or unavailable is None
            else unavailable - (assigned - kill_wall),
            "takeover_restore_lines": [line for line in text.splitlines()
                                       if f"{settings.state_topic}[0]" in line and "restored" in line][-3:]}


def _assigned_at(log: str, topic: str, after: float) -> float | None:
    """Wall-clock time of the survivor's first assignment of input partition 0 after ``after``."""
    for m in re.finditer(rf"^(\S+ \S+),(\d+) INFO \S+: assigned {re.escape(topic)} partitions \[([\d, ]+)\]",
                         log, re.M):
        at = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
        if at >= after - 1 and "0" in [x.strip() for x in m.group(3).split(",")]:
            return at
    return None


def _followed(client: StateClient, standbys: int) -> bool:
    """With standbys: every standby of partition 0 has caught up with its owner."""
    if not standbys:
        return True
    r = client.routing(refresh=True)["partitions"].get("0", {})
    owner_url = r.get("url")
    if not owner_url or not r.get("standbys"):
        return False
    active = httpx.get(f"{owner_url}/v1/partitions", timeout=5).json()["active"].get("0", {}).get("position")
    for s in r["standbys"]:
        got = httpx.get(f"{s['url']}/v1/partitions", timeout=5).json()["standbys"].get("0", {})
        if active is None or got.get("position") != active:
            return False
    return True


def _write_probe(settings: Settings, group: str, writes: list[tuple[int, float]], stop: threading.Event) -> None:
    codec = make_codec(settings, SchemaCatalog.load(settings.schemas_dir))
    producer = Producer(settings.kafka_config(**{"linger.ms": 0}))
    v = 0
    while not stop.is_set():
        v += 1
        producer.produce(settings.input_topic, codec.encode("reservation", {
            "reservation_id": "W", "flight_number": group, "customer_id": "c", "seats": 1, "amount": 1.0,
            "state": "NEW", "version": v}), group.encode())
        producer.flush(5)
        writes.append((v, time.monotonic()))
        stop.wait(0.05)


def run(bench: Bench) -> None:
    started = time.monotonic()
    load_before = os.getloadavg()
    metrics, raw = reads_under_load(bench)
    n = bench.size(1_000_000, 50_000)
    runs = [failover(bench, 0, n), failover(bench, 1, n)]
    raw["failover"] = runs
    raw["load_average"] = {"start": load_before, "end": os.getloadavg()}
    cold, warm = runs[0]["unavailable_s"], runs[1]["unavailable_s"]
    ratio = cold / warm if cold and warm else None
    metrics.append(Metric("query", f"failover, {n:,} entities, 1 standby", warm, "s unavailable",
                          "no standby", cold, ">= 10x shorter", None if ratio is None else ratio >= 10,
                          note=f"{ratio:.1f}x; both include failure detection "
                               f"({runs[0]['detected_s'] or 0:.1f} s / {runs[1]['detected_s'] or 0:.1f} s)"
                          if ratio else ""))
    cold_a, warm_a = runs[0]["after_detection_s"], runs[1]["after_detection_s"]
    if cold_a is not None and warm_a is not None:
        metrics.append(Metric("query", "failover after detection (restore + activation), 1 standby", warm_a,
                              "s", "no standby", cold_a, ">= 10x shorter", cold_a / max(warm_a, 1e-3) >= 10))
    png = bench.results_dir / "query_failover.png"
    bar_plot(png, f"Unavailability after SIGKILL ({n:,} entities)",
             {"no standby": cold or 0.0, "1 standby": warm or 0.0}, "seconds")
    bench.write_result("query", metrics, started=started, settings={
        "events": bench.size(300_000, 60_000), "readers_in_flight": READERS, "failover_entities": n,
    }, raw=raw, notes=[
        "Reads and writes share one worker process; the reader runs in its own process on the same machine.",
        "Failover: time from SIGKILL until a read of the partition answers and until a write made after "
        "the kill is visible; the larger is the unavailability.",
    ])
