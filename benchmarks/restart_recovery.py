"""How long an exactly-once worker's output stands still after its only broker restarts.

    .venv/bin/python -m benchmarks.restart_recovery               # 10 s outage
    .venv/bin/python -m benchmarks.restart_recovery --down 30

A one-broker Kafka of its own, one worker (``python -m services.worker``, exactly-once), a
producer sending one reservation every 100 ms (6 groups), and a read_committed consumer of the
state topic noting when each becomes visible. After ``--warm`` seconds the broker is stopped
(SIGTERM), ``--down`` seconds later started again. Printed: the seconds from the broker's
return until the first record is visible again, and per 5 s of send time the records sent,
seen, and their produce -> visible latency. Every record sent must be seen (exit 1 if not).
benchmarks/README.md, "A broker restart".
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer

from benchmarks.procs import child_env, running, worker_cmd
from fifolane.cluster import LocalCluster
from fifolane.config import PROJECT_ROOT, Settings
from fifolane.partitioner import PARTITIONER
from fifolane.serde import SchemaCatalog, make_codec
from fifolane.topics import ensure_topics

HOME = PROJECT_ROOT / ".fifolane" / "bench-kafka" / "restart"
LIBS = PROJECT_ROOT / ".fifolane" / "kafka" / "libs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warm", type=float, default=40.0, help="seconds before the broker stops")
    ap.add_argument("--down", type=float, default=10.0, help="seconds the broker stays down")
    ap.add_argument("--after", type=float, default=60.0, help="seconds of sending after it is back")
    a = ap.parse_args()
    run = HOME / uuid.uuid4().hex[:8]
    cluster = LocalCluster(run / "kafka", 1, libs=LIBS)
    cluster.up(timeout=180, fresh=True)
    tag = uuid.uuid4().hex[:6]
    topics: dict[str, Any] = {f"{role}_topic": f"restart.{role}.{tag}" for role in
                              ("input", "state", "registry", "dlq", "listener_output", "directory", "parked")}
    s = Settings(bootstrap_servers=cluster.bootstrap_servers, home=run / "home", partitions=3, **topics)
    try:
        ensure_topics(s)
        cmd = worker_cmd(s, "r1", f"restart-{tag}", guarantee="exactly-once")
        with running(cmd, run / "worker.log", env=child_env(s)):
            sent, seen, back = _drive(cluster, s, a.warm, a.down, a.after)
    finally:
        cluster.down(timeout=30)
    firsts = [t for n, t in seen.items() if t > back]
    print(f"broker down {a.down:.0f} s; first record visible {min(firsts) - back:.1f} s after it was back"
          if firsts else "nothing visible after the broker was back")
    start = min(sent.values())
    for b in range(0, int(max(sent.values()) - start) + 1, 5):
        ids = [n for n, t in sent.items() if b <= t - start < b + 5]
        lat = sorted(seen[n] - sent[n] for n in ids if n in seen)
        print(f"{b:4d} s  sent {len(ids):3d}  seen {len(lat):3d}  p50 {lat[len(lat) // 2] if lat else 0:7.3f} s  "
              f"max {lat[-1] if lat else 0:7.3f} s")
    missing = len(sent) - len(seen)
    print(f"log: {run / 'worker.log'}; {len(sent)} sent, {missing} never seen")
    if missing:
        sys.exit(1)
    shutil.rmtree(run / "kafka", ignore_errors=True)


def _drive(cluster: LocalCluster, s: Settings, warm: float, down: float,
           after: float) -> tuple[dict[int, float], dict[int, float], float]:
    catalog = SchemaCatalog.load(s.schemas_dir)
    codec = make_codec(s, catalog)
    sent: dict[int, float] = {}
    seen: dict[int, float] = {}
    stop = threading.Event()

    def consume() -> None:
        c = Consumer(s.kafka_config(**{"group.id": f"restart-{uuid.uuid4().hex[:6]}",
                                       "isolation.level": "read_committed", "auto.offset.reset": "earliest"}))
        c.subscribe([s.state_topic])
        while not stop.is_set():
            m = c.poll(0.2)
            key = m.key() if m is not None and not m.error() else None
            if isinstance(key, bytes) and key.startswith(b"reservation/R"):
                seen.setdefault(int(key[len(b"reservation/R"):]), time.time())
        c.close()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    p = Producer(s.kafka_config(**{"enable.idempotence": True, "acks": "all", "linger.ms": 1,
                                   "partitioner": PARTITIONER}))
    t0, n, phase, back = time.time(), 0, "up", 0.0
    while time.time() - t0 < warm + down + after:
        now = time.time()
        if phase == "up" and now - t0 > warm:
            cluster.kill_broker(0, graceful=True)
            phase = "down"
        elif phase == "down" and now - t0 > warm + down:
            cluster.start_broker(0)
            back, phase = time.time(), "back"
        group = f"F{n % 6}"
        record = {"reservation_id": f"R{n}", "flight_number": group, "customer_id": "c1", "seats": 1,
                  "amount": 100.0, "state": "NEW", "version": 1}
        p.produce(s.input_topic, codec.encode("reservation", record), group.encode())
        sent[n] = time.time()
        n += 1
        p.poll(0)
        time.sleep(0.1)
    p.flush(60)
    deadline = time.time() + 60
    while len(seen) < n and time.time() < deadline:
        time.sleep(0.5)
    stop.set()
    reader.join(5)
    return sent, seen, back


if __name__ == "__main__":
    main()
