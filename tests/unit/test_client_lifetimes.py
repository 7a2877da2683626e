"""No Kafka client outlives its process's last use of it.

librdkafka bundles OpenSSL, whose exit handler frees its tables; a client still alive at
the interpreter's exit can be doing TLS (a SASL_SSL login, a heartbeat) in its broker thread
at that moment, and the process dies of SIGSEGV after its last line was printed (a refused
worker exited -11 instead of 2, in CI). So: the worker closes what it made, also when it is
refused at start-up, the access checker's client is freed as soon as it is dropped, and
the command line collects the clients left as garbage before it exits.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest
from fake_kafka import FakeClients

from fifolane.access import KafkaAccess
from fifolane.config import PROJECT_ROOT, Settings
from fifolane.errors import WorkerError
from fifolane.serde import SchemaCatalog
from services.worker.options import WorkerOptions
from services.worker.runtime import Worker

CATALOG = SchemaCatalog.load()


class _Recording(FakeClients):
    """Fake clients that count what the worker made and closed."""

    def __init__(self, refuse: BaseException | None = None, refuse_init: BaseException | None = None) -> None:
        super().__init__({("in", 0): 0})
        self.made: list[str] = []
        self.consumer_closes = 0
        self._refuse, self._refuse_init = refuse, refuse_init
        original = self.fake_consumer.close

        def close() -> None:
            self.consumer_closes += 1
            original()

        self.fake_consumer.close = close  # type: ignore[method-assign]

    def consumer(self, conf: dict[str, Any]) -> Any:
        self.made.append("consumer")
        return super().consumer(conf)

    def producer(self, conf: dict[str, Any], *, transactional: bool) -> Any:
        self.made.append("producer")
        p = super().producer(conf, transactional=transactional)
        if self._refuse_init is not None:
            def init(timeout: float = 60.0, exc: BaseException = self._refuse_init) -> None:
                raise exc
            p.init = init
        return p

    def topic_configs(self, names: list[str], timeout: float = 30.0, **access: Any) -> dict[str, dict[str, str]]:
        if self._refuse is not None:
            raise self._refuse
        return super().topic_configs(names, timeout, **access)


def _worker(tmp_path: Path, clients: _Recording) -> Worker:
    settings = Settings(home=tmp_path / "home", input_topic="in", state_topic="state", dlq_topic="dlq")
    return Worker(settings, None, WorkerOptions(worker_id="w1", state_dir=tmp_path / "state"),
                  catalog=CATALOG, clients=clients)


def test_a_worker_refused_at_its_access_check_makes_no_client(tmp_path: Path) -> None:
    refused = WorkerError("the worker cannot start: User:w lacks READ on topic 'state'")
    clients = _Recording(refuse=refused)
    with pytest.raises(WorkerError) as caught:
        _worker(tmp_path, clients).run()
    assert caught.value is refused
    assert clients.made == []  # checked before any client is made


def test_a_worker_refused_after_its_clients_exist_closes_them(tmp_path: Path) -> None:
    denied = WorkerError("the worker cannot start: User:w lacks WRITE on transactional id 't'")
    clients = _Recording(refuse_init=denied)
    w = _worker(tmp_path, clients)
    with pytest.raises(WorkerError) as caught:
        w.run()
    assert caught.value is denied
    assert clients.made == ["consumer", "consumer", "producer"]  # the input's, the directory's
    assert clients.consumer_closes == 2  # both (one fake here)
    assert clients.fake_producer.closed == 1
    assert w.consumer is None


def test_a_stopped_worker_closes_its_producer_last(tmp_path: Path) -> None:
    clients = _Recording()
    w = _worker(tmp_path, clients)
    runner = threading.Thread(target=w.run)
    runner.start()
    clients_made = lambda: clients.made == ["consumer", "consumer", "producer"]  # noqa: E731
    for _ in range(200):
        if clients_made() and clients.fake_consumer.callbacks:
            break
        threading.Event().wait(0.01)
    w.stop()
    runner.join(10)
    assert not runner.is_alive()
    assert clients.consumer_closes == 2  # the input's and the directory's consumer (one fake here)
    assert clients.fake_producer.closed == 1
    with pytest.raises(RuntimeError, match="closed"):  # nothing may send after it
        clients.fake_producer.produce("state", b"v", b"k")


def test_the_access_checker_is_freed_when_dropped() -> None:
    """Its client's error callback must not refer back to it: a reference cycle would keep
    the admin client (and its threads) alive until a collection, or the exit."""
    access = KafkaAccess({"bootstrap.servers": "127.0.0.1:1", "log_level": 0}, timeout=0.1)
    gone = weakref.ref(access)
    del access
    assert gone() is None  # by reference counting alone
    access = KafkaAccess({"bootstrap.servers": "127.0.0.1:1", "log_level": 0}, timeout=0.1)
    access.close()
    assert access.admin is None
    access.close()  # again: nothing left to do


_COMMAND = """
import gc, sys
import click
from fifolane.cli import _COMMANDS, main
from fifolane.errors import FifolaneError

class Client:  # stands for a Kafka client in a reference cycle, frozen as the worker freezes
    def __init__(self):
        self.me = self
    def __del__(self):
        print("destroyed " + ("at exit" if sys.is_finalizing() else "before exit"), flush=True)

@click.command("refused")
def refused():
    client = Client()
    gc.freeze()
    raise FifolaneError("refused: " + type(client).__name__)

@click.command("done")
def done():
    Client()
    gc.freeze()
    sys.exit(3)

@click.command("bug")
def bug():
    client = Client()
    gc.freeze()
    raise OSError("address in use: " + type(client).__name__)

_COMMANDS.update(refused="__main__:refused", done="__main__:done", bug="__main__:bug")
sys.argv = ["fifolane", sys.argv[1]]
main()
"""


@pytest.mark.parametrize(("command", "code", "err"), [
    ("refused", 2, "error: refused: Client\n"),
    ("done", 3, ""),
    ("bug", 1, "OSError: address in use: Client\n"),  # the last line of its traceback
])
def test_the_command_line_destroys_garbage_clients_before_it_exits(command: str, code: int, err: str) -> None:
    done = subprocess.run([sys.executable, "-c", _COMMAND, command], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, timeout=60, check=False)
    assert done.returncode == code, done.stderr
    assert done.stdout == "destroyed before exit\n"
    assert done.stderr.endswith(err)
    assert done.stderr.startswith("Traceback (most recent call last):\n") == (command == "bug")


def test_the_query_endpoints_admin_clients_are_destroyed_when_they_stop() -> None:
    """The roster's and the resolver's admin clients (their threads) end at stop(), not at
    the interpreter's exit; used again after stop(), the roster makes a new one."""
    from services.worker.query.members import Roster
    from services.worker.query.positions import Resolver
    from services.worker.query.views import Views

    conf = {"bootstrap.servers": "127.0.0.1:1", "log_level": 0}
    roster = Roster(conf, group_id="g", input_topic="in", directory_topic=None, members_topic="m",
                    standby_replicas=0)
    assert roster._admin is not None  # made when first used
    roster.stop()  # never started: nothing to join
    assert roster._admin_client is None
    resolver = Resolver(conf, "state", Views(), transactional=True)
    resolver.start()
    assert resolver._admin is not None
    resolver.stop()
    assert resolver._admin is None
