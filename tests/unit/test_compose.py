"""docker-compose.yml, Dockerfile and .dockerignore agree with the code (no Docker needed)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from fifolane.cli import _COMMANDS
from fifolane.config import PROJECT_ROOT, Settings

COMPOSE = PROJECT_ROOT / "docker-compose.yml"
DOCKERFILE = PROJECT_ROOT / "Dockerfile"
# Compose-only interpolation variables (never passed into a container's environment).
COMPOSE_ONLY_VARS = {"FIFOLANE_WORKERS"}
KAFKA_SERVICES = {"kafka-1", "kafka-2", "kafka-3", "kafka-single"}
SPARK_SERVICES = {"spark-master", "spark-worker", "views-volume", "spark-views"}
SECURE_SERVICES = {"secure-files", "kafka-secure", "secure-setup", "worker-secure"}
#: FIFOLANE_* variables of containers that are not Settings fields: the settings file.
NON_FIELD_VARS = {"FIFOLANE_CONFIG"}
APICURIO_POM = PROJECT_ROOT / "tests" / "registry" / "pom.xml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


def _dockerfile_entrypoint() -> list[str]:
    match = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, "Dockerfile has no exec-form ENTRYPOINT"
    return list(json.loads(match.group(1)))


def _argv(service: dict[str, Any]) -> list[str]:
    entrypoint = service.get("entrypoint", _dockerfile_entrypoint())
    return list(entrypoint) + list(service.get("command", []))


def _resolve_cli(args: list[str]) -> click.Context | None:
    """Parse ``fifolane <args>`` with the real click commands (None if the module is not there yet)."""
    name, rest = args[0], args[1:]
    assert name in _COMMANDS, f"`fifolane {name}` is not a fifolane command ({sorted(_COMMANDS)})"
    module_name, attr = _COMMANDS[name].split(":")
    if importlib.util.find_spec(module_name) is None:
        return None
    command: click.Command = getattr(importlib.import_module(module_name), attr)
    path = f"fifolane {name}"
    while isinstance(command, click.Group):
        sub = command.get_command(click.Context(command), rest[0])
        assert sub is not None, f"`{path} {rest[0]}` does not exist"
        path, command, rest = f"{path} {rest[0]}", sub, rest[1:]
    return command.make_context(path, list(rest))  # raises click.UsageError on a bad option


def test_service_names(services: dict[str, Any]) -> None:
    assert set(services) == KAFKA_SERVICES | SPARK_SERVICES | SECURE_SERVICES | {"topics", "worker", "schema-registry"}


def test_profiles_pick_the_kafka_layout(services: dict[str, Any]) -> None:
    for name in ("kafka-1", "kafka-2", "kafka-3"):
        assert services[name]["profiles"] == ["cluster"]
    assert services["kafka-single"]["profiles"] == ["single"]
    for name in SPARK_SERVICES:
        assert services[name]["profiles"] == ["views"], name
    assert services["schema-registry"]["profiles"] == ["registry"]
    for name in SECURE_SERVICES:
        assert services[name]["profiles"] == ["secure"], name
    # the plain topics and workers run with a plain layout only (never against the secure broker)
    assert services["topics"]["profiles"] == services["worker"]["profiles"] == ["cluster", "single"]
    # the services that need Kafka start with either layout
    deps = services["topics"]["depends_on"]
    assert set(deps) == KAFKA_SERVICES
    assert all(d["required"] is False and d["condition"] == "service_healthy" for d in deps.values())


def test_kafka_is_the_official_image_in_kraft_mode(services: dict[str, Any]) -> None:
    for name in KAFKA_SERVICES:
        env = services[name]["environment"]
        assert services[name]["image"] == "apache/kafka:4.1.1"
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert "CLUSTER_ID" in env
    cluster = services["kafka-1"]["environment"]
    assert cluster["KAFKA_DEFAULT_REPLICATION_FACTOR"] == 3 and cluster["KAFKA_MIN_INSYNC_REPLICAS"] == 2
    assert cluster["KAFKA_CONTROLLER_QUORUM_VOTERS"].count("@") == 3
    single = services["kafka-single"]["environment"]
    assert single["KAFKA_DEFAULT_REPLICATION_FACTOR"] == 1 and single["KAFKA_CONTROLLER_QUORUM_VOTERS"].count("@") == 1
    ids = [services[n]["environment"]["KAFKA_NODE_ID"] for n in ("kafka-1", "kafka-2", "kafka-3")]
    assert sorted(ids) == [1, 2, 3]


def test_broker_data_lives_on_named_volumes(compose: dict[str, Any], services: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    for name in KAFKA_SERVICES:
        (volume,) = services[name]["volumes"]
        source, target = volume.split(":")
        assert source in declared
        assert target == services[name]["environment"]["KAFKA_LOG_DIRS"]


def test_every_fifolane_env_var_is_a_setting(services: dict[str, Any]) -> None:
    fields = {f"FIFOLANE_{name.upper()}" for name in Settings.model_fields}
    for name, service in services.items():
        for key in service.get("environment", {}):
            if key.startswith("FIFOLANE_"):
                assert key in fields | NON_FIELD_VARS, f"{name}: {key} is not a Settings field"
    used = set(re.findall(r"\$\{(FIFOLANE_[A-Z_]+)", COMPOSE.read_text()))
    unknown = used - fields - COMPOSE_ONLY_VARS
    assert not unknown, f"interpolated variables that are not settings: {unknown}"


def test_commands_are_real_cli_commands(services: dict[str, Any]) -> None:
    topics = _argv(services["topics"])
    assert topics[0] == "fifolane"
    ctx = _resolve_cli(topics[1:])
    assert ctx is not None and ctx.params["replication_factor"] == -1

    views = _argv(services["spark-views"])
    assert views[:3] == ["fifolane", "views", "build"]
    _resolve_cli(views[1:])  # fully checked once fifolane.cli.views exists


def test_worker_image_runs_the_worker_cli(services: dict[str, Any]) -> None:
    assert _dockerfile_entrypoint() == ["python", "-m", "services.worker"]
    assert "FROM python:3.11-slim" in DOCKERFILE.read_text()
    worker = services["worker"]
    assert worker["deploy"]["replicas"] == "${FIFOLANE_WORKERS:-2}"
    assert worker["depends_on"]["topics"]["condition"] == "service_completed_successfully"
    from fifolane.cli.worker import worker as worker_cli

    ctx = worker_cli.make_context("worker", list(worker["command"]))
    assert ctx.params["metrics_port"] == 9100
    assert "9100" in " ".join(worker["healthcheck"]["test"])


def test_long_running_services_have_health_checks(services: dict[str, Any]) -> None:
    for name in KAFKA_SERVICES | {"worker", "spark-views", "spark-master", "spark-worker", "schema-registry",
                                  "kafka-secure", "worker-secure"}:
        check = services[name].get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), f"{name} has no health check"


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = (PROJECT_ROOT / ".dockerignore").read_text().split()
    for pattern in (".fifolane", ".venv", "*.jar", ".git"):
        assert pattern in ignored


def test_compose_file_is_valid_yaml_with_no_tabs() -> None:
    assert "\t" not in Path(COMPOSE).read_text()


# --- Spark standalone cluster and the views job ------------------------------------------------
def _uid_of_the_fifolane_image() -> str:
    match = re.search(r"useradd .*--uid (\d+) fifolane", DOCKERFILE.read_text())
    assert match, "Dockerfile: no fifolane user with a fixed uid"
    return match.group(1)


def test_spark_cluster_is_the_official_image_at_the_pinned_version(services: dict[str, Any]) -> None:
    from spark.packages import SPARK_VERSION

    for name in ("spark-master", "spark-worker", "views-volume"):
        assert services[name]["image"] == f"apache/spark:{SPARK_VERSION}", name
    master = services["spark-master"]
    assert master["command"][:2] == ["/opt/spark/bin/spark-class", "org.apache.spark.deploy.master.Master"]
    args = master["command"][2:]
    assert args[args.index("--host") + 1] == master["hostname"] == "spark-master"
    assert args[args.index("--port") + 1] == "7077"
    assert master["ports"] == [f"8080:{args[args.index('--webui-port') + 1]}"]
    assert "8080/json/" in master["healthcheck"]["test"][1]


def test_spark_workers_scale_and_join_the_master_the_views_job_submits_to(services: dict[str, Any]) -> None:
    worker, views = services["spark-worker"], services["spark-views"]
    assert worker["command"][:2] == ["/opt/spark/bin/spark-class", "org.apache.spark.deploy.worker.Worker"]
    # --scale spark-worker=N needs replicas without fixed names or host ports
    assert not {"container_name", "hostname", "ports"} & set(worker)
    master_url = worker["command"][-1]
    assert master_url == "spark://spark-master:7077"
    assert worker["depends_on"]["spark-master"]["condition"] == "service_healthy"
    assert master_url in worker["healthcheck"]["test"][1]
    # The job takes its master from the setting, default: this cluster.
    assert views["environment"]["FIFOLANE_SPARK_MASTER"] == "${FIFOLANE_SPARK_MASTER:-" + master_url + "}"
    assert "--master" not in views["command"]
    assert views["depends_on"]["spark-worker"]["condition"] == "service_healthy"
    ctx = _resolve_cli(_argv(views)[1:])
    assert ctx is not None and ctx.params["master"] is None and str(ctx.params["out"]) == "/data/views"
    assert views["build"]["args"]["EXTRAS"] == "spark"  # pyspark (the pinned version) in the image


def test_driver_and_executors_share_the_output_folder_as_one_user(services: dict[str, Any]) -> None:
    worker, views, init = services["spark-worker"], services["spark-views"], services["views-volume"]
    out = str(_resolve_cli(_argv(views)[1:]).params["out"])  # type: ignore[union-attr]
    shared = [v for v in views["volumes"] if v.startswith("views:")]
    assert shared == [v for v in worker["volumes"] if v.startswith("views:")] == init["volumes"]
    mount = shared[0].split(":")[1]
    assert out.startswith(mount + "/")
    uid = _uid_of_the_fifolane_image()
    assert worker["user"] == f"{uid}:{uid}"
    assert init["entrypoint"] == ["chown", f"{uid}:{uid}", mount]
    assert worker["depends_on"]["views-volume"]["condition"] == "service_completed_successfully"


def test_schema_registry_is_apicurio_at_the_tested_version(compose: dict[str, Any], services: dict[str, Any]) -> None:
    version = re.search(r"<apicurio.version>([^<]+)</apicurio.version>", APICURIO_POM.read_text())
    assert version, "tests/registry/pom.xml: no apicurio.version"
    registry = services["schema-registry"]
    assert registry["image"] == f"apicurio/apicurio-registry:{version.group(1)}"
    assert registry["environment"]["APICURIO_STORAGE_KIND"] == "kafkasql"
    assert set(registry["depends_on"]) == KAFKA_SERVICES
    url = "http://schema-registry:8080/apis/ccompat/v7"  # what the file's header tells users to set
    assert url in COMPOSE.read_text() and registry["hostname"] == "schema-registry"
    assert "8080/apis/ccompat/v7" in registry["healthcheck"]["test"][1]
    env = compose["x-fifolane-env"]
    assert env["FIFOLANE_SCHEMA_REGISTRY_URL"] == "${FIFOLANE_SCHEMA_REGISTRY_URL:-}"  # unset: single-object


# --- the secure profile -------------------------------------------------------------------
def _shell_commands(service: dict[str, Any]) -> list[list[str]]:
    """The `&&`-joined commands of an ``sh -c`` service, each as argv."""
    assert service["entrypoint"] == ["sh", "-c"]
    (script,) = service["command"]
    return [shlex.split(part) for part in script.split("&&")]


def test_secure_setup_creates_topics_and_roles_with_real_cli_commands(services: dict[str, Any]) -> None:
    from fifolane.acls import ROLES
    from fifolane.cluster.secure import DEFAULT_USERS

    setup = services["secure-setup"]
    commands = _shell_commands(setup)
    assert commands[0] == ["fifolane", "topics", "create", "--replication-factor", "-1"]
    granted = {}
    for argv in commands:
        assert argv[0] == "fifolane"
        ctx = _resolve_cli(argv[1:])
        assert ctx is not None
        if argv[1] == "acls":
            granted[ctx.params["role"]] = ctx.params["principal"]
    # every role but the per-listener reader, each to the user of its name (made by secure-files)
    assert granted == {r: f"User:{r}" for r in ROLES if r != "listener-reader"}
    assert set(granted) <= set(DEFAULT_USERS)
    assert setup["environment"]["FIFOLANE_CONFIG"] == "/secrets/clients/admin.toml"
    assert services["worker-secure"]["environment"]["FIFOLANE_CONFIG"] == "/secrets/clients/worker.toml"
    assert services["worker-secure"]["depends_on"]["secure-setup"]["condition"] == "service_completed_successfully"
    for name in ("secure-setup", "worker-secure"):
        assert services[name]["environment"]["FIFOLANE_BOOTSTRAP_SERVERS"] == "kafka-secure:9092"
        assert "secure-files:/secrets:ro" in services[name]["volumes"]


def test_secure_broker_runs_the_files_secure_files_writes(services: dict[str, Any], tmp_path: Path) -> None:
    """Run the secure-files command for real (keytool) and check what the broker uses."""
    from click.testing import CliRunner

    from fifolane.cli.kafka import kafka

    files, broker = services["secure-files"], services["kafka-secure"]
    (argv, chown, chmod) = _shell_commands(files)
    assert chown == ["chown", "-R", "1000:1000", "/secrets"] and chmod == ["chmod", "-R", "a+rX", "/secrets"]
    assert files["volumes"] == ["secure-files:/secrets"] and "secure-files:/secrets:ro" in broker["volumes"]
    ctx = _resolve_cli(argv[1:])
    assert ctx is not None and str(ctx.params["out"]) == "/secrets"
    host = ctx.params["hosts"][0]
    assert host == broker["hostname"] == "kafka-secure"
    out = tmp_path / "secrets"
    out.mkdir()  # a volume's mount point: it exists, and cannot be replaced
    args = [a if a != "/secrets" else str(out) for a in argv[2:]]
    result = CliRunner().invoke(kafka, args)
    assert result.exit_code == 0, result.output
    props = dict(line.split("=", 1) for line in (out / "server.properties").read_text().splitlines())
    assert props["advertised.listeners"] == f"CLIENT://{host}:9092,HOST://localhost:29092"
    assert broker["ports"] == ["29092:19092"] and ":19092" in props["listeners"]
    assert props["listener.security.protocol.map"] == "CLIENT:SASL_SSL,CONTROLLER:SASL_PLAINTEXT,HOST:SASL_SSL"
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["log.dirs"] == "/var/lib/kafka/data" and "kafka-secure-data:/var/lib/kafka/data" in broker["volumes"]
    for key in ("ssl.keystore.location", "ssl.truststore.location"):  # files of the volume
        assert Path(props[key]).parent == out and Path(props[key]).is_file()
    script = broker["command"][0]
    for used in ("/secrets/server.properties", "/secrets/format-args"):
        assert used in script and (out / Path(used).name).is_file()
    assert (out / "format-args").read_text().count("--add-scram SCRAM-SHA-512=[name=") == 7
    health = " ".join(broker["healthcheck"]["test"])
    assert "--command-config /secrets/clients/admin.properties" in health and f"{host}:9092" in health
    assert (out / "clients" / "admin.properties").is_file()
    admin = (out / "clients" / "admin.toml").read_text()
    assert 'bootstrap_servers = "kafka-secure:9092"' in admin and 'sasl_username = "admin"' in admin
    assert f'ssl_ca_location = "{out / "ca.pem"}"' in admin
