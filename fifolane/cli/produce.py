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


def _with_progress(fh: IO[bytes], total: int | None, stack: ExitStack) -> tuple[Iterator[bytes], Console]:
    """Lines of ``fh``, advancing a rich progress bar (on stderr) by their size.

    ``total`` None (stdin): no bar, a running count of bytes read.
    """
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    console = Console(stderr=True)
    columns = [TextColumn("producing"), BarColumn(), DownloadColumn(), TimeRemainingColumn()] if total \
        else [TextColumn("producing"), DownloadColumn()]
    progress = stack.enter_context(Progress(*columns, console=console, transient=True))
    task = progress.add_task("produce", total=total)

    def lines() -> Iterator[bytes]:
        for line in fh:
            yield line
            progress.advance(task, len(line))

    return lines(), console


@click.command()
@click.argument("type_name", metavar="TYPE")
@click.argument("file", default="-", type=click.Path(dir_okay=False, allow_dash=True, path_type=str))
@click.option("--source", help="Source id (sequence numbers are per source). Default: cli-<hostname>.")
def produce(type_name: str, file: str, source: str | None) -> None:
    """Send the JSON-lines events of FILE (or stdin) as TYPE events to the input topic.

    One event per line: the type's fields, plus "op": "upsert" (default) or "delete"
    (a delete needs only the key, group and version fields). A line that cannot be sent
    (invalid UTF-8 or JSON, not valid for the schema, too large for the producer) or that
    the brokers did not acknowledge is reported as "FILE: line N: reason" on stderr; the
    other lines are sent. The exit code is 1 if any line was not sent or not delivered.
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
            fh: IO[bytes] = sys.stdin.buffer
        else:
            try:
                fh = stack.enter_context(Path(file).open("rb"))  # lines are decoded one by one
            except OSError as exc:
                raise click.FileError(file, hint=exc.strerror or str(exc)) from None
        lines: Iterator[bytes] = iter(fh)
        console: Console | None = None
        if sys.stderr.isatty():
            size = None if file == "-" else Path(file).stat().st_size
            if size is None or size >= _PROGRESS_MIN_BYTES:
                lines, console = _with_progress(fh, size, stack)

        def on_error(line_no: int, reason: str) -> None:
            message = f"{name}: line {line_no}: {reason}"
            if console is not None:
                console.print(message, markup=False, highlight=False)  # above the progress bar
            else:
                click.echo(message, err=True)

        producer = stack.enter_context(EventProducer(settings, catalog, source))
        report = producer.produce_lines(lines, type_name, on_error=on_error)

    summary = f"sent {report.sent} {type_name} event(s) to {settings.input_topic} (source {producer.source})"
    if report.failed:
        summary += f"; {len(report.failed)} line(s) skipped, not sent (reported above)"
    if report.undelivered:
        summary += f"; {len(report.undelivered)} line(s) not delivered (reported above)"
    click.echo(summary, err=True)
    if not report.ok:
        sys.exit(1)
