"""``fifolane kafka up|status|down|fetch``: the local Apache Kafka (real jars, KRaft, JVMs)."""

from __future__ import annotations

import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from fifolane.cluster import KAFKA_VERSION, LocalCluster
from fifolane.cluster.jars import jars_present
from fifolane.config import load_settings

__all__ = ["kafka"]

# The first broker of the default cluster prefers Kafka's usual port, so tools that assume
# localhost:9092 work; a busy 9092 just means another free port.
_PREFERRED_PORT = 9092


def _cluster(brokers: int = 1, secure: bool = False, port: int | None = None) -> LocalCluster:
    return LocalCluster(load_settings().home, brokers, preferred_port=_PREFERRED_PORT, port=port, secure=secure)


def _print_secure_settings(cluster: LocalCluster, bootstrap: str, console: Console) -> None:
    """The admin's client settings (stdout, for `eval`/copying) and where every user's are."""
    files = cluster.secure_files
    made = files.write_client_files(bootstrap)
    console.print(f"TLS + SASL/SCRAM-SHA-512 + ACLs; CA {files.ca_pem}; client settings per user "
                  f"(FIFOLANE_CONFIG=<file>): {', '.join(str(p) for p in made.values())}")
    console.print("the admin (a super user) sets up topics, users and ACLs; e.g. "
                  "`fifolane topics create`, then `fifolane acls apply --role worker --principal User:worker` "
                  "(docs/security.md). Client settings of admin:")
    for key, value in files.client_settings("admin", bootstrap).items():
        click.echo(f"export FIFOLANE_{key.upper()}={value}")


def _fetch_with_progress(cluster: LocalCluster, console: Console) -> None:
    if jars_present(cluster.libs):
        return
    started = time.monotonic()
    with console.status(f"downloading Apache Kafka {KAFKA_VERSION} jars from Maven Central into {cluster.libs} ..."):
        cluster.fetch()
    console.print(f"fetched Kafka {KAFKA_VERSION} jars in {time.monotonic() - started:.1f}s")


@click.group()
def kafka() -> None:
    """Run Apache Kafka locally (KRaft, combined broker+controller nodes)."""


@kafka.command()
@click.option("--brokers", type=click.Choice(["1", "3"]), default="1", show_default=True,
              help="3 = replication factor 3, min ISR 2.")
@click.option("--timeout", type=float, default=90.0, show_default=True, help="Seconds to wait for the cluster.")
@click.option("--fresh", is_flag=True, help="Wipe earlier broker data first.")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="The first node's client port (default: 9092 if free, else any free port); "
                   "an error if it is taken. Earlier data is kept.")
@click.option("--secure", is_flag=True,
              help="TLS, SASL/SCRAM-SHA-512 users and ACLs (StandardAuthorizer); prints the client settings.")
def up(brokers: str, timeout: float, fresh: bool, port: int | None, secure: bool) -> None:
    """Start the cluster (idempotent) and print its bootstrap servers."""
    console = Console(stderr=True)
    cluster = _cluster(int(brokers), secure, port)
    _fetch_with_progress(cluster, console)
    before = cluster.status()
    stopped = sum(not b.alive for b in before.brokers) if any(b.alive for b in before.brokers) else None
    started = time.monotonic()
    what = "certificates, users and " if secure and not cluster.secure_files.complete() else ""
    with console.status(f"starting {what}{brokers} Kafka node(s) ..."):
        status = cluster.up(timeout=timeout, fresh=fresh)
    if status.already_running:
        console.print(f"already running ({len(status.brokers)} node(s))")
    else:
        count = f"{stopped} stopped node(s) again" if stopped else f"{len(status.brokers)} node(s)"
        console.print(f"started {count} in {time.monotonic() - started:.1f}s; "
                      f"logs: {cluster.dir}/node-*/server.log")
    assert status.bootstrap_servers is not None
    if secure:
        _print_secure_settings(cluster, status.bootstrap_servers, console)
        return
    click.echo(status.bootstrap_servers)


@kafka.command()
def status() -> None:
    """Show the nodes of the local cluster; exit code 1 if it is not fully running."""
    cluster = _cluster()
    current = cluster.status()
    if current.bootstrap_servers is None:
        click.echo(f"not running (no {cluster.state_file})")
        raise SystemExit(1)
    table = Table(title=f"local Kafka {KAFKA_VERSION}: {current.bootstrap_servers}")
    for column in ("node", "pid", "alive", "port", "controller port", "log"):
        table.add_column(column)
    for b in current.brokers:
        table.add_row(str(b.node_id), str(b.pid or "-"), "yes" if b.alive else "NO", str(b.port),
                      str(b.controller_port), str(b.log_file))
    Console().print(table)
    if not current.running:
        raise SystemExit(1)


@kafka.command()
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds before SIGKILL.")
def down(timeout: float) -> None:
    """Stop the nodes `up` started (SIGTERM, then SIGKILL after --timeout)."""
    stopped = _cluster().down(timeout=timeout)
    click.echo(f"stopped {len(stopped)} node(s)" if stopped else "not running")


@kafka.command("secure-files")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Folder to write (made once, reused).")
@click.option("--host", "hosts", multiple=True, required=True,
              help="Host name the brokers are reached by (in the certificate); the first is the node's.")
@click.option("--bootstrap", default=None, help="Bootstrap servers written into the client settings.")
def secure_files(out: Path, hosts: tuple[str, ...], bootstrap: str | None) -> None:
    """Certificates, SCRAM users and the broker configuration of docker-compose's `secure` profile."""
    from fifolane.cluster.secure import compose_node_properties, ensure_secure_files

    files, made = ensure_secure_files(out, hosts=(*hosts, "localhost", "127.0.0.1"))
    (out / "server.properties").write_text(compose_node_properties(files, hosts[0]))
    (out / "format-args").write_text(" ".join(files.format_args()) + "\n")
    for path in (out / "server.properties", out / "format-args"):
        path.chmod(0o600)
    clients = files.write_client_files(bootstrap)
    click.echo(f"{'made' if made else 'kept'} {out}: CA {files.ca_pem}; users {', '.join(sorted(clients))}")


@kafka.command()
def fetch() -> None:
    """Download the Kafka jars into the cache only (no broker is started)."""
    console = Console(stderr=True)
    cluster = _cluster()
    if jars_present(cluster.libs):
        console.print(f"Kafka {KAFKA_VERSION} jars already in {cluster.libs}")
        return
    _fetch_with_progress(cluster, console)
