"""The roles' ACLs are exactly the groups, transactional ids and topics fifolane's code uses;
`kafka up --secure` prints working client settings; `acls apply` works as the admin only."""

from __future__ import annotations

import pytest
from secure_support import SecureSetup, cli_env, error_line, run_cli

from fifolane.acls import role_grants
from fifolane.config import Settings
from listeners.outputs import role_topic_problem
from services.worker.clients import consumer_config, producer_config
from services.worker.options import WorkerOptions

pytestmark = pytest.mark.integration

S = Settings(bootstrap_servers="x:1", input_topic="in", state_topic="st", registry_topic="reg", dlq_topic="dlq",
             listener_output_topic="notes", directory_topic="dir", parked_topic="park")


def _table(role: str, **options: object) -> set[tuple[str, str, str, bool]]:
    return {(g.resource, g.name, g.operation, g.prefixed) for g in role_grants(role, S, **options)}  # type: ignore[arg-type]


def test_the_worker_role_matches_the_ids_the_worker_uses() -> None:
    opts = WorkerOptions(worker_id="w7")
    group = "fifolane-flights"
    assert consumer_config(opts, group)["group.id"] == group
    txn = producer_config(opts, group)["transactional.id"]
    grants = _table("worker", app="flights")
    (prefix,) = [name for (kind, name, _op, pre) in grants if kind == "transactional_id" and pre]
    assert txn.startswith(prefix) and prefix == f"{group}-"
    assert grants == {
        *{("topic", t, op, False) for t in ("in", "st", "dir") for op in ("READ", "WRITE", "DESCRIBE_CONFIGS")},
        ("topic", "dlq", "WRITE", False), ("topic", "dlq", "DESCRIBE_CONFIGS", False),
        *{("topic", "park", op, False) for op in ("READ", "WRITE", "DESCRIBE_CONFIGS")},
        ("topic", "reg", "READ", False), ("topic", "reg", "WRITE", False),
        ("topic", "notes", "WRITE", False), ("topic", "notes", "DESCRIBE_CONFIGS", False),
        ("topic", S.members_topic, "READ", False), ("topic", S.members_topic, "WRITE", False),
        ("group", group, "READ", False), ("group", "fifolane-restore-", "READ", True),
        ("group", "fifolane-registry-", "READ", True), ("group", "fifolane-parked-", "READ", True),
        ("transactional_id", f"{group}-", "WRITE", True),
    }
    assert ("group", "fifolane-g", "READ", False) in _table("worker", group_id="fifolane-g")


def test_the_other_roles() -> None:
    assert _table("producer") == {("topic", "in", "WRITE", False)}
    assert _table("listener-admin", output_prefixes=["out."]) == {
        ("topic", "reg", "READ", False), ("topic", "reg", "WRITE", False), ("topic", "in", "DESCRIBE", False),
        *{("topic", "out.", op, True) for op in ("CREATE", "WRITE", "DESCRIBE_CONFIGS")},
        ("group", "fifolane-registry-", "READ", True),
    }
    reader = _table("listener-reader", listener="big", renew=False)
    assert reader == {("topic", "notes", "READ", False), ("topic", "reg", "READ", False),
                      ("group", "fifolane-listen-big-", "READ", True), ("group", "fifolane-registry-", "READ", True)}
    assert ("topic", "reg", "WRITE", False) in _table("listener-reader", listener="big")  # renewals
    assert _table("spark") == {("topic", "st", "READ", False), ("topic", "st", "DESCRIBE_CONFIGS", False),
                               ("group", "fifolane-views", "READ", True)}


def test_role_topics_are_no_output_topics() -> None:
    for topic in ("in", "st", "reg", "dlq", "dir", "park", "__consumer_offsets"):
        assert role_topic_problem(S, topic) is not None, topic
    assert role_topic_problem(S, "notes") is None
    assert role_topic_problem(S, "in.out") is None


def test_kafka_up_secure_prints_settings_that_work(secure: SecureSetup) -> None:
    home = secure.cluster.home
    env_settings = secure.admin.with_overrides(home=home)
    done = run_cli(env_settings, "kafka", "up", "--secure")  # running already: settings again
    assert done.returncode == 0, done.stderr
    files = secure.cluster.secure_files
    assert done.stdout.splitlines() == [
        f"export FIFOLANE_BOOTSTRAP_SERVERS={secure.cluster.bootstrap_servers}",
        "export FIFOLANE_SECURITY_PROTOCOL=SASL_SSL",
        "export FIFOLANE_SASL_MECHANISM=SCRAM-SHA-512",
        "export FIFOLANE_SASL_USERNAME=admin",
        f"export FIFOLANE_SASL_PASSWORD={files.users()['admin']}",
        f"export FIFOLANE_SSL_CA_LOCATION={files.ca_pem}",
    ]
    assert (home / "kafka" / "secure" / "clients" / "worker.toml").stat().st_mode & 0o077 == 0
    # acls apply: the admin may; a role user may not, and is told so.
    done = run_cli(secure.admin, "acls", "apply", "--role", "producer", "--principal", "User:producer")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"allowed User:producer: {'WRITE on topic ' + secure.admin.input_topic:<60} "
                                   "(fifolane produce / EventProducer: send events)")
    assert f"ALLOW  User:producer                WRITE             topic {secure.admin.input_topic}" in \
        run_cli(secure.admin, "acls", "list", "--principal", "User:producer").stdout.splitlines()
    done = run_cli(secure.as_user("worker"), "acls", "apply", "--role", "producer", "--principal", "User:worker")
    assert done.returncode == 2
    assert error_line(done.stderr) == (
        "error: creating the producer ACLs for User:worker refused: worker lacks ALTER on the cluster: run it "
        "as an administrator (the admin user of `fifolane kafka up --secure`)")
    assert cli_env(secure.admin)["FIFOLANE_SASL_USERNAME"] == "admin"
