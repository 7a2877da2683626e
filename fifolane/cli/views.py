"""``fifolane views``: build the Spark views of the state topic and show them.

    fifolane views build [--as-of TS [--allow-compacted]] [--out DIR] [--master URL]
                         (--master defaults to FIFOLANE_SPARK_MASTER, else local[*])
    fifolane views show NAME [--out DIR] [--limit N]

Spark is imported only when a command runs (the CLI root stays light).
"""

from __future__ import annotations

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
    with console.status(f"starting Spark ({master})"):
        spark = get_session(master, "fifolane-views", home=settings.home)
    # soft_wrap: paths stay on one line (copyable, greppable), whatever the console width
    log = session_log(spark)
    console.print(f"Spark {spark.version} on {master}; Spark's log: "
                  f"{log or 'none (its JVM was started outside fifolane)'}", soft_wrap=True)
    try:
        with SparkProgress(spark.sparkContext, console) as progress:
            report = build_views(
                spark, settings, catalog, out, as_of=when, allow_compacted=allow_compacted,
                step=progress.step,
            )
        stdout = Console()
        for table in build_summary(spark, out, report):
            stdout.print(table)
        stdout.print(f"views written to {out}", soft_wrap=True)
    finally:
        if started:  # end the application cleanly (on a cluster: FINISHED, executors freed)
            spark.stop()


@views.command()
@click.argument("name", type=click.Choice(_VIEW_NAMES))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Folder of the built views (default <home>/views).")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1), help="Rows to print.")
def show(name: str, out: Path | None, limit: int) -> None:
    """Print a built view from its Parquet."""
    from spark.output import read_manifest, read_view
    from spark.session import get_session
    from spark.summary import view_table

    settings = load_settings()
    out = _out_dir(settings, out)
    # Reading a built view is small: a local session, whatever the build's master was.
    spark = get_session("local[*]", "fifolane-views-show", home=settings.home)
    df = read_view(spark, name, out)
    manifest = read_manifest(out) or {}
    title = f"{name} ({df.count():,} rows; built {manifest.get('built_at', '?')}, as of {manifest.get('as_of') or 'then'})"
    Console().print(view_table(df, title, limit))
