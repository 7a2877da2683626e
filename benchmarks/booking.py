"""The flights app's input (examples/flights.py): the demo's booking stream as benchmark input.

:func:`fifolane.demo.stream.generate` (``FLIGHTS`` flights, then reservations with superseded
and out-of-order versions, cancellations and 3% deletes), keyed by flight, as Avro records
(fifolane) or JSON (Quix Streams). Used by the ``app`` and ``capacity`` suites.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from fifolane.config import Settings
from fifolane.serde import SchemaCatalog, make_codec

__all__ = ["APP", "FLIGHTS", "avro_items", "json_items", "stream"]

APP = "examples.flights:app"
FLIGHTS = 300

#: (type, record, op) as :func:`fifolane.demo.stream.generate` yields them.
BookingEvent = tuple[str, dict[str, Any], str]


def stream(n: int) -> list[BookingEvent]:
    """``FLIGHTS`` flights, then ``n`` reservation events (seed 16)."""
    from fifolane.demo.stream import generate

    return generate(n_flights=FLIGHTS, n_events=n, seed=16).events


def avro_items(settings: Settings, evs: list[BookingEvent]) -> Iterator[tuple[bytes, bytes | None, Any]]:
    """(key, Avro value, None) items for :func:`benchmarks.events.produce_raw`; deletes as
    the codec's delete records."""
    codec = make_codec(settings, SchemaCatalog.load(settings.schemas_dir))
    for kind, rec, op in evs:
        key = rec["reservation_id"] if kind == "reservation" else rec["flight_number"]
        value = (codec.encode_delete(kind, key, rec["flight_number"], rec["version"]) if op == "delete"
                 else codec.encode(kind, rec))
        yield rec["flight_number"].encode(), value, None


def json_items(evs: list[BookingEvent]) -> Iterator[tuple[bytes, bytes | None, Any]]:
    """The same events as JSON (the Quix Streams flights app's input)."""
    for kind, rec, op in evs:
        body = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in rec.items()}
        yield rec["flight_number"].encode(), json.dumps(
            {"type": kind, "op": op, "record": body}, separators=(",", ":")).encode(), None
