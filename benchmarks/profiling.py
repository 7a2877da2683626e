"""cProfile of a fifolane worker draining pre-produced events (``python -m benchmarks profile``).

The worker runs as ``python -m cProfile -o <file> -m services.worker ...``; it is stopped
with SIGTERM once every event is committed, which makes cProfile write its file. The poll
thread (where the built-in table handler runs inline) is the one profiled.
"""

from __future__ import annotations

import io
import pstats
import sys
import uuid

from benchmarks.events import events, produce_avro
from benchmarks.harness import Bench
from benchmarks.procs import child_env, running, watch_committed, worker_cmd

__all__ = ["profile_worker"]


def profile_worker(n: int, guarantee: str, top: int) -> int:
    """Profile one worker over ``n`` events; print the top functions by own time."""
    with Bench(quick=True) as bench:
        settings = bench.topic_set("profile", 6)
        bench.step(f"profile: pre-producing {n:,} events", n)
        produce_avro(settings, events(n), on_progress=bench.advance)
        wid = f"bench-prof-{uuid.uuid4().hex[:6]}"
        out = bench.results_dir / "raw" / f"worker-{guarantee}.prof"
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = worker_cmd(settings, wid, f"bench-{wid}", guarantee=guarantee,
                         python=[sys.executable, "-m", "cProfile", "-o", str(out)])
        bench.step(f"profile: worker {guarantee}", n)
        with running(cmd, settings.home / f"{wid}.log", env=child_env(settings)) as proc:
            commits = watch_committed(bench.bootstrap, f"bench-{wid}", settings.input_topic, 6, n,
                                      timeout=600, alive=lambda: proc.poll() is None,
                                      on_progress=bench.advance)
    buf = io.StringIO()
    stats = pstats.Stats(str(out), stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats("services/worker", top)
    print(buf.getvalue())
    print(f"{commits.rate:,.0f} events/s under the profiler; profile in {out}")
    return 0
