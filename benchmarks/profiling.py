"""Where a fifolane worker's time goes (``python -m benchmarks profile``).

- cProfile (default): the worker runs as ``python -m cProfile -o <file> -m services.worker``
  and is stopped with SIGTERM once every event is committed, which makes cProfile write its
  file. Only the main thread is profiled: the poll thread, where the built-in table handler
  and inline app handlers run. Exact call counts, but its per-call overhead inflates small
  functions.
- py-spy (``--py-spy``, :func:`spy_worker`): a sampler attached to the running worker from
  its first commit to its last (start-up and restore left out), at low overhead; the app
  suite uses it. Raw stacks in ``benchmarks/results/raw/``.
"""

from __future__ import annotations

import io
import pstats
import shutil
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.events import events, produce_avro
from benchmarks.harness import COMMIT_INTERVAL, Bench
from benchmarks.procs import child_env, running, watch_committed, worker_cmd
from fifolane.config import Settings

__all__ = ["PROFILE_RATE", "profile_worker", "spy_worker", "summarize_raw_profile"]

#: py-spy samples per second.
PROFILE_RATE = 200


def profile_worker(n: int, guarantee: str, top: int, *, app: str | None = None, spy: bool = False) -> int:
    """Profile one worker over ``n`` events (table handler, or ``app``); print the top functions."""
    with Bench(quick=True) as bench:
        settings = bench.topic_set("profile", 6)
        bench.step(f"profile: pre-producing {n:,} events", n)
        produce_avro(settings, events(n), on_progress=bench.advance)
        name = f"worker-{guarantee}{'-' + app.split(':')[0].rsplit('.', 1)[-1] if app else ''}"
        if spy:
            out = bench.results_dir / "raw" / f"{name}.pyspy.txt"
            result = spy_worker(bench, settings, n, guarantee, app=app, out=out)
        else:
            out = bench.results_dir / "raw" / f"{name}.prof"
            out.parent.mkdir(parents=True, exist_ok=True)
            wid = f"bench-prof-{uuid.uuid4().hex[:6]}"
            cmd = worker_cmd(settings, wid, f"bench-{wid}", guarantee=guarantee, app=app,
                             commit_interval=COMMIT_INTERVAL,
                             python=[sys.executable, "-m", "cProfile", "-o", str(out)])
            bench.step(f"profile: worker {guarantee}", n)
            with running(cmd, settings.home / f"{wid}.log", env=child_env(settings)) as proc:
                commits = watch_committed(bench.bootstrap, f"bench-{wid}", settings.input_topic, 6, n,
                                          timeout=600, alive=lambda: proc.poll() is None,
                                          on_progress=bench.advance)
    if spy:
        if "error" in result:
            print(f"py-spy failed: {result['error']} {result.get('py_spy_stderr', '')}")
            return 1
        print(f"{result['thread']}: {result['samples']} samples at {PROFILE_RATE}/s over "
              f"{result['drain_seconds']:.1f} s")
        for title, key in (("own", "own_pct"), ("total (own + callees)", "total_pct")):
            print(f"\n% of samples, {title}:")
            for frame, pct in result[key][:top]:
                print(f"{pct:6.1f}  {frame}")
        print(f"\n{result['rate_under_profiler']:,.0f} events/s under py-spy; raw stacks in {out}")
        return 0
    buf = io.StringIO()
    stats = pstats.Stats(str(out), stream=buf)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats("services/worker", top)
    print(buf.getvalue())
    print(f"{commits.rate:,.0f} events/s under the profiler; profile in {out}")
    return 0


def spy_worker(bench: Bench, base: Settings, n: int, guarantee: str, *, app: str | None,
               out: Path) -> dict[str, Any]:
    """One fifolane run over ``base``'s ``n`` events with py-spy attached from the first
    commit to the last: top frames of the poll thread by own and total samples (py-spy
    leaves out samples where a thread waits, e.g. in a consumer poll). Raw stacks to ``out``."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return {"error": "py-spy not installed (pip install -e '.[bench]')"}
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = bench.run_on(base, "profile")
    wid = f"bench-prof-{uuid.uuid4().hex[:6]}"
    group = f"bench-fifolane-{wid}"
    cmd = worker_cmd(settings, wid, group, guarantee=guarantee, commit_interval=COMMIT_INTERVAL, app=app)
    log = settings.home / f"{wid}.log"
    bench.step(f"profile: fifolane {guarantee} under py-spy", n)
    sampler: subprocess.Popen[bytes] | None = None
    with running(cmd, log, env=child_env(settings)) as proc:
        def attach(done: int) -> None:  # at the first commit: start-up and restore left out
            nonlocal sampler
            bench.advance(done)
            if done > 0 and sampler is None:
                sampler = subprocess.Popen(
                    [spy, "record", "--pid", str(proc.pid), "--rate", str(PROFILE_RATE), "--function",
                     "--format", "raw", "--threads", "--nonblocking", "-o", str(out)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        try:
            commits = watch_committed(bench.bootstrap, group, settings.input_topic, settings.partitions, n,
                                      timeout=120 + n / 500, alive=lambda: proc.poll() is None,
                                      on_progress=attach)
        finally:
            err = b""
            if sampler is not None:
                sampler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
                try:
                    _out, err = sampler.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    sampler.kill()
                    _out, err = sampler.communicate()
    summary = summarize_raw_profile(out)
    if "error" in summary:
        summary["py_spy_stderr"] = (err or b"").decode(errors="replace")[-1000:]
    seconds = commits.end - commits.first[0]
    return {"rate_under_profiler": commits.rate, "drain_seconds": seconds, "file": str(out),
            "sample_rate": PROFILE_RATE, **summary}


def summarize_raw_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Own and total sample shares per frame of py-spy's ``raw`` (collapsed stacks) output,
    for the worker's poll thread (the thread with the most samples)."""
    if not path.exists():
        return {"error": f"no profile written to {path}"}
    threads: Counter[str] = Counter()
    stacks: list[tuple[str, list[str], int]] = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith("thread ") else "thread"
        frames = frames[1:] if frames[0].startswith(("thread ", "process ")) else frames
        while frames and frames[0].startswith(("thread ", "process ")):
            frames = frames[1:]
        threads[thread] += int(count)
        stacks.append((thread, frames, int(count)))
    if not threads:
        return {"error": "empty profile"}
    main = threads.most_common(1)[0][0]
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for name, frames, n in stacks:
        if name != main or not frames:
            continue
        samples += n
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    share = lambda c: round(100 * c / samples, 1)  # noqa: E731
    return {"thread": main, "samples": samples,
            "own_pct": [(f, share(c)) for f, c in own.most_common(top)],
            "total_pct": [(f, share(c)) for f, c in total.most_common(top)]}


