"""Listener registrations of the benchmarks: the populations the suites register, and how.

Shared by the suites (``listeners``, ``capacity``), :mod:`benchmarks.systems` and
:mod:`benchmarks.listener_cpu`, so that no suite imports another.

The benchmark events (:mod:`benchmarks.events`) spread over flights ``F0..F999``, customers
``c0..c976``, amounts 50..949 and 1..4 seats.
"""

from __future__ import annotations

import importlib.util

from confluent_kafka import Producer

from fifolane.config import Settings

__all__ = ["converter_specs", "equality_specs", "general_specs", "prefix_specs", "register",
           "runtime_present"]

#: The converter of :func:`converter_specs`: a small projection of the new state.
CONVERTER = '{"id": value.reservation_id, "amount": value.amount}'


def runtime_present() -> bool:
    """True once ``listeners.runtime`` (the worker's listener sink) is importable."""
    try:
        return importlib.util.find_spec("listeners.runtime") is not None
    except ImportError:
        return False


def equality_specs(n: int) -> list[tuple[str, bytes]]:
    """``n`` registrations (name, JSON) on distinct flights ``F0..F<n-1>``: the indexed case.

    The events use flights ``F0..F999``: each matches at most one of these listeners.
    """
    from listeners.model import ListenerSpec

    return [(f"eq{i}", ListenerSpec(name=f"eq{i}", type="reservation",
                                    filter=f'value.flight_number == "F{i}"').to_json())
            for i in range(n)]


def general_specs(n: int) -> list[tuple[str, bytes]]:
    """``n`` distinct filters the equality index cannot serve: each is evaluated per change."""
    from listeners.model import ListenerSpec

    return [(f"g{i}", ListenerSpec(name=f"g{i}", type="reservation",
                                   filter=f"value.amount > {900.0 + i} && value.seats != {i % 7}").to_json())
            for i in range(n)]


def prefix_specs(n: int) -> list[tuple[str, bytes]]:
    """``n`` distinct ``startsWith`` filters (not indexable): listener ``p<i>`` selects the
    customers whose id starts with ``c<i>x``, which no benchmark customer does, so they cost
    their evaluations and send nothing."""
    from listeners.model import ListenerSpec

    return [(f"p{i}", ListenerSpec(name=f"p{i}", type="reservation",
                                   filter=f'value.customer_id.startsWith("c{i}x")').to_json())
            for i in range(n)]


def converter_specs(n: int) -> list[tuple[str, bytes]]:
    """:func:`general_specs` with a converter (:data:`CONVERTER`) on each listener."""
    from listeners.model import ListenerSpec

    return [(f"v{i}", ListenerSpec(name=f"v{i}", type="reservation",
                                   filter=f"value.amount > {900.0 + i} && value.seats != {i % 7}",
                                   convert=CONVERTER).to_json())
            for i in range(n)]


def register(settings: Settings, specs: list[tuple[str, bytes]]) -> None:
    """Write registrations to the registry topic (key = name, value = JSON)."""
    producer = Producer(settings.kafka_config(**{"enable.idempotence": True, "acks": "all",
                                                 "linger.ms": 20}))
    for name, value in specs:
        while True:
            try:
                producer.produce(settings.registry_topic, value, name.encode())
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60):
        raise RuntimeError("listener registrations were not delivered")
