"""On the secured broker, what is not allowed is refused at once, with the missing permission
named: a wrong password, an untrusted broker certificate, a registration without registry
write, output topics that are role topics / used for something else / not writable, a worker
without its state topic, parked topic, consumer group or transactional id."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from kafka_fixtures import consume_all, wait_until
from secure_support import SecureSetup, error_line, run_cli
from worker_support import WorkerThread, reservation, send_events, wait_accounted

from fifolane.acls import role_grants
from fifolane.config import Settings
from fifolane.errors import ListenerError, WorkerError
from fifolane.topics import create_topic
from listeners.model import ListenerSpec
from listeners.registry import _write, get_listener, register
from listeners.runtime import ListenerRuntime

pytestmark = pytest.mark.integration


def test_wrong_password_is_refused_clearly(secure: SecureSetup) -> None:
    secure.grant("worker", "worker")
    wrong = secure.as_user("worker", "not-the-password")
    refused = (f"Kafka at {wrong.bootstrap_servers} refused the login of User:worker (SCRAM-SHA-512): "
               f"wrong user name or password (FIFOLANE_SASL_USERNAME, FIFOLANE_SASL_PASSWORD)")
    started = time.monotonic()
    worker = WorkerThread(wrong, worker_id="w-wrong").worker
    with pytest.raises(WorkerError) as caught:
        worker.connect()
    assert str(caught.value) == f"the worker cannot start: {refused}"
    assert worker.consumer is None  # the check comes before any client is made
    assert time.monotonic() - started < 15  # at the first refusal, not after a time-out

    done = run_cli(wrong, "worker", "--worker-id", "w-wrong")  # exits: no retry loop
    assert done.returncode == 2
    assert error_line(done.stderr) == f"error: the worker cannot start: {refused}"
    done = run_cli(wrong, "listeners", "list")
    assert done.returncode == 2
    assert error_line(done.stderr) == f"error: {refused}"


def test_an_untrusted_broker_certificate_is_refused_clearly(secure: SecureSetup) -> None:
    # The system's CAs, not the one that signed the broker's certificate.
    system_cas = "/etc/ssl/certs/ca-certificates.crt"
    other = secure.as_user("listener-admin").with_overrides(ssl_ca_location=system_cas)
    done = run_cli(other, "listeners", "list")
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        f"error: the TLS handshake with Kafka at {other.bootstrap_servers} failed: the broker's certificate "
        f"is not signed by a CA in FIFOLANE_SSL_CA_LOCATION ({system_cas}); set it to the CA that signed the "
        f"brokers' certificates (`fifolane kafka up --secure` prints it)")


def test_a_principal_without_registry_write_cannot_register(secure: SecureSetup) -> None:
    # The reader of one listener may read the registry, but without renewals not write it.
    secure.grant("listener-reader", "listener-reader", listener="big", renew=False)
    reader = secure.as_user("listener-reader")
    done = run_cli(reader, "listeners", "add", "sneaky", "--filter", "true")
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        f"error: User:listener-reader may not register or remove listeners: it lacks WRITE on the "
        f"registry topic {reader.registry_topic!r}; an administrator can grant it with `fifolane acls "
        f"apply --role listener-admin --principal User:listener-reader` (docs/security.md)")
    nobody = secure.new_user("nobody")
    done = run_cli(nobody, "listeners", "list")
    assert done.returncode == 2
    assert error_line(done.stderr) == (f"error: User:nobody may not read listener registrations: it lacks READ "
                                   f"on the registry topic {nobody.registry_topic!r} (docs/security.md)")
    # Nothing was written: the admin sees no registration.
    done = run_cli(secure.admin, "listeners", "list")
    assert done.returncode == 0 and done.stdout == ""


def test_output_topics_are_checked_at_registration(secure: SecureSetup) -> None:
    s = secure.admin
    secure.grant("listener-admin", "listener-admin", output_prefixes=[f"{s.input_topic}.out."])
    ladmin = secure.as_user("listener-admin")
    roles = {"input": s.input_topic, "state": s.state_topic, "registry": s.registry_topic,
             "dead-letter": s.dlq_topic, "entity directory": s.directory_topic, "parked": s.parked_topic}
    for role, topic in roles.items():
        message = (f"output topic {topic!r} is the pipeline's {role} topic: notifications may not be "
                   f"written into the pipeline's own topics; choose another output topic")
        with pytest.raises(ListenerError) as caught:
            register(ladmin, ListenerSpec(f"to-{role.replace(' ', '-')}", "true", output_topic=topic))
        assert str(caught.value) == message
    done = run_cli(ladmin, "listeners", "add", "loop", "--filter", "true", "--output", s.input_topic)
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        f"error: output topic {s.input_topic!r} is the pipeline's input topic: notifications may not be "
        f"written into the pipeline's own topics; choose another output topic")
    with pytest.raises(ListenerError, match="^output topic '__consumer_offsets' is one of Kafka's internal"):
        register(ladmin, ListenerSpec("internal", "true", output_topic="__consumer_offsets"))
    # Not one its principal may write (or create): refused, naming the permission.
    done = run_cli(ladmin, "listeners", "add", "elsewhere", "--filter", "true", "--output", "payments")
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        "error: User:listener-admin may not name output topic 'payments': it lacks WRITE on topic "
        "'payments'; a listener's output topic must be one its registering principal may write; an "
        "administrator can grant it with `fifolane acls apply --role listener-admin --principal "
        "User:listener-admin --output payments` (docs/security.md)")
    # Topics used for something else (the admin may see them): a table, other records.
    table = f"{s.input_topic}.table"
    create_topic(s, table, 1, {"cleanup.policy": "compact"})
    done = run_cli(s, "listeners", "add", "into-table", "--filter", "true", "--output", table)
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        f"error: output topic {table!r} is compacted (cleanup.policy=compact): it holds a table or "
        f"changelog, not notifications; choose another output topic")
    other = f"{s.input_topic}.payments"
    create_topic(s, other, 1, {"cleanup.policy": "delete"})
    producer = Producer(s.kafka_config())
    producer.produce(other, b'{"amount": 1}', b"p1")
    assert producer.flush(30) == 0
    done = run_cli(s, "listeners", "add", "into-payments", "--filter", "true", "--output", other)
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        f"error: output topic {other!r} already holds records that are not listener notifications "
        f"(no fifolane.listener header): it is used for something else; choose another output topic")
    # Allowed: a topic under the granted prefix (created), and the registration carries its principal.
    mine = f"{s.input_topic}.out.big"
    done = run_cli(ladmin, "listeners", "add", "big", "--filter", "value.amount > 500.0", "--output", mine)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"listener 'big' registered by User:listener-admin; output topic {mine}"
    done = run_cli(ladmin, "listeners", "describe", "big")
    assert done.returncode == 0
    assert f"{'principal':<22} User:listener-admin" in done.stdout.splitlines()
    assert get_listener(s, "big").principal == "User:listener-admin"
    # A reader granted another output topic may not read this one, and is told which ACL to ask for.
    secure.grant("listener-reader", "listener-reader", listener="big")
    done = run_cli(secure.as_user("listener-reader"), "listen", "big", "--timeout", "1")
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        f"error: User:listener-reader may not read listener 'big': it lacks READ on its output topic {mine!r}; "
        f"an administrator can grant it with `fifolane acls apply --role listener-reader --principal "
        f"User:listener-reader --listener big --output {mine}`")
    assert {r.split()[0] for r in run_cli(s, "listeners", "list").stdout.splitlines()} == {"big"}


def test_worker_without_the_state_topic_stops_at_start_up(secure: SecureSetup) -> None:
    s = secure.admin
    user = _worker_user(secure, "worker-no-state", without=s.state_topic)
    done = run_cli(user, "worker", "--worker-id", "w-nostate", timeout=60)  # exits: no retry loop
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        f"error: the worker cannot start: User:worker-no-state lacks READ on topic {s.state_topic!r}, WRITE "
        f"on topic {s.state_topic!r}, DESCRIBE_CONFIGS on topic {s.state_topic!r}; grant them (`fifolane "
        f"acls apply --role worker --principal User:worker-no-state --group-id fifolane-table`, "
        f"docs/security.md)")
    # With --on-failure park the worker also needs the parked topic.
    user = _worker_user(secure, "worker-no-parked", without=s.parked_topic)
    done = run_cli(user, "worker", "--worker-id", "w-nopark", "--on-failure", "park", timeout=60)
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        f"error: the worker cannot start: User:worker-no-parked lacks READ on topic {s.parked_topic!r}, WRITE "
        f"on topic {s.parked_topic!r}, DESCRIBE_CONFIGS on topic {s.parked_topic!r}; grant them (`fifolane "
        f"acls apply --role worker --principal User:worker-no-parked --group-id fifolane-table`, "
        f"docs/security.md)")


def test_workers_refuse_a_role_topic_written_into_the_registry_by_hand(
        secure: SecureSetup, caplog: pytest.LogCaptureFixture) -> None:
    s = secure.admin
    secure.grant("worker", "worker")
    ws = secure.as_user("worker")
    # Written past `fifolane listeners add` (as an admin could): a loop into the input topic.
    _write(s, "loop", ListenerSpec("loop", "true", output_topic=s.input_topic).to_json())
    _write(s, "fine", ListenerSpec("fine", "true").to_json())
    events = [("reservation", reservation(f"R{i}", f"F{i % 3}", 1), "upsert") for i in range(30)]
    n = send_events(s, events)
    runtime = ListenerRuntime(ws)
    with caplog.at_level(logging.WARNING, logger="listeners.runtime"), \
            WorkerThread(ws, worker_id="w-loop", listeners=runtime) as w:
        wait_accounted([w], n)
        wait_until(lambda: runtime.live_sent >= n, message=lambda: f"{runtime.live_sent} notifications")
        assert runtime.names() == ["fine"]
    assert (f"listener 'loop' not activated: output topic {s.input_topic!r} is the pipeline's input topic: "
            f"notifications may not be written into the pipeline's own topics; choose another output "
            f"topic") in caplog.messages
    assert len(consume_all(s, s.input_topic)) == n  # nothing came back as input
    notes: list[Any] = consume_all(s, s.listener_output_topic)
    assert {m.headers()[0][1] for m in notes} == {b"fine"} and len(notes) == n


def _worker_user(secure: SecureSetup, name: str, *, without: str) -> Settings:
    """A new user with the worker role's ACLs except those on resource ``without``."""
    user = secure.new_user(name)
    kept = [g for g in role_grants("worker", secure.admin) if g.name != without]
    admin = AdminClient(secure.admin.kafka_config())
    for future in admin.create_acls([g.binding(f"User:{name}") for g in kept]).values():
        future.result()
    return user


def test_worker_without_its_group_or_transactional_id_stops_at_start_up(secure: SecureSetup) -> None:
    user = _worker_user(secure, "worker-no-group", without="fifolane-table")
    done = run_cli(user, "worker", "--worker-id", "w-nogroup", timeout=60)
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        "error: the worker cannot start: User:worker-no-group lacks READ on consumer group 'fifolane-table'; "
        "grant them (`fifolane acls apply --role worker --principal User:worker-no-group --group-id "
        "fifolane-table`, docs/security.md)")
    user = _worker_user(secure, "worker-no-txn", without="fifolane-table-")
    done = run_cli(user, "worker", "--worker-id", "w-notxn", timeout=90)
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        "error: the worker cannot start: User:worker-no-txn lacks WRITE on transactional id "
        "'fifolane-table-w-notxn'; grant them (`fifolane acls apply --role worker --principal "
        "User:worker-no-txn --group-id fifolane-table`, docs/security.md)")
