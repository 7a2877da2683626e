"""``fifolane produce TYPE [FILE|-]``: send JSON-lines events to the input topic."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, TYPE_CHECKING

import click

from fifolane.cli.connect import LIBRDKAFKA_LOG, check_reachable
from fifolane.config import Settings, load_settings
from fifolane.errors import ConfigError, UnknownSchemaError

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
@click.option("--skip", type=click.IntRange(min=0), default=0, metavar="N",
              help="Do not send the first N lines (resume an interrupted run; line numbers still count them).")
def produce(type_name: str, file: str, source: str | None, skip: int) -> None:
    """Send the JSON-lines events of FILE (or stdin) as TYPE events to the input topic.

    One event per line: the type's fields, plus "op": "upsert" (default) or "delete"
    (a delete needs only the key, group and version fields). A line that cannot be sent
    (invalid UTF-8 or JSON, not valid for the schema, too large for the producer) or that
    the brokers did not acknowledge is reported as "FILE: line N: reason" on stderr; the
    other lines are sent. The exit code is 1 if any line was not sent or not delivered.

    The input topic must exist (`fifolane topics create`). Ctrl-C stops the sending and says
    up to which line everything was delivered, and how to resume (--skip, exit code 130).
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

        _check_input_topic(settings)
        producer = stack.enter_context(EventProducer(settings, catalog, source,
                                                     producer_config={"logger": LIBRDKAFKA_LOG}))
        read = [0]  # lines read: is --skip past the end?
        report = producer.produce_lines(_counted(lines, read), type_name, on_error=on_error, skip=skip)

    if skip and read[0] < skip and not report.interrupted:
        raise ConfigError(f"--skip {skip} is past the end of {name} ({read[0]} line(s)): nothing was sent")

    summary = (f"delivered {report.delivered} of {report.sent} {type_name} event(s) sent to "
               f"{settings.input_topic} (source {producer.source})")
    if report.failed:
        summary += f"; {len(report.failed)} line(s) skipped, not sent (reported above)"
    if report.undelivered:
        summary += f"; {len(report.undelivered)} line(s) not delivered (reported above)"
    click.echo(summary, err=True)
    if report.interrupted:
        click.echo(_interrupted(report.resume_line or 1, report.delivered_beyond), err=True)
        sys.exit(130)
    if not report.ok:
        sys.exit(1)


def _check_input_topic(settings: Settings) -> None:
    """Refuse to send before `fifolane topics create`: brokers with automatic topic creation
    (the local dev cluster's) would otherwise make the input topic on the first record, with
    1 partition and none of the other topics."""
    if settings.input_topic not in check_reachable(settings):
        raise ConfigError(
            f"the input topic {settings.input_topic} does not exist on {settings.resolved_bootstrap()}: "
            f"run `fifolane topics create` first (or set FIFOLANE_INPUT_TOPIC to the topic to use)"
        )


def _counted(lines: Iterator[bytes], read: list[int]) -> Iterator[bytes]:
    for line in lines:
        read[0] += 1
        yield line


def _interrupted(resume: int, beyond: int) -> str:
    """What an interrupted run delivered for sure, and how to go on."""
    done = f"lines 1-{resume - 1} delivered (or reported above)" if resume > 1 else "no line known delivered"
    later = (f"; {beyond} later line(s) were delivered too (partitions finish out of order): sending "
             f"them again is harmless, workers drop a repeated version as superseded") if beyond else ""
    what = f"resume with --skip {resume - 1}" if resume > 1 else "send the file again"
    return f"interrupted: {done}{later}; {what}"
