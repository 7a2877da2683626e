"""``fifolane worker``: run a FIFO-group worker (also ``python -m services.worker``)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

import click

__all__ = ["script", "worker"]

#: how long the worker waits for Kafka at start-up (as long as its own clients' check)
_KAFKA_WAIT_S = 30.0


@click.command()
@click.option("--app", "app_spec", default=None, metavar="MODULE:ATTR",
              help="The application (a services.worker.App); default: the built-in table handler.")
@click.option("--concurrency", default=16, show_default=True, type=click.IntRange(min=1),
              help="Groups handled at once (beyond the partition count).")
@click.option("--worker-id", default=None, help="Stable id of this worker (default: host-pid).")
@click.option("--group-id", default=None, help="Consumer group (default: fifolane-<app name>).")
@click.option("--guarantee", type=click.Choice(["exactly-once", "at-least-once"]),
              default="exactly-once", show_default=True)
@click.option("--commit-interval", default=0.25, show_default=True, type=float,
              help="Seconds between checkpoints (transactions).")
@click.option("--retries", default=3, show_default=True, type=click.IntRange(min=0),
              help="Handler retries before an event is dead-lettered.")
@click.option("--on-failure", type=click.Choice(["skip", "park"]), default="skip", show_default=True,
              help="After the retries: skip (dead-letter the event, the group goes on) or park "
                   "(hold the group's events until `fifolane groups release`).")
@click.option("--state-dir", type=click.Path(path_type=Path), default=None,
              help="RocksDB directory (default: <home>/state/<worker-id>).")
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics on this port.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="Address the metrics endpoint binds to (0.0.0.0: every interface).")
@click.option("--stats-file", type=click.Path(path_type=Path), default=None,
              help="Write a JSON snapshot of the counters here (twice a second).")
@click.option("--listeners/--no-listeners", default=True, show_default=True,
              help="Evaluate registered cluster listeners.")
@click.option("--directory/--no-directory", default=True, show_default=True,
              help="Keep the entity directory, so an entity that changes group leaves its old "
                   "group (README, 'Group changes'). --no-directory saves its cost (about a "
                   "quarter of the table handler's throughput) where entities never change group.")
@click.option("--query-port", type=click.IntRange(min=0), default=None,
              help="Serve the query API (docs/formats.md, 'Query API') on this port (0: any free one).")
@click.option("--query-host", default="127.0.0.1", show_default=True,
              help="Address the query endpoint binds to (0.0.0.0: every interface).")
@click.option("--query-advertise", default=None, metavar="HOST",
              help="Host name clients reach the endpoint at (default: the bind address; this host's "
                   "name when it binds every interface).")
@click.option("--query-tls-cert", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="Serve the query API over HTTPS with this certificate (PEM; with --query-tls-key).")
@click.option("--query-tls-key", type=click.Path(path_type=Path, exists=True, dir_okay=False), default=None,
              help="The private key of --query-tls-cert (PEM).")
@click.option("--query-token-file", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              default=None, help="Require 'Authorization: Bearer <token>' with the token in this file.")
@click.option("--query-readers", type=click.IntRange(0, 16), default=1, show_default=True,
              help="Processes that serve key reads of the query port beside the worker, so reads "
                   "do not wait for its busy poll loop (0: the worker serves every read itself).")
@click.option("--standby-replicas", type=click.IntRange(min=0), default=0, show_default=True,
              help="Warm copies of each partition kept by other workers (needs --query-port).")
def worker(app_spec: str | None, concurrency: int, worker_id: str | None, group_id: str | None,
           guarantee: str, commit_interval: float, retries: int, on_failure: str, state_dir: Path | None,
           metrics_port: int | None, metrics_host: str, stats_file: Path | None, listeners: bool,
           query_port: int | None, query_host: str, query_advertise: str | None,
           query_tls_cert: Path | None, query_tls_key: Path | None, query_token_file: Path | None,
           standby_replicas: int, directory: bool, query_readers: int) -> None:
    """Consume the input topic and run the app's handlers per FIFO group."""
    # SIGTERM/SIGINT leave cleanly from the start: a worker stopped while it still imports
    # and connects (a scale-in right after a scale-out) exits 0 instead of being killed.
    made: list[Any] = []  # the worker, once made
    requested: list[int] = []

    def _term(signum: int, _frame: Any) -> None:
        logging.getLogger(__name__).info("signal %d: finishing the checkpoint and leaving", signum)
        requested.append(signum)
        for w in made:
            w.stop()

    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGINT, _term)
    from fifolane.cli.connect import check_reachable
    from fifolane.config import load_settings
    from fifolane.errors import LoginRefusedError, WorkerError
    from services.worker.options import WorkerOptions, default_worker_id
    from services.worker.runtime import Worker, load_app

    settings = load_settings()
    app = load_app(app_spec)
    _check_port(metrics_host, metrics_port, "--metrics-port")
    _check_port(query_host, query_port, "--query-port")
    # Kafka first, quietly: with the worker's own patience (a cluster restarting), not its
    # clients' FAIL lines; a stop signal ends the wait (the worker then stops at once)
    try:
        check_reachable(settings, timeout=_KAFKA_WAIT_S, stop=lambda: bool(requested))
    except LoginRefusedError as exc:  # the words of the worker's own check (Worker.connect)
        raise WorkerError(f"the worker cannot start: {exc}") from exc
    opts = WorkerOptions(
        worker_id=worker_id or default_worker_id(), group_id=group_id, concurrency=concurrency,
        guarantee=guarantee,  # type: ignore[arg-type]
        commit_interval=commit_interval, retries=retries, state_dir=state_dir,
        on_failure=on_failure,  # type: ignore[arg-type]
        metrics_port=metrics_port, metrics_host=metrics_host, stats_file=stats_file,
        query_port=query_port, query_host=query_host, query_advertise=query_advertise,
        query_tls_cert=query_tls_cert, query_tls_key=query_tls_key, query_token_file=query_token_file,
        standby_replicas=standby_replicas, query_readers=query_readers,
        # A stable id given by the operator: static membership, so a restart (or a crash and
        # restart within the session timeout) takes its partitions back without a rebalance.
        static_membership=worker_id is not None,
        directory=directory,
    )
    sink = None
    if listeners:
        from listeners.runtime import ListenerRuntime

        sink = ListenerRuntime(settings)
    w = Worker(settings, app, opts, sink=sink)
    made.append(w)
    if requested:
        w.stop()  # run() then closes at once
    try:
        w.run()
    finally:  # nothing keeps the worker then: main() destroys the clients its parts still hold
        made.clear()


def _check_port(host: str, port: int | None, flag: str) -> None:
    """Refuse a port another process holds before the worker starts (rather than an OSError
    traceback after it connected). Bound as the servers bind it, with SO_REUSEADDR, and let go."""
    import errno
    import socket

    from fifolane.errors import ConfigError

    if not port:  # None: no server; 0: any free port
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"{flag} {port}: cannot bind address {host!r}: {exc}") from None
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            why = "is in use by another process" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
            raise ConfigError(f"{flag} {port}: port {port} on {host} {why}; choose another port with "
                              f"{flag} (or stop what holds it)") from None


def script(prog_name: str) -> None:
    """Run :func:`worker` as a script (``python -m services.worker``, the container entry
    point): a fifolane error is one ``error:`` line and exit code 2, as ``fifolane worker``
    gives, not a traceback."""
    import sys

    from fifolane.cli import release_clients
    from fifolane.errors import FifolaneError

    try:
        worker(prog_name=prog_name)
    except FifolaneError as exc:
        click.echo(f"error: {exc}", err=True)
        release_clients()
        sys.exit(2)
