"""``fifolane produce TYPE [FILE|-]``: send JSON-lines events to the input topic."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING

import click

from fifolane.config import load_settings
from fifolane.errors import UnknownSchemaError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["produce"]

# Below this size a progress bar would only flicker.
_PROGRESS_MIN_BYTES = 256 * 1024


def _with_progress(fh: IO[str], total: int, stack: ExitStack) -> tuple[Iterator[str], Console]:
    """Lines of ``fh``, advancing a rich progress bar (on stderr) by their size."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    progress = stack.enter_context(Progress(
        TextColumn("producing"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
        console=console, transient=True,
    ))
    task = progress.add_task("produce", total=total)

    def lines() -> Iterator[str]:
        for line in fh:
            yield line
            progress.advance(task, len(line.encode()))

    return lines(), console


@click.command()
@click.argument("type_name", metavar="TYPE")
@click.argument("file", default="-", type=click.Path(dir_okay=False, allow_dash=True, path_type=str))
@click.option("--source", help="Source id (sequence numbers are per source). Default: cli-<hostname>.")
def produce(type_name: str, file: str, source: str | None) -> None:
    """Send the JSON-lines events of FILE (or stdin) as TYPE events to the input topic.

    One event per line: the type's fields, plus "op": "upsert" (default) or "delete"
    (a delete needs only the key, group and version fields). Invalid lines are reported
    with their line number and skipped; the exit code is 1 if any line failed.
    """
    from fifolane.produce import EventProducer
    from fifolane.serde import SchemaCatalog

    settings = load_settings()
    catalog = SchemaCatalog.load(settings.schemas_dir)
    try:
        catalog.entity(type_name)
    except UnknownSchemaError as exc:
        raise click.BadParameter(str(exc), param_hint="TYPE") from None
    name = "<stdin>" if file == "-" else file

    with ExitStack() as stack:
        if file == "-":
            fh: IO[str] = sys.stdin
        else:
            try:
                fh = stack.enter_context(Path(file).open(encoding="utf-8"))
            except OSError as exc:
                raise click.FileError(file, hint=exc.strerror or str(exc)) from None
        lines: Iterator[str] = iter(fh)
        console: Console | None = None
        if file != "-" and sys.stderr.isatty():
            size = Path(file).stat().st_size
            if size >= _PROGRESS_MIN_BYTES:
                lines, console = _with_progress(fh, size, stack)

        def on_error(line_no: int, reason: str) -> None:
            message = f"{name}:{line_no}: {reason}"
            if console is not None:
                console.print(message, markup=False, highlight=False)  # above the progress bar
            else:
                click.echo(message, err=True)

        producer = stack.enter_context(EventProducer(settings, catalog, source))
        report = producer.produce_lines(lines, type_name, on_error=on_error)

    for error in report.delivery_errors:
        click.echo(f"delivery failed: {error}", err=True)
    summary = f"sent {report.sent} {type_name} event(s) to {settings.input_topic} (source {producer.source})"
    if report.failed:
        summary += f"; {len(report.failed)} line(s) failed and were not sent"
    if report.delivery_errors:
        summary += f"; {len(report.delivery_errors)} delivery failure(s)"
    click.echo(summary, err=True)
    if not report.ok:
        sys.exit(1)
