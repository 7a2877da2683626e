"""The members topic is writable by every worker (and by anyone with WRITE on it): what a
reader does with a record it cannot use, and how a worker keeps its own address there."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from fifolane.client import StateClient
from fifolane.query import member_key, read_member


@pytest.mark.parametrize("url", ["::bad", "http://a\x00b:1", "ftp://a:1", "http://", "http:///x", "a:1",
                                 "http://a b:1", "http://" + "a" * 3000, 7, None, ["http://a:1"]])
def test_a_member_record_with_an_unusable_url_is_skipped(url: Any) -> None:
    import json
    value = json.dumps({"url": url, "input_topic": "in"}).encode()
    assert read_member(member_key("g", "zz"), value) is None


@pytest.mark.parametrize("url", ["http://w1.example:8081", "https://10.0.0.7:443", "http://[::1]:8081"])
def test_usable_urls_are_read(url: str) -> None:
    import json
    found = read_member(member_key("g", "w1"), json.dumps({"url": url, "input_topic": "in"}).encode())
    assert found is not None and found[2] is not None and found[2]["url"] == url


def test_a_client_passes_over_an_address_it_cannot_ask() -> None:
    """`fifolane get` with a bad address among good ones (before: httpx.InvalidURL, exit 1)."""
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.host == "junk.example":
            return httpx.Response(200, text="<html>not a routing map</html>")
        return httpx.Response(200, json={"partitions": {}, "members": [{"worker": "w1", "url": "http://good:1"}]})
    client = StateClient(["::bad", "http://junk.example:1", "http://good:1"], transport=httpx.MockTransport(answer))
    assert client.routing()["members"] == [{"worker": "w1", "url": "http://good:1"}]


class _Producer:
    written: list[tuple[bytes, bytes | None]] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        assert conf["allow.auto.create.topics"] is False  # a deleted members topic stays deleted

    def produce(self, topic: str, value: bytes | None, key: bytes) -> None:
        _Producer.written.append((key, value))

    def flush(self, timeout: float) -> int:
        return 0


def _roster(monkeypatch: pytest.MonkeyPatch, producer: type) -> Any:
    """A roster whose members records go to ``producer`` (written again at every chance)."""
    from services.worker.query import members

    monkeypatch.setattr(members, "Producer", producer)
    monkeypatch.setattr(members, "_ANNOUNCE_EVERY_S", 0.0)
    _Producer.written = []
    return members.Roster({"bootstrap.servers": "127.0.0.1:1"}, group_id="g", input_topic="in",
                          directory_topic=None, members_topic="m", standby_replicas=0)


def test_a_worker_writes_its_address_again_until_it_clears_it(monkeypatch: pytest.MonkeyPatch) -> None:

    roster = _roster(monkeypatch, _Producer)
    roster.announce("w1", "http://w1:8081")
    roster._announce_again()
    roster._announce_again()
    assert [v is not None for _k, v in _Producer.written] == [True, True, True]
    roster.announce("w1", None)  # a clean leave
    roster._announce_again()
    assert [v is not None for _k, v in _Producer.written] == [True, True, True, False]  # nothing after the clear
    assert {k for k, _v in _Producer.written} == {member_key("g", "w1")}


def test_a_clear_is_never_overtaken_by_a_write_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The roster's thread writes again while the worker closes: the clear comes last."""

    started, release = threading.Event(), threading.Event()

    class _Slow(_Producer):
        def flush(self, timeout: float) -> int:
            if len(_Producer.written) == 2:  # the write again: hold it until the clear is asked
                started.set()
                release.wait(5)
            return 0

    roster = _roster(monkeypatch, _Slow)
    roster.announce("w1", "http://w1:8081")
    again = threading.Thread(target=roster._announce_again)
    again.start()
    assert started.wait(5)
    clear = threading.Thread(target=roster.announce, args=("w1", None))
    clear.start()
    release.set()
    again.join(5)
    clear.join(5)
    assert [v is not None for _k, v in _Producer.written] == [True, True, False]
