"""The words of security refusals: librdkafka's text cut to what the user needs, and the
transactional-id refusal naming the grant (end to end: tests/secure/test_refusals.py)."""

from __future__ import annotations

from confluent_kafka import KafkaError

from fifolane.access import is_login_error, kafka_said, login_refused, principal_of
from fifolane.errors import ConfigError, LoginRefusedError
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



SASL = {"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "worker", "ssl.ca.location": "/etc/ca.pem"}


def test_a_refused_login_names_the_principal_and_the_settings() -> None:
    wrong = KafkaError(KafkaError._AUTHENTICATION, "sasl_ssl://b:9093/bootstrap: SASL authentication error: "
                       "Authentication failed during authentication due to invalid credentials with SASL "
                       "mechanism SCRAM-SHA-512 (after 310ms in state AUTH_REQ)")
    assert is_login_error(wrong)
    err = login_refused(wrong, SASL)
    assert isinstance(err, LoginRefusedError) and isinstance(err, ConfigError)
    assert str(err) == ("Kafka at b:9093 refused the login of User:worker (SCRAM-SHA-512): wrong user name or "
                        "password (FIFOLANE_SASL_USERNAME, FIFOLANE_SASL_PASSWORD)")
    other = KafkaError(KafkaError._AUTHENTICATION, "SASL handshake failed: unsupported mechanism")
    assert str(login_refused(other, {"bootstrap.servers": "b:9093"})) == (
        "Kafka at b:9093 refused the login of this client: SASL handshake failed: unsupported mechanism; "
        "check FIFOLANE_SASL_MECHANISM and FIFOLANE_SECURITY_PROTOCOL")


def test_a_refused_tls_handshake_names_the_ca_setting() -> None:
    untrusted = KafkaError(KafkaError._SSL, "ssl://b:9093/bootstrap: SSL handshake failed: error:0A000086:SSL "
                           "routines::certificate verify failed: broker certificate could not be verified")
    assert str(login_refused(untrusted, SASL)) == (
        "the TLS handshake with Kafka at b:9093 failed: the broker's certificate is not signed by a CA in "
        "FIFOLANE_SSL_CA_LOCATION (/etc/ca.pem); set it to the CA that signed the brokers' certificates "
        "(`fifolane kafka up --secure` prints it)")
    assert not is_login_error(KafkaError(KafkaError._TRANSPORT, "Connection refused"))

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
