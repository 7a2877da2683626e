"""The Confluent wire format and schema evolution against a real Schema Registry.

Apicurio Registry (started by ``conftest.py``, Confluent API under ``/apis/ccompat/v7``)
replaces the in-test fake of ``tests/unit/test_serde.py``: the same checks, plus what only
a real registry does (compatibility rules), plus the producer CLI and a worker end to end.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from apicurio import ApicurioRegistry
from fastavro import parse_schema, schemaless_writer
from kafka_fixtures import consume_all
from worker_support import WorkerThread, read_table, send_events, wait_accounted

from fifolane.config import Settings
from fifolane.errors import SchemaRegistryError, UnknownSchemaError
from fifolane.serde import SchemaCatalog
from fifolane.serde.confluent import ConfluentCodec, RegistryClient
from schemas import SCHEMAS_DIR

pytestmark = [pytest.mark.integration, pytest.mark.registry]

CATALOG = SchemaCatalog.load()
SUBJECT = "fifolane.flights.Reservation"  # RecordNameStrategy: the record's full name
V1_TEXT = (SCHEMAS_DIR / "history" / "reservation.v1.avsc").read_text()
RESERVATION = {
    "reservation_id": "R-1001", "flight_number": "LX318", "customer_id": "C-7",
    "seats": 2, "amount": 310.5, "state": "CONFIRMED", "version": 12,
}
FLIGHT = {
    "flight_number": "LX318", "origin": "ZRH", "destination": "LHR",
    "departure": dt.date(2025, 6, 1), "capacity": 180, "version": 3,
}
_JSON = {"Content-Type": "application/vnd.schemaregistry.v1+json"}


def _codec(registry: ApicurioRegistry) -> ConfluentCodec:
    """A codec as a fresh process has it: it knows ids only from the registry."""
    return ConfluentCodec(CATALOG, RegistryClient(registry.url))


def _get(registry: ApicurioRegistry, path: str) -> Any:
    response = httpx.get(registry.url + path, timeout=10)
    assert response.status_code == 200, (path, response.text)
    return response.json()


def _versions(registry: ApicurioRegistry, subject: str) -> dict[int, dict[str, Any]]:
    """The subject's versions in the registry: schema id -> parsed schema."""
    out = {}
    for version in _get(registry, f"/subjects/{subject}/versions"):
        answer = _get(registry, f"/subjects/{subject}/versions/{version}")
        assert answer["subject"] == subject
        out[int(answer["id"])] = json.loads(answer["schema"])
    return out


def _current_id(registry: ApicurioRegistry, type_name: str = "reservation") -> int:
    """The registry id of the current schema (registering it again finds it)."""
    entity = CATALOG.entity(type_name)
    return RegistryClient(registry.url).register(entity.full_name, json.dumps(entity.raw_schema))


def _require_backward(registry: ApicurioRegistry, subject: str) -> None:
    response = httpx.put(f"{registry.url}/config/{subject}", content=json.dumps({"compatibility": "BACKWARD"}),
                         headers=_JSON, timeout=10)
    assert response.status_code == 200, response.text


def _v1_frame(schema_id: int, record: dict[str, Any]) -> bytes:
    """A reservation written with the history schema v1, framed with its registry id."""
    body = io.BytesIO()
    v1 = {k: v for k, v in record.items() if k != "customer_id"}
    schemaless_writer(body, parse_schema(json.loads(V1_TEXT), named_schemas={}), v1)
    return b"\x00" + schema_id.to_bytes(4, "big") + body.getvalue()


def test_wire_format_round_trips_through_the_registry(apicurio: ApicurioRegistry) -> None:
    writer = _codec(apicurio)
    data = writer.encode("reservation", RESERVATION)
    assert data[0] == 0
    schema_id = int.from_bytes(data[1:5], "big")
    # The id is the registry's own: a version of the subject carries it, with our schema.
    versions = _versions(apicurio, SUBJECT)
    assert versions[schema_id]["name"] == "Reservation"
    assert "customer_id" in [f["name"] for f in versions[schema_id]["fields"]]
    # Registering the same schema again finds the same id (no new version).
    assert _current_id(apicurio) == schema_id
    assert _versions(apicurio, SUBJECT).keys() == versions.keys()

    delete = writer.encode_delete("reservation", "R-1001", "LX318", 13)
    flight = writer.encode("flight", FLIGHT)
    reader = _codec(apicurio)  # another process: fetches each id once over HTTP
    assert reader.decode(data).record == RESERVATION
    assert reader.decode(flight).record == FLIGHT
    decoded = reader.decode(delete)
    assert decoded.is_delete and (decoded.key, decoded.group, decoded.version) == ("R-1001", "LX318", 13)
    assert {SUBJECT, "fifolane.flights.Flight", "fifolane.Delete"} <= set(_get(apicurio, "/subjects"))


def test_evolution_old_writer_read_in_the_current_schema(apicurio: ApicurioRegistry) -> None:
    # A compatibility rule as a real deployment has it: the current schema (v1 plus a
    # defaulted customer_id) is a backward-compatible successor of v1.
    _require_backward(apicurio, SUBJECT)
    client = RegistryClient(apicurio.url)
    v1_id = client.register(SUBJECT, V1_TEXT)
    current = _codec(apicurio).encode("reservation", RESERVATION)
    current_id = int.from_bytes(current[1:5], "big")
    assert v1_id != current_id
    assert {v1_id, current_id} <= _versions(apicurio, SUBJECT).keys()

    reader = _codec(apicurio)
    assert reader.decode(_v1_frame(v1_id, RESERVATION)).record == {**RESERVATION, "customer_id": ""}
    assert reader.decode(current).record == RESERVATION


def test_an_incompatible_schema_is_refused_with_the_registry_reason(apicurio: ApicurioRegistry) -> None:
    namespace = f"x{uuid.uuid4().hex}"
    subject = f"{namespace}.Thing"
    _require_backward(apicurio, subject)
    client = RegistryClient(apicurio.url)
    first = {"type": "record", "name": "Thing", "namespace": namespace, "fields": [{"name": "a", "type": "int"}]}
    client.register(subject, json.dumps(first))
    # A new field without a default: old records could not be read with it.
    second = {**first, "fields": [*first["fields"], {"name": "b", "type": "string"}]}
    with pytest.raises(SchemaRegistryError, match=rf"schema registry refused register {subject}: HTTP 409 .*Incompatible"):
        client.register(subject, json.dumps(second))


def test_unknown_ids_and_foreign_records(apicurio: ApicurioRegistry) -> None:
    reader = _codec(apicurio)
    with pytest.raises(UnknownSchemaError, match=rf"schema registry {apicurio.url} has no schema with id 2147483000"):
        reader.decode(b"\x00" + (2147483000).to_bytes(4, "big") + b"\x02")
    namespace = f"x{uuid.uuid4().hex}"
    foreign = {"type": "record", "name": "Other", "namespace": namespace, "fields": [{"name": "a", "type": "int"}]}
    foreign_id = RegistryClient(apicurio.url).register(f"{namespace}.Other", json.dumps(foreign))
    with pytest.raises(UnknownSchemaError, match=rf"record {namespace}.Other is not a known entity type"):
        reader.decode(b"\x00" + foreign_id.to_bytes(4, "big") + b"\x02")


def test_produce_cli_writes_the_registry_ids(
    apicurio: ApicurioRegistry, settings: Settings, topics: dict[str, Any], tmp_path: Path
) -> None:
    lines = [RESERVATION, {**RESERVATION, "reservation_id": "R-2", "version": 1},
             {"reservation_id": "R-2", "flight_number": "LX318", "version": 2, "op": "delete"}]
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    env.update({"FIFOLANE_BOOTSTRAP_SERVERS": settings.resolved_bootstrap(),
                "FIFOLANE_INPUT_TOPIC": settings.input_topic, "FIFOLANE_HOME": str(settings.home),
                "FIFOLANE_SCHEMA_REGISTRY_URL": apicurio.url})
    result = subprocess.run([sys.executable, "-c", "from fifolane.cli import main; main()",
                             "produce", "reservation", str(events), "--source", "apicurio-test"],
                            env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    records = consume_all(settings, settings.input_topic)
    assert len(records) == 3 and all(m.value()[0] == 0 for m in records)
    reservation_id = _current_id(apicurio)
    (delete_id,) = _versions(apicurio, "fifolane.Delete")
    assert [int.from_bytes(m.value()[1:5], "big") for m in records] == [reservation_id, reservation_id, delete_id]
    reader = _codec(apicurio)
    assert [reader.decode(m.value()).record["reservation_id" if i < 2 else "key"]
            for i, m in enumerate(records)] == ["R-1001", "R-2", "R-2"]


def test_worker_reads_old_and_new_writers_through_the_registry(
    apicurio: ApicurioRegistry, settings: Settings, topics: dict[str, Any]
) -> None:
    settings = settings.with_overrides(schema_registry_url=apicurio.url)
    v1_id = RegistryClient(apicurio.url).register(SUBJECT, V1_TEXT)
    old = {**RESERVATION, "reservation_id": "R-OLD", "version": 1}
    n = send_events(settings, [("reservation", RESERVATION, "upsert")])
    from confluent_kafka import Producer

    producer = Producer(settings.kafka_config())
    producer.produce(settings.input_topic, _v1_frame(v1_id, old), b"LX318")
    assert producer.flush(30) == 0
    with WorkerThread(settings) as worker:
        wait_accounted([worker], n + 1)
    assert worker.stats.processed == 2 and worker.stats.dead_lettered == 0

    table = read_table(settings)  # decoded through the registry
    assert table["reservation/R-1001"] == (12, RESERVATION)
    assert table["reservation/R-OLD"] == (1, {**old, "customer_id": ""})
    # State records are Confluent-framed with the registry's ids; the worker keeps the bytes
    # of the writer it read (the v1 record stays v1: readers resolve it like any writer).
    state = {m.key(): m.value() for m in consume_all(settings, settings.state_topic) if m.value() is not None}
    assert {k: int.from_bytes(v[1:5], "big") for k, v in state.items()} == {
        b"reservation/R-1001": _current_id(apicurio), b"reservation/R-OLD": v1_id}
