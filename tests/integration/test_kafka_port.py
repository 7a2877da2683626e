"""``fifolane kafka up --port``: the local broker on the port a user chose, as they type it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka_fixtures import PROJECT_ROOT, SHARED_LIBS

from fifolane.cluster.ports import free_port

pytestmark = pytest.mark.integration


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "libs").symlink_to(SHARED_LIBS)
    try:
        yield tmp_path
    finally:
        _cli(tmp_path, "kafka", "down", "--timeout", "15")


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIFOLANE_")}
    env.update(FIFOLANE_HOME=str(home), PYTHONPATH=str(PROJECT_ROOT))
    return subprocess.run([sys.executable, "-c", "from fifolane.cli import main; main()", *args], env=env,
                          capture_output=True, text=True, timeout=240, cwd=PROJECT_ROOT, check=False)


def _topics(bootstrap: str) -> set[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return set(admin.list_topics(timeout=30).topics)


def test_up_on_a_chosen_port_moves_with_its_data_and_refuses_a_taken_one(home: Path) -> None:
    first = free_port()
    up = _cli(home, "kafka", "up", "--port", str(first))
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == f"127.0.0.1:{first}"
    admin = AdminClient({"bootstrap.servers": up.stdout.strip()})
    admin.create_topics([NewTopic("kept", 1, 1)])["kept"].result(30)

    again = _cli(home, "kafka", "up", "--port", str(first))  # idempotent on its own port
    assert again.returncode == 0 and again.stdout.strip() == f"127.0.0.1:{first}", again.stderr
    moved = _cli(home, "kafka", "up", "--port", str(free_port()))
    assert moved.returncode != 0
    assert f"running under {home / 'kafka'} on port {first}" in moved.stderr
    assert "fifolane kafka down" in moved.stderr

    assert _cli(home, "kafka", "down").returncode == 0
    with socket.socket() as taken:  # someone else listens on the port now
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past TIME_WAIT, as the JVM binds
        taken.bind(("127.0.0.1", first))
        taken.listen()
        refused = _cli(home, "kafka", "up", "--port", str(first))
        assert refused.returncode != 0
        assert f"port {first} on 127.0.0.1 is taken" in refused.stderr
        assert "Traceback" not in refused.stderr
    second = free_port()
    up = _cli(home, "kafka", "up", "--port", str(second))
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip() == f"127.0.0.1:{second}"
    assert "kept" in _topics(up.stdout.strip())  # the data came along

    # Restarted on the port its controller had, or without --port while someone holds its
    # client port: the data stays, on new ports for the clashes (it was wiped silently).
    controller = json.loads((home / "kafka" / "layout.json").read_text())["ports"][0]["controller"]
    assert _cli(home, "kafka", "down").returncode == 0
    up = _cli(home, "kafka", "up", "--port", str(controller))
    assert up.returncode == 0 and up.stdout.strip() == f"127.0.0.1:{controller}", up.stderr
    assert "kept" in _topics(up.stdout.strip())
    assert _cli(home, "kafka", "down").returncode == 0
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", controller))
        taken.listen()
        up = _cli(home, "kafka", "up")
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() != f"127.0.0.1:{controller}"
        second = int(up.stdout.strip().rsplit(":", 1)[1])
        assert "kept" in _topics(up.stdout.strip())

    for bad in ("0", "70000", "x"):
        out = _cli(home, "kafka", "up", "--port", bad)
        assert out.returncode == 2 and "--port" in out.stderr  # click's usage error, nothing started
    assert "kept" in _topics(f"127.0.0.1:{second}")  # still running


def test_up_starts_again_the_nodes_of_a_cluster_that_stopped(home: Path) -> None:
    """One node of three was killed: `kafka up --brokers 3` starts it again (it told the user
    to take the whole cluster down first), and the data it held is still there. With
    --secure, it refuses at once: the running nodes are not secure."""
    import signal

    from fifolane.cluster import LocalCluster

    up = _cli(home, "kafka", "up", "--brokers", "3")
    assert up.returncode == 0, up.stderr
    admin = AdminClient({"bootstrap.servers": up.stdout.strip()})
    admin.create_topics([NewTopic("kept3", 3, 3)])["kept3"].result(30)
    cluster = LocalCluster(home, 3)
    victim = cluster.status().brokers[1]
    assert victim.pid is not None
    os.kill(victim.pid, signal.SIGKILL)
    secure = _cli(home, "kafka", "up", "--brokers", "3", "--secure", "--timeout", "200")
    assert secure.returncode != 0  # at once (it waited over the other protocol until its timeout)
    assert "without --secure is running" in secure.stderr and "Traceback" not in secure.stderr
    again = _cli(home, "kafka", "up", "--brokers", "3")
    assert again.returncode == 0, again.stderr
    assert "started 1 stopped node(s) again" in again.stderr
    status = cluster.status()
    assert status.running and status.brokers[1].pid != victim.pid
    assert "kept3" in _topics(f"127.0.0.1:{status.brokers[1].port}")  # asked of the restarted node
    refused = _cli(home, "kafka", "up", "--brokers", "1")
    assert refused.returncode != 0 and "fifolane kafka down" in refused.stderr
