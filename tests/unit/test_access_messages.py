"""The words of security refusals: librdkafka's text cut to what the user needs, and the
transactional-id refusal naming the grant (end to end: tests/secure/test_refusals.py)."""

from __future__ import annotations

from fifolane.access import kafka_said, principal_of
from services.worker.clients import producer_config
from services.worker.kafka import _txn_denied
from services.worker.options import WorkerOptions


def test_kafka_said_drops_the_broker_address_and_the_timing() -> None:
    assert kafka_said(
        "sasl_ssl://127.0.0.1:9092/bootstrap: SASL authentication error: Authentication failed "
        "(after 3ms in state AUTH_REQ, 1 identical error(s) suppressed)"
    ) == "SASL authentication error: Authentication failed"
    assert kafka_said("ssl://h:1/0: SSL handshake failed: bad (after 10ms in state SSL_HANDSHAKE)") == (
        "SSL handshake failed: bad")
    assert kafka_said("Local: Authentication failure") == "Local: Authentication failure"


def test_principal_of_sasl_clients_only() -> None:
    assert principal_of({"security.protocol": "SASL_SSL", "sasl.username": "worker"}) == "User:worker"
    assert principal_of({"security.protocol": "SSL", "sasl.username": "worker"}) is None
    assert principal_of({}) is None


def test_transactional_id_refusal_names_the_group_of_the_grant() -> None:
    conf = {**producer_config(WorkerOptions(worker_id="w-no-3"), "fifolane-flights"),
            "security.protocol": "SASL_SSL", "sasl.username": "worker"}
    assert _txn_denied(conf) == (
        "the worker cannot start: User:worker lacks WRITE on transactional id 'fifolane-flights-w-no-3'; "
        "grant them (`fifolane acls apply --role worker --principal User:worker --group-id "
        "fifolane-flights`, docs/security.md)")
    assert _txn_denied({"transactional.id": "x"}) == (
        "the worker cannot start: this worker's principal lacks WRITE on transactional id 'x'; grant them "
        "(`fifolane acls apply --role worker --principal User:<name>`, docs/security.md)")
