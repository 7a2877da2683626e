"""The errors a new user meets first: one clear line and exit code 2, never a traceback;
an interrupted or failed produce says exactly what it delivered (no broker needed)."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from fifolane.cli.connect import LibrdkafkaLog, check_reachable
from fifolane.cli.produce import _interrupted
from fifolane.cli.worker import _check_port
from fifolane.config import Settings
from fifolane.errors import AppError, ConfigError
from fifolane.produce import EventProducer
from fifolane.serde import SchemaCatalog
from services.worker.app import load_app

ROOT = Path(__file__).resolve().parents[2]
CATALOG = SchemaCatalog.load()


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    return subprocess.run([sys.executable, "-c", "from fifolane.cli import main; main()", *args],
                          cwd=ROOT, env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=60, check=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- --app --------------------------------------------------------------------------------
def test_app_module_not_found() -> None:
    with pytest.raises(AppError) as err:
        load_app("examples.flight:app")
    assert str(err.value).startswith("--app examples.flight:app: no module named 'examples.flight' ")
    assert str(err.value).endswith("give the app as MODULE:ATTR, e.g. examples.flights:app")


def test_app_attribute_not_found_suggests_the_app() -> None:
    with pytest.raises(AppError) as err:
        load_app("examples.flights:ap")
    assert str(err.value) == ("--app examples.flights:ap: module examples.flights has no attribute 'ap'; "
                              "did you mean examples.flights:app?")


def test_app_file_path_under_the_working_directory_is_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    assert load_app("examples/flights.py").name == "flights"
    assert load_app("examples/flights.py:app").name == "flights"
    with pytest.raises(AppError, match="give a module path like examples.flights:app, not a file path"):
        load_app("/tmp/elsewhere/flights.py")
    with pytest.raises(AppError, match="not a file path"):
        load_app("examples/flights")


def test_worker_with_a_wrong_app_exits_2_without_traceback() -> None:
    result = _cli("worker", "--app", "examples.flights:ap", env={"FIFOLANE_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --app examples.flights:ap: module examples.flights has no attribute 'ap'; "
        "did you mean examples.flights:app?")


# --- ports --------------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--metrics-port", "--query-port"])
def test_a_taken_port_is_refused_naming_the_flag(flag: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError) as err:
            _check_port("127.0.0.1", port, flag)
        assert str(err.value) == (f"{flag} {port}: port {port} on 127.0.0.1 is in use by another process; "
                                  f"choose another port with {flag} (or stop what holds it)")
        result = _cli("worker", flag, str(port), env={"FIFOLANE_BOOTSTRAP_SERVERS": "127.0.0.1:1"})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"error: {err.value}"
    _check_port("127.0.0.1", port, flag)  # free again: fine
    _check_port("127.0.0.1", 0, flag)  # any free port
    _check_port("127.0.0.1", None, flag)


# --- connectivity ---------------------------------------------------------------------------
def test_unreachable_bootstrap_is_a_clear_error_within_the_timeout(tmp_path: Path) -> None:
    port = _free_port()
    settings = Settings(bootstrap_servers=f"127.0.0.1:{port}", home=tmp_path)
    started = time.monotonic()
    with pytest.raises(ConfigError) as err:
        check_reachable(settings, timeout=1.0)
    assert time.monotonic() - started < 5
    text = str(err.value)
    assert text.startswith(f"cannot reach Kafka at 127.0.0.1:{port}: no broker answered within 1s (")
    assert "Connection refused" in text and "FIFOLANE_BOOTSTRAP_SERVERS" in text


def test_unreachable_local_cluster_says_kafka_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="start it with `fifolane kafka up`"):
        check_reachable(Settings(home=tmp_path, librdkafka={"bootstrap.servers": f"127.0.0.1:{_free_port()}"}),
                        timeout=0.5)


def test_librdkafka_lines_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    log = LibrdkafkaLog("fifolane.librdkafka.test")
    with caplog.at_level(logging.DEBUG, logger="fifolane.librdkafka.test"):
        for ms in (0, 3, 50):
            log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1",
                    f"127.0.0.1:9/bootstrap: Connect failed: Connection refused (after {ms}ms in state CONNECT)")
        log.log(logging.WARNING, "%s [%s] %s", "GETPID", "p", "retrying")
    assert [(r.levelno, r.getMessage().split(":")[0]) for r in caplog.records] == [
        (logging.ERROR, "FAIL"), (logging.WARNING, "GETPID")]
    assert "Connection refused" in (log.last or "")
    assert list(log.repeats.values()) == [3, 1]


def test_retries_of_a_broker_that_just_started_are_info(caplog: pytest.LogCaptureFixture) -> None:
    """librdkafka retries these on its own; at the command line they were a warning in the
    middle of `produce`'s report (seen in CI on a broker that had just started)."""
    log = LibrdkafkaLog("fifolane.librdkafka.test2")
    with caplog.at_level(logging.DEBUG, logger="fifolane.librdkafka.test2"):
        log.log(logging.WARNING, "%s [%s] %s", "GETPID", "p", "[thrd:main]: Failed to acquire idempotence PID "
                "from broker 127.0.0.1:9092/0: Broker: Coordinator load in progress: retrying")
        log.log(logging.WARNING, "%s [%s] %s", "GETPID", "p", "[thrd:main]: Failed to acquire transactional PID "
                "from broker TxnCoordinator/0: Broker: Not coordinator: retrying")
        log.log(logging.WARNING, "%s [%s] %s", "GETPID", "p", "Failed to acquire PID: Broker: Cluster "
                "authorization failed")
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO, logging.WARNING]


# --- produce: NaN, summaries, Ctrl-C ----------------------------------------------------------
class _Fake:
    """confluent-kafka's Producer surface; ``interrupt_at``: produce() of that record raises
    KeyboardInterrupt (Ctrl-C); ``ack``: which records' deliveries succeed before it."""

    def __init__(self, interrupt_at: int | None = None, ack: Any = lambda i: True) -> None:
        self.calls: list[Any] = []
        self.interrupt_at = interrupt_at
        self.ack = ack
        self.purged: list[tuple[bool, bool]] = []

    def produce(self, topic: str, value: Any = None, key: Any = None, headers: Any = None,
                on_delivery: Any = None) -> None:
        if self.interrupt_at is not None and len(self.calls) + 1 == self.interrupt_at:
            raise KeyboardInterrupt
        self.calls.append(on_delivery)

    def poll(self, timeout: float = 0) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        left = []
        for i, cb in enumerate(self.calls, 1):
            if cb is None:
                continue
            if self.ack(i):
                cb(None, None)
            else:
                left.append(cb)
        self.calls = [cb if cb in left else None for cb in self.calls]
        return len(left)

    def purge(self, in_queue: bool = True, in_flight: bool = True) -> None:
        self.purged.append((in_queue, in_flight))
        err = KafkaError(KafkaError._PURGE_QUEUE)
        for cb in self.calls:
            if cb is not None and in_flight:
                cb(err, None)


def _line(**fields: Any) -> str:
    record = {"reservation_id": "R-1", "flight_number": "LX1", "customer_id": "C-1", "seats": 1,
              "amount": 10.0, "state": "NEW", "version": 1}
    record.update(fields)
    return json.dumps(record)


def _producer(tmp_path: Path, fake: _Fake) -> EventProducer:
    settings = Settings(bootstrap_servers="unused:1", input_topic="in", home=tmp_path)
    return EventProducer(settings, CATALOG, "test", kafka_producer=fake)


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_numbers_are_refused_with_the_line(tmp_path: Path, token: str) -> None:
    lines = [_line(), _line(version=2).replace('"amount": 10.0', f'"amount": {token}'), _line(version=3)]
    with _producer(tmp_path, _Fake()) as producer:
        report = producer.produce_lines(lines, "reservation")
    assert report.failed == [(2, f"invalid JSON: {token} is not a finite number (JSON has no NaN or "
                                 f"Infinity); use a number or null")]
    assert (report.sent, report.delivered) == (2, 2)


def test_an_interrupt_reports_the_delivered_prefix(tmp_path: Path) -> None:
    # records 1-4 sent; Ctrl-C while sending the 5th (line 6: line 3 is invalid, so not sent);
    # of the four, record 3 (line 4) is never acknowledged, record 4 (line 5) is
    fake = _Fake(interrupt_at=5, ack=lambda i: i != 3)
    lines = [_line(version=1), _line(version=2), "{bad", _line(version=4), _line(version=5),
             _line(version=6), _line(version=7)]
    with _producer(tmp_path, fake) as producer:
        report = producer.produce_lines(lines, "reservation", on_error=lambda n, r: None)
    assert report.interrupted and not report.ok
    assert (report.resume_line, report.delivered, report.delivered_beyond) == (4, 3, 1)
    assert [n for n, _ in report.failed] == [3] and report.undelivered == []
    assert fake.purged == [(True, False), (True, True)]
    assert _interrupted(4, 1) == (
        "interrupted: lines 1-3 delivered (or reported above); 1 later line(s) were delivered too "
        "(partitions finish out of order): sending them again is harmless, workers drop a repeated "
        "version as superseded; resume with --skip 3")
    assert _interrupted(1, 0) == "interrupted: no line known delivered; send the file again"


def test_skip_resumes_after_the_given_lines(tmp_path: Path) -> None:
    fake = _Fake()
    with _producer(tmp_path, fake) as producer:
        report = producer.produce_lines([_line(version=v) for v in range(1, 6)], "reservation", skip=3)
    assert (report.sent, report.delivered, report.ok) == (2, 2, True)


def test_produce_summary_counts_deliveries(tmp_path: Path) -> None:
    fake = _Fake(ack=lambda i: i == 1)
    with _producer(tmp_path, fake) as producer:
        report = producer.produce_lines([_line(version=1), _line(version=2)], "reservation",
                                        on_error=lambda n, r: None)
    assert (report.sent, report.delivered, [n for n, _ in report.undelivered]) == (2, 1, [2])


# --- views ----------------------------------------------------------------------------------
def test_views_show_finds_the_last_build(tmp_path: Path) -> None:
    from fifolane.cli.views import _record_out, _shown_dir

    settings = Settings(bootstrap_servers="unused:1", home=tmp_path / "home")
    assert _shown_dir(settings, None) == settings.home / "views"  # nothing built yet
    built = tmp_path / "views"
    built.mkdir()
    _record_out(settings, built)
    assert _shown_dir(settings, None) == built.resolve()
    assert _shown_dir(settings, tmp_path / "other") == tmp_path / "other"  # --out wins
    built.rmdir()
    assert _shown_dir(settings, None) == settings.home / "views"  # gone: the default again


def test_a_sigint_is_seen_whichever_handler_took_it() -> None:
    import signal

    from fifolane.cli.views import _sigint_watch

    interrupted = _sigint_watch()
    try:
        assert not interrupted()
        before = signal.signal(signal.SIGINT, lambda *_: None)  # as Spark replaces the handler
        try:
            signal.raise_signal(signal.SIGINT)
        finally:
            signal.signal(signal.SIGINT, before)
        assert interrupted() and interrupted()  # and it stays seen
    finally:
        signal.set_wakeup_fd(-1)
