"""``fifolane demo``: the whole pipeline on a local Apache Kafka, checked end to end.

Steps: Kafka (started if none is running, stopped again), topics, two flights workers,
two listeners (registered through the CLI's code path), a generated booking stream with
stale updates, cancellations and malformed records, a SIGKILL of one worker midway and its
restart, then the Spark views and a summary that checks itself against the input.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fifolane.config import PROJECT_ROOT, Settings
from fifolane.demo.check import check_results
from fifolane.demo.stream import generate, malformed
from fifolane.errors import FifolaneError

__all__ = ["DemoOptions", "run_demo"]

APP = "examples.flights:app"
GROUP_PREFIX = "fifolane-flights-demo"
_QUIET = {"log_level": 3}  # librdkafka: errors only (retries while Kafka starts are expected)


@dataclass(frozen=True)
class DemoOptions:
    events: int = 200_000
    flights: int = 300
    workers: int = 2
    spark: bool = True
    kill: bool = True
    seed: int = 42


@contextlib.contextmanager
def _kafka(settings: Settings, console: Console) -> Iterator[Settings]:
    """The configured Kafka, the running local one, or a local one started (and stopped) here."""
    if settings.bootstrap_servers:
        console.print(f"Kafka: using the configured cluster at [bold]{settings.bootstrap_servers}[/]")
        yield settings
        return
    from fifolane.cluster.local import LocalCluster

    cluster = LocalCluster(settings.home, 1, preferred_port=9092)
    status = cluster.status()
    if status.running and status.bootstrap_servers:
        console.print(f"Kafka: using the running local cluster at [bold]{status.bootstrap_servers}[/]")
        yield settings.with_overrides(bootstrap_servers=status.bootstrap_servers)
        return
    with console.status("Kafka: starting a local Apache Kafka 4.1 (KRaft) from its Maven jars ..."):
        status = cluster.up()
    console.print(f"Kafka: started at [bold]{status.bootstrap_servers}[/] (stopped again at the end)")
    try:
        yield settings.with_overrides(bootstrap_servers=status.bootstrap_servers)
    finally:
        cluster.down()
        console.print("Kafka: the local cluster this demo started is stopped")


def _die_with_parent() -> None:
    """Linux: the workers get SIGKILL if the demo itself dies, so none is left behind."""
    import ctypes
    import signal

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class _WorkerProc:
    def __init__(self, settings: Settings, worker_id: str, run_dir: Path, group_id: str) -> None:
        self.worker_id = worker_id
        self.log = run_dir / "logs" / f"{worker_id}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.stats_file = run_dir / f"{worker_id}.stats.json"
        self.args = [sys.executable, "-m", "services.worker", "--app", APP, "--worker-id", worker_id,
                     "--group-id", group_id, "--concurrency", "32",
                     "--state-dir", str(run_dir / "state" / worker_id),
                     "--stats-file", str(self.stats_file)]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
        self.env.update(_settings_env(settings))
        self.env["PYTHONPATH"] = str(PROJECT_ROOT) + os.pathsep + self.env.get("PYTHONPATH", "")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         cwd=PROJECT_ROOT, preexec_fn=_die_with_parent)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(30)

    def listeners_settled(self, listeners: int) -> bool:
        """Restored, every listener active and no current-state snapshot still to send (a
        worker restarted late in the stream announces its partitions' state only now)."""
        try:
            s = json.loads(self.stats_file.read_text())
        except (OSError, ValueError):
            return False
        sink = s.get("sink") or {}
        return (bool(s.get("assigned")) and not s.get("restoring")  # (assigned: once restored)
                and sink.get("listeners_active", 0) >= listeners and sink.get("listener_snapshots_pending") == 0)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def _settings_env(s: Settings) -> dict[str, str]:
    return {
        "FIFOLANE_BOOTSTRAP_SERVERS": s.resolved_bootstrap(), "FIFOLANE_INPUT_TOPIC": s.input_topic,
        "FIFOLANE_STATE_TOPIC": s.state_topic, "FIFOLANE_REGISTRY_TOPIC": s.registry_topic,
        "FIFOLANE_DLQ_TOPIC": s.dlq_topic, "FIFOLANE_LISTENER_OUTPUT_TOPIC": s.listener_output_topic,
        "FIFOLANE_DIRECTORY_TOPIC": s.directory_topic, "FIFOLANE_PARKED_TOPIC": s.parked_topic,
        "FIFOLANE_HOME": str(s.home), "FIFOLANE_PARTITIONS": str(s.partitions),
    }


def _committed_fraction(settings: Settings, consumer: Consumer) -> tuple[int, int]:
    """(committed offsets, end offsets) of the workers' group over the input topic."""
    parts = [TopicPartition(settings.input_topic, p) for p in range(settings.partitions)]
    try:
        committed = consumer.committed(parts, timeout=10)
    except KafkaException:  # the group coordinator is still loading: nothing committed yet
        return 0, 0
    done = sum(max(tp.offset, 0) for tp in committed)
    end = sum(consumer.get_watermark_offsets(tp, timeout=10)[1] for tp in parts)
    return done, end


def _register_listeners(settings: Settings, console: Console, include_current: bool) -> list[str]:
    try:
        from listeners.model import ListenerSpec
        from listeners.registry import register
    except ImportError:
        console.print("[yellow]listeners: the listener registry is not available in this build[/]")
        return []
    if include_current:
        spec = ListenerSpec(
            name="overbooked-flights", type="flight_load", include_current_state=True,
            filter="value.rejected_seats > 0",
            convert='{"flight": value.flight_number, "sold": value.seats_sold, '
                    '"capacity": value.capacity, "rejected": value.rejected_seats}')
    else:
        spec = ListenerSpec(
            name="high-value", type="reservation",
            filter='value.amount >= 3000.0 && value.state == "CONFIRMED"',
            convert='{"id": value.reservation_id, "flight": value.flight_number, "amount": value.amount}')
    register(settings, spec, replace=True)
    console.print(f"listeners: registered [bold]{spec.name}[/] (filter: {spec.filter})"
                  + (" with include-current-state" if spec.include_current_state else ""))
    return [spec.name]


def run_demo(base: Settings, opts: DemoOptions, console: Console | None = None) -> bool:
    """Run the demo; True when every self-check passed."""
    console = console or Console()
    t_start = time.monotonic()
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:4]
    run_dir = base.home / "demo" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"demo.{run_id}"
    settings = base.with_overrides(
        input_topic=f"{prefix}.events", state_topic=f"{prefix}.state", registry_topic=f"{prefix}.listeners",
        dlq_topic=f"{prefix}.dlq", listener_output_topic=f"{prefix}.notifications",
        directory_topic=f"{prefix}.directory", parked_topic=f"{prefix}.parked")
    console.rule("[bold]fifolane demo: flight bookings, FIFO per flight")
    with _kafka(settings, console) as settings:
        from fifolane.topics import ensure_topics

        ensure_topics(settings)
        console.print(f"topics: {settings.input_topic} (+ state, registry, dlq, notifications), "
                      f"{settings.partitions} partitions")
        stream = generate(opts.flights, opts.events, opts.seed)
        group_id = f"{GROUP_PREFIX}-{run_id}"  # each run its own group (and static members)
        workers = [_WorkerProc(settings, f"demo-w{i + 1}", run_dir, group_id) for i in range(opts.workers)]
        for w in workers:
            w.start()
        console.print(f"workers: started {', '.join(w.worker_id for w in workers)} with {APP} "
                      f"(logs in {run_dir / 'logs'})")
        names = _register_listeners(settings, console, include_current=False)
        try:
            result = _stream_and_wait(settings, stream, workers, console, opts, names, group_id)
        finally:
            for w in workers:
                w.stop()
        console.print("workers: stopped")
        views = None
        if opts.spark:
            views = _spark(settings, run_dir, console)
        ok = check_results(settings, stream, result, views, console, run_dir, names)
    console.print(f"finished in {time.monotonic() - t_start:.0f}s; run folder: {run_dir}")
    return ok


def _stream_and_wait(settings: Settings, stream: Any, workers: list[_WorkerProc], console: Console,
                     opts: DemoOptions, names: list[str], group_id: str) -> dict[str, Any]:
    from fifolane.produce import EventProducer

    events = stream.events
    settled = _Settled(workers)
    produced = 0
    errors: list[BaseException] = []

    def produce() -> None:
        nonlocal produced
        try:
            with EventProducer(settings, source=f"demo-{os.getpid()}", producer_config=_QUIET) as p:
                for type_name, record, op in events:
                    p.send(type_name, record, op)
                    produced += 1
                valid = p.codec.encode("reservation", stream.reservations[0][1])
                for key, value, _reason in malformed(valid):
                    p.send_raw(key, value)
                    produced += 1
                if p.flush():
                    raise FifolaneError(f"{len(p.delivery_errors)} events were not delivered")
        except BaseException as exc:  # reported on the main thread
            errors.append(exc)

    total = len(events) + len(malformed(b"x" * 20))
    producer_thread = threading.Thread(target=produce, name="demo-producer", daemon=True)
    producer_thread.start()
    probe = Consumer(settings.kafka_config(**{"group.id": group_id, "enable.auto.commit": False, **_QUIET}))
    killed = False
    overbooked_registered = False
    t0 = time.monotonic()
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=console, transient=False) as progress:
            p_task = progress.add_task("produced events ", total=total)
            c_task = progress.add_task("processed (committed)", total=total)
            while True:
                if errors:
                    raise errors[0]
                done, _end = _committed_fraction(settings, probe)
                progress.update(p_task, completed=produced)
                progress.update(c_task, completed=done)
                if not overbooked_registered and done >= total * 0.3:
                    names += _register_listeners(settings, console, include_current=True)
                    overbooked_registered = True
                if opts.kill and not killed and done >= total * 0.5 and len(workers) > 1:
                    victim = workers[-1]
                    progress.console.print(f"[bold red]killing worker {victim.worker_id} with SIGKILL "
                                           f"at {done} committed events; restarting it[/]")
                    victim.kill()
                    victim.start()
                    killed = True
                if produced >= total and done >= total and settled(progress, len(names)):
                    break
                if time.monotonic() - t0 > 600:
                    raise FifolaneError(f"the workers did not finish: {done}/{total} committed after 600s; "
                                        f"see the logs in {workers[0].log.parent}")
                time.sleep(0.5)  # progress refresh: poll interval of a CLI loop, not a test
    finally:
        probe.close()
    took = time.monotonic() - t0
    console.print(f"pipeline: {total} events produced and committed in {took:.1f}s "
                  f"({total / took:,.0f} events/s end to end, worker killed midway: {killed})")
    return {"total": total, "seconds": took, "killed": killed}


class _Settled:
    """Whether every worker's listeners have settled, twice 1 s apart (the last snapshot chunk
    commits after it is sent); after 60 s the demo goes on and its check tells what is missing."""

    def __init__(self, workers: list[_WorkerProc]) -> None:
        self.workers = workers
        self.asked: float | None = None  # first asked
        self.since: float | None = None  # settled since

    def __call__(self, progress: Any, listeners: int) -> bool:
        now = time.monotonic()
        if self.asked is None:
            self.asked = now
            progress.console.print("waiting for the listeners' current-state snapshots ...")
        if now - self.asked > 60:
            return True
        if not all(w.listeners_settled(listeners) for w in self.workers):
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= 1.0


def _spark(settings: Settings, run_dir: Path, console: Console) -> dict[str, Any] | None:
    try:
        from spark.job import build_views
        from spark.session import get_session
    except ImportError as exc:
        console.print(f"[yellow]spark: not available ({exc}); install the 'spark' extra[/]")
        return None
    from fifolane.serde import SchemaCatalog

    out = run_dir / "views"
    t0 = time.monotonic()
    with console.status("spark: starting a local session (first run downloads the Kafka connector) ..."):
        spark = get_session(home=settings.home)

    @contextlib.contextmanager
    def step(text: str) -> Iterator[None]:
        with console.status(f"spark: {text} ..."):
            yield

    try:
        report = build_views(spark, settings, SchemaCatalog.load(settings.schemas_dir), out, step=step)
        top = (spark.read.parquet(str(out / "reservations"))
               .filter("state = 'CONFIRMED'")
               .groupBy("flight_number").sum("amount")
               .withColumnRenamed("sum(amount)", "revenue")
               .orderBy("revenue", ascending=False).limit(5).collect())
        seats = {r["flight_number"]: r.asDict() for r in spark.read.parquet(str(out / "seats_per_flight")).collect()}
    finally:
        spark.stop()
    console.print(f"spark: views written to {out} in {time.monotonic() - t0:.1f}s")
    return {"out": out, "report": report, "top": [(r["flight_number"], r["revenue"]) for r in top],
            "seats": seats}

