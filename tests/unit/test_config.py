"""Settings: precedence, refusal of unknown keys, the one librdkafka mapping, secrets."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fifolane.config import Settings, load_settings
from fifolane.errors import ConfigError
from services.worker.clients import consumer_config, producer_config
from services.worker.options import WorkerOptions
from services.worker.tuning import merged_config


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No FIFOLANE_* variables or ./fifolane.toml from the developer's shell leak in."""
    for key in list(os.environ):
        if key.upper().startswith("FIFOLANE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)


def _toml(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "conf.toml"
    path.write_text(text)
    monkeypatch.setenv("FIFOLANE_CONFIG", str(path))
    return path


def test_defaults() -> None:
    s = load_settings()
    assert s.input_topic == "fifolane.events"
    assert s.partitions == 6
    assert s.bootstrap_servers is None


def test_env_beats_toml_and_toml_beats_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _toml(tmp_path, 'input_topic = "from.toml"\npartitions = 4\n', monkeypatch)
    monkeypatch.setenv("FIFOLANE_INPUT_TOPIC", "from.env")
    s = load_settings()
    assert s.input_topic == "from.env"
    assert s.partitions == 4


def test_keyword_overrides_beat_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIFOLANE_PARTITIONS", "5")
    assert load_settings(partitions=2).partitions == 2


def test_toml_with_fifolane_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _toml(tmp_path, '[fifolane]\nstate_topic = "tbl.state"\n', monkeypatch)
    assert load_settings().state_topic == "tbl.state"


def test_fifolane_toml_in_working_directory_is_read(tmp_path: Path) -> None:
    (tmp_path / "fifolane.toml").write_text('dlq_topic = "cwd.dlq"\n')
    assert load_settings().dlq_topic == "cwd.dlq"


def test_unknown_toml_key_is_refused_with_valid_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _toml(tmp_path, 'input_topik = "typo"\n', monkeypatch)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "input_topik" in str(info.value)
    assert "input_topic" in str(info.value)  # the valid names are listed


def test_unknown_env_var_is_refused_with_valid_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIFOLANE_BOOTSTRAP_SERVER", "x:1")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "FIFOLANE_BOOTSTRAP_SERVER" in str(info.value)
    assert "FIFOLANE_BOOTSTRAP_SERVERS" in str(info.value)


def test_non_settings_env_vars_are_tolerated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIFOLANE_TEST_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("FIFOLANE_LOG_LEVEL", "DEBUG")
    monkeypatch.setenv("FIFOLANE_BENCH_WARM_BROKER", "0")  # read by the benchmarks, and their children
    assert load_settings().bootstrap_servers is None


def test_wrong_type_is_refused() -> None:
    with pytest.raises(ConfigError, match="partitions"):
        load_settings(partitions=0)


def test_corrupt_toml_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _toml(tmp_path, "partitions = = 3\n", monkeypatch)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings()


def test_settings_are_frozen() -> None:
    s = load_settings()
    with pytest.raises(ValueError, match="frozen"):
        s.input_topic = "other"
    assert s.with_overrides(input_topic="other").input_topic == "other"
    assert s.input_topic == "fifolane.events"


def test_kafka_config_maps_to_librdkafka_keys() -> None:
    s = load_settings(
        bootstrap_servers="b1:9092,b2:9092",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="user",
        sasl_password="hunter2",
        ssl_ca_location="/ca.pem",
        librdkafka={"linger.ms": "5"},
    )
    conf = s.kafka_config(**{"group.id": "g"})
    assert conf == {
        "bootstrap.servers": "b1:9092,b2:9092",
        "log_level": 5,
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "user",
        "sasl.password": "hunter2",
        "ssl.ca.location": "/ca.pem",
        "linger.ms": "5",
        "group.id": "g",
    }


def test_kafka_config_omits_unset_keys() -> None:
    assert load_settings(bootstrap_servers="b:1").kafka_config() == {"bootstrap.servers": "b:1", "log_level": 5}


def test_librdkafka_info_lines_are_off_unless_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # librdkafka's info lines (BGQUEUE "Purging 1 unserved events" at every admin client's end)
    assert load_settings().kafka_config()["log_level"] == 5
    monkeypatch.setenv("FIFOLANE_LIBRDKAFKA", json.dumps({"log_level": "7", "debug": "admin"}))
    assert load_settings().kafka_config()["log_level"] == "7"


def test_librdkafka_json_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIFOLANE_LIBRDKAFKA", json.dumps({"acks": "all"}))
    monkeypatch.setenv("FIFOLANE_BOOTSTRAP_SERVERS", "b:1")
    assert load_settings().kafka_config()["acks"] == "all"


def test_bootstrap_falls_back_to_local_cluster_state(tmp_path: Path) -> None:
    s = load_settings(home=tmp_path)
    assert s.resolved_bootstrap() == "127.0.0.1:9092"  # nothing running: Kafka's usual port
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "cluster.json").write_text(json.dumps({"bootstrap_servers": "127.0.0.1:39092"}))
    assert s.kafka_config()["bootstrap.servers"] == "127.0.0.1:39092"
    (tmp_path / "kafka" / "cluster.json").write_text("{not json")
    with pytest.raises(ConfigError, match="corrupt local cluster state"):
        s.resolved_bootstrap()


def test_secret_is_not_leaked_in_repr() -> None:
    s = load_settings(sasl_password="hunter2")
    assert "hunter2" not in repr(s)
    assert "hunter2" not in str(s)
    assert "hunter2" not in s.model_dump_json()
    assert s.sasl_password is not None and s.sasl_password.get_secret_value() == "hunter2"


def test_settings_class_is_the_one_model() -> None:
    # Every field maps to one FIFOLANE_<FIELD> env name; compose and docs rely on that.
    assert {"bootstrap_servers", "input_topic", "state_topic", "home"} <= set(Settings.model_fields)


def test_replication_factor_defaults_to_the_brokers_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings().replication_factor == -1  # -1 = the brokers' default.replication.factor
    monkeypatch.setenv("FIFOLANE_REPLICATION_FACTOR", "3")
    assert load_settings().replication_factor == 3


@pytest.mark.parametrize("value", ["0", "-2"])
def test_replication_factor_zero_or_below_minus_one_is_refused(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FIFOLANE_REPLICATION_FACTOR", value)
    with pytest.raises(ConfigError, match=rf"replication_factor must be >= 1, or -1 for the brokers' "
                                          rf"default.replication.factor; got {value}"):
        load_settings()


def test_user_tuning_keys_win_and_guarantee_keys_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """FIFOLANE_LIBRDKAFKA may raise the worker's fetch wait (fewer fetch requests from an
    idle worker, at the cost of latency) or its linger; it cannot switch off what the
    guarantees need (committed reads, manual offsets, idempotence)."""
    monkeypatch.setenv("FIFOLANE_LIBRDKAFKA", json.dumps({
        "fetch.wait.max.ms": "100", "linger.ms": "5", "isolation.level": "read_uncommitted",
        "enable.auto.commit": "true", "enable.idempotence": "false"}))
    base = Settings().kafka_config()
    opts = WorkerOptions(worker_id="w1", guarantee="exactly-once")
    consumer = merged_config(base, consumer_config(opts, "g"))
    producer = merged_config(base, producer_config(opts, "g"))
    assert (consumer["fetch.wait.max.ms"], producer["linger.ms"]) == ("100", "5")
    assert (consumer["isolation.level"], consumer["enable.auto.commit"]) == ("read_committed", False)
    assert producer["enable.idempotence"] is True
    defaults = merged_config({"bootstrap.servers": "b:9092"}, consumer_config(opts, "g"))
    assert defaults["fetch.wait.max.ms"] == 50


def test_only_the_transactional_producer_retries_after_10_ms() -> None:
    """An exactly-once commit's first request to the coordinator is refused while the
    previous commit's markers are written; librdkafka's 100 ms default back-off made a
    commit with only offsets take ~95 ms (benchmarks/README.md, "A warm broker"). The
    at-least-once producer keeps librdkafka's default."""
    eos = producer_config(WorkerOptions(worker_id="w1", guarantee="exactly-once"), "g")
    alo = producer_config(WorkerOptions(worker_id="w1", guarantee="at-least-once"), "g")
    assert (eos["retry.backoff.ms"], eos["transactional.id"]) == (10, "g-w1")
    assert "retry.backoff.ms" not in alo and "transactional.id" not in alo
