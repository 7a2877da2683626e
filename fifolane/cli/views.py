"""``fifolane views``: build the Spark views of the state topic and show them.

    fifolane views build [--as-of TS [--allow-compacted]] [--out DIR] [--master URL]
                         (--master defaults to FIFOLANE_SPARK_MASTER, else local[*])
    fifolane views show NAME [--out DIR] [--limit N]

Spark is imported only when a command runs (the CLI root stays light).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import click
from rich.console import Console

from fifolane.config import Settings, load_settings

__all__ = ["parse_as_of", "views"]

_VIEW_NAMES = ("reservations", "seats_per_flight", "revenue_per_route", "reservations_per_state")


def parse_as_of(text: str) -> datetime:
    """An ISO-8601 time (UTC when it has no zone) or epoch milliseconds."""
    if text.isdigit():
        return datetime.fromtimestamp(int(text) / 1000.0, tz=UTC)
    try:
        value = datetime.fromisoformat(text)
    except ValueError as exc:
        raise click.BadParameter(
            f"{text!r}: expected ISO-8601 (2026-11-22T10:00:00Z) or epoch milliseconds"
        ) from exc
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _out_dir(settings: Settings, out: Path | None) -> Path:
    return out if out is not None else settings.home / "views"


def _shown_dir(settings: Settings, out: Path | None) -> Path:
    """``--out``, else where the last ``views build`` wrote, else <home>/views."""
    if out is not None:
        return out
    try:
        last = Path(_last_out(settings).read_text().strip())
    except OSError:
        return _out_dir(settings, None)
    return last if last.is_dir() else _out_dir(settings, None)


@click.group()
def views() -> None:
    """Spark views of the state topic (Parquet under <home>/views)."""


@views.command()
@click.option("--as-of", "as_of", metavar="TS",
              help="Build the views as they were at TS (ISO-8601, UTC default, or epoch ms).")
@click.option("--allow-compacted", is_flag=True,
              help="Build an --as-of view even outside the history window (may be incomplete).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Output folder (default <home>/views); on a cluster, one every executor sees.")
@click.option("--master", default=None, metavar="URL",
              help="Spark master URL: local[*], spark://host:7077, ... "
                   "[default: FIFOLANE_SPARK_MASTER, else local[*]]")
def build(as_of: str | None, allow_compacted: bool, out: Path | None, master: str | None) -> None:
    """Read the state topic, build every view and write it as Parquet.

    Spark's own output (connector download report, log lines) goes to a log file under
    <home>/spark/logs; its path is printed. On a terminal the running stages and their
    tasks are shown as they progress.
    """
    console = Console(stderr=True)
    settings = load_settings()
    master = master or settings.spark_master
    out = _out_dir(settings, out)
    when = parse_as_of(as_of) if as_of else None
    from fifolane.cli.connect import check_reachable
    from spark.packages import check_versions
    from spark.session import check_master_reachable

    check_versions()  # a pyspark that cannot run Spark's Kafka connector: refused first (no Kafka needed)
    check_master_reachable(master)  # a socket connect: before Kafka's seconds of patience
    check_reachable(settings)  # Spark would wait for minutes
    if when is not None:
        from spark.history import history_window

        with console.status(f"checking the history window of {settings.state_topic}"):
            # Refuses (HistoryWindowError, exit 2) before Spark starts, unless allowed.
            warning = history_window(settings, settings.state_topic).check(
                when, allow_compacted=allow_compacted
            )
        if warning:
            console.print(f"[yellow]warning:[/] {warning}")

    from fifolane.serde import SchemaCatalog
    from spark.job import build_views
    from spark.progress import SparkProgress
    from spark.session import get_session, session_log, spark_running
    from spark.summary import build_summary

    catalog = SchemaCatalog.load(settings.schemas_dir)
    started = not spark_running()
    interrupted = _sigint_watch()
    spark = None
    try:
        with console.status(f"starting Spark ({master})"):
            spark = get_session(master, "fifolane-views", home=settings.home)
        # soft_wrap: paths stay on one line (copyable, greppable), whatever the console width
        log = session_log(spark)
        console.print(f"Spark {spark.version} on {master}; Spark's log: "
                      f"{log or 'none (its JVM was started outside fifolane)'}", soft_wrap=True)
        with SparkProgress(spark.sparkContext, console) as progress:
            report = build_views(
                spark, settings, catalog, out, as_of=when, allow_compacted=allow_compacted,
                step=progress.step,
            )
        stdout = Console()
        for table in build_summary(spark, out, report):
            stdout.print(table)
        stdout.print(f"views written to {out}", soft_wrap=True)
        _record_out(settings, out)
    except BaseException:
        if not interrupted():
            raise
    finally:
        if started and spark is not None:  # end the application cleanly (on a cluster: FINISHED)
            with contextlib.suppress(Exception) if interrupted() else contextlib.nullcontext():
                spark.stop()
    if interrupted():
        # What Py4J says about the interrupted call (a cancelled job, a broken connection) is
        # the interrupt's doing: one line and exit code 130, as a shell gives, and no JVM left.
        if started:
            _end_jvm()
        click.echo(f"interrupted: views build stopped; the views in {out} are incomplete "
                   f"(build them again)", err=True)
        sys.exit(130)


def _end_jvm() -> None:
    """Stop this process's Spark JVM (it outlives an interrupted Py4J call otherwise)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        if gateway is not None:
            gateway.shutdown()
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001 - still there after 10 s: kill it
            proc.kill()


def _sigint_watch() -> Callable[[], bool]:
    """Whether SIGINT (Ctrl-C) arrived since this call, whichever Python handler took it:
    Spark installs its own when its context starts (it cancels the running jobs and raises
    KeyboardInterrupt), and what surfaces then is often a Py4J error, not the interrupt."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)  # the signal numbers, as bytes
    seen: list[bool] = []

    def interrupted() -> bool:
        with contextlib.suppress(BlockingIOError):
            if signal.SIGINT in os.read(read_end, 4096):
                seen.append(True)
        return bool(seen)

    def quiet(record: logging.LogRecord) -> bool:  # Py4J logs the broken call with its traceback
        from_py4j = record.name.startswith("py4j") or f"{os.sep}py4j{os.sep}" in record.pathname
        return not (from_py4j and interrupted())

    for handler in logging.getLogger().handlers:
        handler.addFilter(quiet)
    return interrupted


def _last_out(settings: Settings) -> Path:
    return settings.home / "views.last"


def _record_out(settings: Settings, out: Path) -> None:
    """Remember where the last build wrote, so `views show` finds it without --out."""
    with contextlib.suppress(OSError):
        settings.home.mkdir(parents=True, exist_ok=True)
        _last_out(settings).write_text(str(out.resolve()) + "\n")


@views.command()
@click.argument("name", type=click.Choice(_VIEW_NAMES))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder of the built views (default: where the last `views build` wrote, else <home>/views).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1), help="Rows to print.")
def show(name: str, out: Path | None, limit: int) -> None:
    """Print a built view from its Parquet."""
    from spark.output import read_manifest, read_view
    from spark.session import get_session
    from spark.summary import view_table

    settings = load_settings()
    out = _shown_dir(settings, out)
    # Reading a built view is small: a local session, whatever the build's master was.
    spark = get_session("local[*]", "fifolane-views-show", home=settings.home)
    df = read_view(spark, name, out)
    manifest = read_manifest(out) or {}
    title = f"{name} ({df.count():,} rows; built {manifest.get('built_at', '?')}, as of {manifest.get('as_of') or 'then'})"
    Console().print(view_table(df, title, limit))
