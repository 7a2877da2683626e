"""``fifolane demo``: the flight-booking pipeline end to end, checked against its input."""

from __future__ import annotations

import sys

import click

__all__ = ["demo"]


@click.command()
@click.option("--events", default=200_000, show_default=True, type=click.IntRange(min=100),
              help="Reservation events to generate.")
@click.option("--flights", default=300, show_default=True, type=click.IntRange(min=1))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(min=1, max=8))
@click.option("--no-spark", is_flag=True, help="Skip the Spark views.")
@click.option("--no-kill", is_flag=True, help="Do not kill a worker midway.")
def demo(events: int, flights: int, workers: int, no_spark: bool, no_kill: bool) -> None:
    """Bring up Kafka if needed, run workers, listeners, a stream with a crash, Spark views."""
    import signal

    from fifolane.config import load_settings
    from fifolane.demo import DemoOptions, run_demo

    def _term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # unwinds: workers and the Kafka the demo started are stopped

    signal.signal(signal.SIGTERM, _term)

    ok = run_demo(load_settings(), DemoOptions(events=events, flights=flights, workers=workers,
                                               spark=not no_spark, kill=not no_kill))
    sys.exit(0 if ok else 1)
