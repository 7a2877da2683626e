"""docker-compose.yml, Dockerfile and .dockerignore agree with the code (no Docker needed)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
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
    assert set(services) == KAFKA_SERVICES | {"topics", "worker", "spark-views"}


def test_profiles_pick_the_kafka_layout(services: dict[str, Any]) -> None:
    for name in ("kafka-1", "kafka-2", "kafka-3"):
        assert services[name]["profiles"] == ["cluster"]
    assert services["kafka-single"]["profiles"] == ["single"]
    assert services["spark-views"]["profiles"] == ["views"]
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
                assert key in fields, f"{name}: {key} is not a Settings field"
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
    for name in KAFKA_SERVICES | {"worker", "spark-views"}:
        check = services[name].get("healthcheck")
        assert check and check["test"][0] in ("CMD", "CMD-SHELL"), f"{name} has no health check"


def test_dockerignore_keeps_local_state_out() -> None:
    ignored = (PROJECT_ROOT / ".dockerignore").read_text().split()
    for pattern in (".fifolane", ".venv", "*.jar", ".git"):
        assert pattern in ignored


def test_compose_file_is_valid_yaml_with_no_tabs() -> None:
    assert "\t" not in Path(COMPOSE).read_text()
