"""The ``fifolane`` command line. Subcommands live in their own modules and load lazily,
so ``fifolane kafka status`` does not import Spark or the worker runtime."""

from __future__ import annotations

import gc
import importlib
import importlib.util
import logging
import os
import sys
import traceback

import click

from fifolane.errors import FifolaneError

__all__ = ["main", "cli"]

# name -> "module:attribute" of a click command or group
_COMMANDS: dict[str, str] = {
    "kafka": "fifolane.cli.kafka:kafka",
    "acls": "fifolane.cli.acls:acls",
    "topics": "fifolane.cli.topics:topics",
    "produce": "fifolane.cli.produce:produce",
    "worker": "fifolane.cli.worker:worker",
    "groups": "fifolane.cli.groups:groups",
    "listeners": "fifolane.cli.listeners:listeners",
    "listen": "fifolane.cli.listeners:listen",
    "views": "fifolane.cli.views:views",
    "demo": "fifolane.cli.demo:demo",
    "get": "fifolane.cli.query:get",
    "scan": "fifolane.cli.query:scan",
    "plan": "fifolane.cli.plan:plan_command",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(
            name for name, target in _COMMANDS.items()
            if importlib.util.find_spec(target.split(":")[0]) is not None
        )

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        module = importlib.import_module(module_name)
        command: click.Command = getattr(module, attr)
        return command


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", count=True, help="More log output (-vv for debug).")
def cli(verbose: int) -> None:
    """fifolane: FIFO-group event pipeline on Apache Kafka with cluster listeners."""
    level = os.environ.get("FIFOLANE_LOG_LEVEL") or ("DEBUG" if verbose > 1 else "INFO" if verbose else "WARNING")
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main() -> None:
    """Console-script entry point: fifolane errors become one clear line and exit code 2."""
    code = _run()  # outside the handlers: no traceback keeps a command's clients alive
    try:
        release_clients()
    except KeyboardInterrupt:  # Ctrl-C while the clients close: they still must (see release_clients)
        import signal

        click.echo("interrupted: closing the Kafka clients (Ctrl-C again to quit at once)", err=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        release_clients()
        code = code or 130
    sys.exit(code)


def _run() -> int | str | None:
    try:
        cli.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except FifolaneError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    except SystemExit as exc:  # a command's own exit code
        return exc.code
    except Exception:  # noqa: BLE001 - unexpected: its traceback and code 1, as Python's own
        traceback.print_exc()  # handler would, but with the clients released after it
        return 1
    return 0


def release_clients() -> None:
    """Destroy the Kafka clients no longer referenced, while the process is still whole.

    A client left to the interpreter's exit can crash it: OpenSSL's exit handler (in
    librdkafka) frees its tables while the client's broker thread still uses them (a
    SIGSEGV after the last line was printed, seen with SASL_SSL). Clients that are
    garbage, also in reference cycles or frozen by the worker's ``gc.freeze()``, go here;
    long-lived owners (the worker) close theirs themselves."""
    gc.unfreeze()
    gc.collect()
