"""Leases and readers of a listener, against real Kafka: what a running `fifolane listen`
does when the listener changes under it, what `listeners add` does with an expired lease,
and a reader of an output topic that holds records which are not notifications.

Before: a running `listen` renewed the registration it had read at its start, so it brought
a removed listener back and undid a `--replace`; adding an expired listener again said
"already registered" and left it expired; one non-JSON record in the output topic crashed
every `listen` of it with a traceback.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Producer
from kafka_fixtures import wait_until

from fifolane.cli.listeners import listeners as listeners_cli
from fifolane.config import Settings
from fifolane.errors import ListenerError
from listeners.client import ListenerClient
from listeners.model import ListenerSpec
from listeners.notify import HEADER_LISTENER
from listeners.registry import get_listener, list_listeners, register, remove

pytestmark = pytest.mark.integration


def test_a_running_listen_does_not_bring_back_a_removed_listener(settings: Settings, topics: Any,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    register(settings, ListenerSpec(name="leased", filter="true", lease=timedelta(seconds=30)))
    with ListenerClient(settings, "leased") as client:
        client.renew()  # the registration is still the one it read: renewed
        assert get_listener(settings, "leased").renewed_at == client.spec.renewed_at is not None
        assert remove(settings, "leased") is True
        with caplog.at_level(logging.WARNING):
            client.renew()
        assert "removed or replaced" in caplog.text
        assert list_listeners(settings) == []  # not written back
        client.poll(0.1)  # no renewal is due any more
        assert list_listeners(settings) == []


def test_a_running_listen_does_not_undo_a_replace(settings: Settings, topics: Any) -> None:
    register(settings, ListenerSpec(name="leased", filter="value.amount > 1.0", lease=timedelta(seconds=30)))
    with ListenerClient(settings, "leased") as client:
        new = register(settings, ListenerSpec(name="leased", filter="value.amount > 5.0"), replace=True)
        client.renew()
        now = get_listener(settings, "leased")
        assert (now.filter, now.lease, now.created_at, now.renewed_at) == (
            "value.amount > 5.0", None, new.created_at, None)


def test_adding_an_expired_listener_again_renews_its_lease(settings: Settings, topics: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {"FIFOLANE_BOOTSTRAP_SERVERS": settings.resolved_bootstrap(),
                 "FIFOLANE_INPUT_TOPIC": settings.input_topic,
                 "FIFOLANE_REGISTRY_TOPIC": settings.registry_topic,
                 "FIFOLANE_LISTENER_OUTPUT_TOPIC": settings.listener_output_topic}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    args = ["add", "short", "--filter", "value.amount > 1.0", "--lease", "2s"]
    runner = CliRunner()
    assert runner.invoke(listeners_cli, args).exit_code == 0
    first = get_listener(settings, "short")
    wait_until(lambda: get_listener(settings, "short").is_expired(), timeout=10)
    res = runner.invoke(listeners_cli, args)
    assert res.exit_code == 0 and "its lease had run out: renewed" in res.output, res.output
    again = get_listener(settings, "short")
    assert again.created_at == first.created_at and again.renewed_at is not None and not again.is_expired()
    res = runner.invoke(listeners_cli, args)  # not expired now: nothing to do
    assert res.exit_code == 0 and "same definition" in res.output and "renewed" not in res.output
    assert get_listener(settings, "short").renewed_at == again.renewed_at


def test_a_filter_error_is_labelled_a_filter_error_when_the_texts_are_equal() -> None:
    text = '{"a": value.seats}'
    res = CliRunner().invoke(listeners_cli, ["add", "x", "--type", "reservation", "--filter", text, "--convert", text])
    assert res.exit_code == 2
    assert res.output.startswith("error: invalid filter"), res.output
    assert "invalid converter" not in res.output


def test_records_that_are_not_notifications_are_skipped_not_fatal(settings: Settings, topics: Any,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    spec = register(settings, ListenerSpec(name="mine", filter="true"))
    topic = spec.topic(settings)

    def note(seq: int) -> bytes:
        return json.dumps({"listener": "mine", "partition": 0, "seq": seq, "key": f"K{seq}", "kind": "created",
                           "type": "reservation", "value": {"n": seq}}).encode()
    producer = Producer(settings.kafka_config())
    for value, headers in [(note(1), [(HEADER_LISTENER, b"mine")]),
                           (b"hello", None),  # no header: taken for this listener's, not JSON
                           (b"[" * 100_000, [(HEADER_LISTENER, b"mine")]),  # nested too deep
                           (b'{"listener": "mine", "partition": "x", "seq": null}', None),
                           (b"{}", [(HEADER_LISTENER, b"other")]),  # another listener's: skipped silently
                           # shaped like one but not one: a seq past a worker's (every real one
                           # would look like a duplicate), a negative partition, no kind/type/key
                           (b'{"listener": "mine", "partition": 0, "seq": 99999999999999999999999}', None),
                           (b'{"listener": "mine", "partition": -1, "seq": -5}', None),
                           (b'{"listener": "mine", "partition": 0, "seq": 7}', None),
                           (note(2), [(HEADER_LISTENER, b"mine")])]:
        producer.produce(topic, value, b"reservation/K", partition=0, headers=headers)
    assert producer.flush(10) == 0
    got: list[dict[str, Any]] = []
    with ListenerClient(settings, "mine", from_beginning=True) as client, caplog.at_level(logging.WARNING):
        wait_until(lambda: bool(got.extend(client.poll(0.2))) or len(got) >= 2, timeout=30,
                   message=lambda: f"{got}")
        assert client.skipped == 6
    assert [n["seq"] for n in got] == [1, 2]
    assert "skipped: not a notification" in caplog.text


def _first(monkeypatch: pytest.MonkeyPatch, when: bytes, key: str, value: bytes | None) -> None:
    """Another client's write of ``key`` lands between our read of the registry and our
    write of a value containing ``when``."""
    import listeners.registry as registry

    write = registry._write

    def racing(s: Settings, k: str, v: bytes | None) -> int:
        if v is not None and when in v:
            write(s, key, value)
        return write(s, k, v)
    monkeypatch.setattr(registry, "_write", racing)


def test_an_add_that_lost_a_race_for_its_name_is_told(settings: Settings, topics: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `listeners add` of one name at once: the other one wrote first, and it stands."""
    theirs = ListenerSpec(name="race", filter="value.seats > 5")
    _first(monkeypatch, b"value.seats > 1", "race", theirs.to_json())
    with pytest.raises(ListenerError, match=r"'race' was changed at the same time: another client registered "
                                            r"it \(filter 'value.seats > 5'\) first, and that stands"):
        register(settings, ListenerSpec(name="race", filter="value.seats > 1"))
    now = get_listener(settings, "race")
    assert (now.filter, now.created_at) == ("value.seats > 5", theirs.created_at)


def test_two_adds_of_one_definition_at_once_both_succeed(settings: Settings, topics: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    theirs = ListenerSpec(name="twin", filter="value.seats > 1")
    _first(monkeypatch, b'"twin"', "twin", theirs.to_json())
    done = register(settings, ListenerSpec(name="twin", filter="value.seats > 1"))
    assert done.created_at == theirs.created_at == get_listener(settings, "twin").created_at


def test_a_renewal_racing_a_remove_leaves_it_removed(settings: Settings, topics: Any,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`listeners remove` lands between a running listen's read of the registry and its
    renewal: the removal stands (with a 1 s lease, renewals come every 0.33 s)."""
    spec = register(settings, ListenerSpec(name="short", filter="true", lease=timedelta(seconds=1)))
    _first(monkeypatch, b'"renewed_at":"', "short", None)
    with ListenerClient(settings, "short", spec=spec) as client:
        client.renew()
        assert client._next_renewal is None  # renewals stop
    assert list_listeners(settings) == []
