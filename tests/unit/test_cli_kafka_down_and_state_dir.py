"""Every CLI command that talks to Kafka checks it first: with no broker it says so in one
line (exit code 2), without librdkafka's FAIL lines; an unusable --state-dir, another
process's garbled OWNER file, --skip past the end of a file and a Ctrl-C while the clients
close are one clear outcome each (no broker needed)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import fifolane.cli as cli_module
from fifolane.errors import FifolaneError, StateError
from services.worker.storedirs import OWNER_FILE, claim, make_root

ROOT = Path(__file__).resolve().parents[2]
DOWN = "127.0.0.1:1"
UNREACHABLE = (
    f"error: cannot reach Kafka at {DOWN}: no broker answered within {{s}}s (Connect to ipv4#{DOWN} failed: "
    "Connection refused); check that Kafka runs there, or change FIFOLANE_BOOTSTRAP_SERVERS (or "
    "bootstrap_servers in the FIFOLANE_CONFIG file); with TLS or SASL, check FIFOLANE_SECURITY_PROTOCOL too"
)
COMMANDS = {
    "get": ["get", "reservation", "Z1"],
    "scan": ["scan", "--group", "AF1001"],
    "listeners list": ["listeners", "list"],
    "listeners add": ["listeners", "add", "big", "--filter", "value.amount > 100"],
    "listeners describe": ["listeners", "describe", "big"],
    "listeners remove": ["listeners", "remove", "big"],
    "listen": ["listen", "big"],
    "groups parked": ["groups", "parked"],
    "groups show": ["groups", "show", "AF1001"],
    "groups release": ["groups", "release", "AF1001"],
    "acls apply": ["acls", "apply", "--role", "producer", "--principal", "User:app"],
    "acls remove": ["acls", "remove", "--role", "producer", "--principal", "User:app"],
    "acls list": ["acls", "list"],
    "acls user": ["acls", "user", "bob"],
    "worker": ["worker"],  # waits as long as the worker's own start-up check: 30s
}


def _cli(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    env = {**base, "FIFOLANE_BOOTSTRAP_SERVERS": DOWN, "FIFOLANE_HOME": str(tmp)}
    return subprocess.run([sys.executable, "-c", "from fifolane.cli import main; main()", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)


def _errors(stderr: str) -> list[str]:
    # A dev checkout whose compiled modules are older than their sources says so: not ours.
    return [line for line in stderr.splitlines() if "fifolane.compiled" not in line]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("home")
    with ThreadPoolExecutor(len(COMMANDS)) as pool:  # each waits for the check: all at once
        futures = {name: pool.submit(_cli, args, tmp) for name, args in COMMANDS.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_kafka_command_with_no_broker_says_so_in_one_line(
        name: str, outcomes: dict[str, subprocess.CompletedProcess[str]]) -> None:
    done = outcomes[name]
    assert _errors(done.stderr) == [UNREACHABLE.format(s=30 if name == "worker" else 5)]
    assert "FAIL" not in done.stderr and "Traceback" not in done.stderr
    assert done.stdout == ""
    assert done.returncode == 2


def test_commands_without_kafka_do_not_check_it(tmp_path: Path) -> None:
    done = _cli(["acls", "apply", "--role", "producer", "--principal", "User:app", "--dry-run"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "cannot reach Kafka" not in done.stderr and "User:app" in done.stdout


# --- --state-dir ----------------------------------------------------------------------------
def _hint(root: Path, why: str) -> str:
    return (f"cannot use the state directory {root}: {why}; give --state-dir a directory this user can "
            "create and write (default: <FIFOLANE_HOME>/state/<worker id>)")


def test_a_state_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    root = tmp_path / "f" / "fifolane-flights"
    with pytest.raises(StateError) as err:
        make_root(root, "w1")
    assert str(err.value) == _hint(root, f"a part of {root} is a file, not a directory (Not a directory)")
    assert isinstance(err.value, FifolaneError)  # the CLI: "error: ..." and exit code 2


def test_a_state_dir_that_cannot_be_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ro" / "g"

    def refuse(self: Path, *_a: Any, **_k: Any) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    with pytest.raises(StateError) as err:
        make_root(root, "w1")
    assert str(err.value) == _hint(root, f"no permission to write {root}")


def test_a_state_dir_whose_parent_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "gone" / "g"

    def missing(self: Path, *_a: Any, **_k: Any) -> None:
        raise FileNotFoundError(2, "No such file or directory", str(self))

    monkeypatch.setattr(Path, "mkdir", missing)
    with pytest.raises(StateError) as err:
        make_root(root, "w1")
    assert str(err.value) == _hint(root, f"{root} cannot be made (No such file or directory)")


def test_an_owner_file_that_is_a_directory(tmp_path: Path) -> None:
    root = tmp_path / "g"
    (root / OWNER_FILE).mkdir(parents=True)
    with pytest.raises(StateError) as err:
        make_root(root, "w1")
    owner = root.resolve() / OWNER_FILE
    assert str(err.value) == _hint(root, f"{owner} is a directory, not the lock file OWNER it should be: remove it")


def test_the_worker_command_says_the_state_dir_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import fifolane.cli.connect as connect

    (tmp_path / "f").write_text("")
    monkeypatch.setattr(connect, "check_reachable", lambda *_a, **_k: set())  # as if Kafka answered
    monkeypatch.setenv("FIFOLANE_BOOTSTRAP_SERVERS", DOWN)
    monkeypatch.setattr(sys, "argv", ["fifolane", "worker", "--group-id", "g", "--state-dir", str(tmp_path / "f")])
    with pytest.raises(SystemExit) as done:
        cli_module.main()
    root = tmp_path / "f" / "g"
    assert done.value.code == 2
    assert _errors(capsys.readouterr().err) == [
        "error: " + _hint(root, f"a part of {root} is a file, not a directory (Not a directory)")]


def test_another_holders_garbled_owner_is_shown_short_and_printable(tmp_path: Path) -> None:
    root = tmp_path / "g"
    root.mkdir()
    (root / OWNER_FILE).write_bytes(b"pid 7\x1b[2J\x00\x07 on\thost " + b"x" * 400 + b"\xff\n")
    fd = os.open(root / OWNER_FILE, os.O_RDONLY)  # another open file: its lock is another holder's
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(StateError) as err:
            claim(root, "w1")
    finally:
        os.close(fd)
    holder = "pid 7 [2J on host " + "x" * 99 + "..."
    assert len(holder) == 120
    assert str(err.value) == (
        f"another worker process uses the state directory {root.resolve()} ({holder}): is a worker with "
        "--worker-id w1 running on this machine already? Give each worker its own --worker-id (the same id "
        "with another --state-dir fences the running worker), or stop the other one first")


# --- produce --------------------------------------------------------------------------------
def test_produce_skip_past_the_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    import fifolane.cli.produce as produce

    events = tmp_path / "nine.jsonl"
    events.write_text("{}\n" * 9)
    monkeypatch.setattr(produce, "_check_input_topic", lambda _s: None)  # nothing is sent: no broker needed
    monkeypatch.setenv("FIFOLANE_BOOTSTRAP_SERVERS", DOWN)
    monkeypatch.setattr(sys, "argv", ["fifolane", "produce", "reservation", str(events), "--skip", "100"])
    with pytest.raises(SystemExit) as done:
        cli_module.main()
    assert done.value.code == 2
    assert _errors(capsys.readouterr().err) == [
        f"error: --skip 100 is past the end of {events} (9 line(s)): nothing was sent"]


def test_ctrl_c_while_the_clients_close(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import signal

    calls: list[int] = []

    def release() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "_run", lambda: 0)
    monkeypatch.setattr(cli_module, "release_clients", release)
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as done:
            cli_module.main()
    finally:
        signal.signal(signal.SIGINT, before)
    assert done.value.code == 130
    assert calls == [1, 1]  # closed all the same
    assert capsys.readouterr().err == "interrupted: closing the Kafka clients (Ctrl-C again to quit at once)\n"
