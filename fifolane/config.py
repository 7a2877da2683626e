"""Settings: one typed, frozen model read from ``FIFOLANE_*`` env vars and an optional TOML file.

Precedence (highest first): explicit keyword arguments, environment (``FIFOLANE_<FIELD>``),
the TOML file named by ``FIFOLANE_CONFIG`` (or ``./fifolane.toml`` if present), defaults.
Unknown keys are refused, in the TOML file and in ``FIFOLANE_*`` variables alike.

Kafka connection settings are mapped to librdkafka's dotted keys in exactly one place:
:meth:`Settings.kafka_config`.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from fifolane.errors import ConfigError

__all__ = ["PROJECT_ROOT", "Settings", "load_settings"]

PROJECT_ROOT = Path(__file__).resolve().parents[1]
ENV_PREFIX = "FIFOLANE_"
# Env vars with the prefix that are not settings fields (read by other parts of the project).
_NON_SETTINGS_ENV = {
    "CONFIG", "TEST_BOOTSTRAP", "TEST_BROKERS", "LOG_LEVEL", "BENCH_QUICK", "FAIL_ON_SKIP", "WORKERS",
    "FAULTS_LONG", "FAULTS_SEED", "BENCH_WARM_BROKER", "COMPILED",
}


class _TomlSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.path = path

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if self.path is None:
            return {}
        try:
            with self.path.open("rb") as fh:
                data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {self.path}: {exc}") from exc
        # Accept both a flat file and one with a [fifolane] table.
        section = data.get("fifolane", data)
        if not isinstance(section, dict):
            raise ConfigError(f"{self.path}: [fifolane] must be a table")
        return section


class Settings(BaseSettings):
    """Everything a fifolane process needs to reach Kafka and find its topics."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        case_sensitive=False,
    )

    # --- connection -----------------------------------------------------------------
    bootstrap_servers: str | None = Field(
        default=None,
        description="Kafka bootstrap servers; unset means the local cluster from `fifolane kafka up`.",
    )
    security_protocol: str | None = None
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    librdkafka: dict[str, str] = Field(
        default_factory=dict,
        description="Extra librdkafka properties passed through untouched (JSON in env).",
    )
    schema_registry_url: str | None = Field(
        default=None,
        description="Confluent Schema Registry URL; set = Confluent wire format, unset = Avro single-object encoding.",
    )

    # --- topics (roles are a contract: input, state, registry, dead-letter) ---------------
    input_topic: str = "fifolane.events"
    state_topic: str = "fifolane.state"
    registry_topic: str = "fifolane.listeners"
    dlq_topic: str = "fifolane.dlq"
    listener_output_topic: str = "fifolane.notifications"
    parked_topic: str = Field(
        default="fifolane.parked",
        description="Parked groups and their held events (compacted; --on-failure park).",
    )
    directory_topic: str = Field(
        default="fifolane.directory",
        description="Entity directory (compacted): where each entity lives, so an entity can "
        "change its FIFO group across partitions.",
    )
    members_topic: str = Field(
        default="fifolane.members",
        description="Workers' query addresses (compacted, 1 partition): where clients of the "
        "query API (fifolane get/scan, StateClient) find the owner of a partition.",
    )
    state_headers: bool = Field(
        default=False,
        description="Also put fifolane.type/group/version headers on state-topic upserts "
        "(tombstones always carry them; upserts have group and version in the value).",
    )
    partitions: int = Field(default=6, ge=1)
    replication_factor: int = Field(
        default=-1,
        description="Replication factor of the topics fifolane creates; -1 (the default) means the "
        "brokers' default.replication.factor, so one setting fits 1 broker and 3.",
    )

    # --- Spark views --------------------------------------------------------------------
    spark_master: str = Field(
        default="local[*]",
        description="Spark master URL of `fifolane views build` (local[*], spark://host:7077, ...).",
    )

    # --- local files ------------------------------------------------------------------
    home: Path = Field(default=PROJECT_ROOT / ".fifolane", description="local cluster, caches, logs")
    schemas_dir: Path = PROJECT_ROOT / "schemas"

    @field_validator("librdkafka", mode="before")
    @classmethod
    def _parse_json_dict(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"librdkafka must be a JSON object: {exc}") from exc
        return value

    @field_validator("replication_factor")
    @classmethod
    def _check_replication_factor(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError(
                f"replication_factor must be >= 1, or -1 for the brokers' default.replication.factor; "
                f"got {value}"
            )
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = os.environ.get(ENV_PREFIX + "CONFIG")
        toml_path: Path | None = Path(path) if path else None
        if toml_path is None and Path("fifolane.toml").is_file():
            toml_path = Path("fifolane.toml")
        return (init_settings, env_settings, _TomlSource(settings_cls, toml_path))

    # ------------------------------------------------------------------------------------
    def resolved_bootstrap(self) -> str:
        """The bootstrap servers to use: configured ones, else the running local cluster."""
        if self.bootstrap_servers:
            return self.bootstrap_servers
        state = self.home / "kafka" / "cluster.json"
        if state.is_file():
            try:
                return str(json.loads(state.read_text())["bootstrap_servers"])
            except (ValueError, KeyError) as exc:
                raise ConfigError(f"corrupt local cluster state {state}: {exc}") from exc
        return "127.0.0.1:9092"

    def kafka_config(self, **overrides: Any) -> dict[str, Any]:
        """librdkafka configuration: the one place where snake_case maps to dotted keys."""
        # log_level 5 (notice): librdkafka's info lines stay out of the terminal, such as
        # "BGQUEUE Purging 1 unserved events", which an admin client logs when it is destroyed
        # right after an asynchronous request (describe configs or topics): its background
        # thread is still returning from the result's callback when the destroy's wake-up
        # arrives, and that wake-up is the one event left. FIFOLANE_LIBRDKAFKA can raise it.
        conf: dict[str, Any] = {"bootstrap.servers": self.resolved_bootstrap(), "log_level": 5}
        mapping = {
            "security.protocol": self.security_protocol,
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password.get_secret_value() if self.sasl_password else None,
            "ssl.ca.location": self.ssl_ca_location,
        }
        conf.update({k: v for k, v in mapping.items() if v is not None})
        conf.update(self.librdkafka)
        conf.update(overrides)
        return conf

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some fields changed (the model is frozen)."""
        return self.model_copy(update=changes)


def _check_unknown_env() -> None:
    known = {name.upper() for name in Settings.model_fields} | _NON_SETTINGS_ENV
    unknown = sorted(
        key[len(ENV_PREFIX):]
        for key in os.environ
        if key.upper().startswith(ENV_PREFIX) and key[len(ENV_PREFIX):].upper() not in known
    )
    if unknown:
        valid = ", ".join(sorted(ENV_PREFIX + n.upper() for n in Settings.model_fields))
        raise ConfigError(
            f"unknown setting(s) in environment: {', '.join(ENV_PREFIX + u for u in unknown)}; "
            f"valid: {valid}"
        )


def load_settings(**overrides: Any) -> Settings:
    """Load settings from env and TOML, refusing unknown keys with the list of valid ones."""
    _check_unknown_env()
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        valid = ", ".join(sorted(Settings.model_fields))
        raise ConfigError(f"invalid settings: {exc}\nvalid keys: {valid}") from exc
