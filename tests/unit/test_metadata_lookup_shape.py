"""The metadata lookups of an admin client or a producer list all topics, never name one:
a request naming a missing topic makes a broker with ``auto.create.topics.enable`` create it
(its 1 partition, cleanup.policy=delete). Against the real broker:
tests/integration/test_lookups_no_autocreate.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import listeners.registry as registry
from fifolane.config import Settings
from services.worker.kafka import TxnProducer


class _Client:
    """Records list_topics calls; knows the topics it is given (with their partition counts)."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.produce = self.purge = self.close = lambda *args, **kwargs: None  # what TxnProducer binds

    def list_topics(self, *args: Any, **kwargs: Any) -> SimpleNamespace:
        self.calls.append((args, kwargs))
        return SimpleNamespace(topics={
            name: SimpleNamespace(error=None, partitions=dict.fromkeys(range(n))) for name, n in self.topics.items()})


def test_partitions_of_looks_the_topic_up_in_the_full_listing(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _Client({"present": 4})
    monkeypatch.setattr(registry, "AdminClient", lambda conf: client)
    settings = Settings(bootstrap_servers="127.0.0.1:1")

    assert registry._partitions_of(settings, "present", timeout=7.0) == 4
    assert registry._partitions_of(settings, "absent", timeout=7.0) is None
    assert client.calls == [((), {"timeout": 7.0}), ((), {"timeout": 7.0})]


def test_ensure_output_topic_creates_a_missing_one_with_the_input_partition_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(bootstrap_servers="127.0.0.1:1", input_topic="in")
    client = _Client({"in": 6})
    created: list[tuple[str, int, dict[str, str]]] = []
    monkeypatch.setattr(registry, "AdminClient", lambda conf: client)
    monkeypatch.setattr(registry, "create_topic", lambda s, name, n, config: created.append((name, n, config)))

    assert registry.ensure_output_topic(settings, "out") == 6
    assert created == [("out", 6, {"cleanup.policy": "delete"})]
    assert all(args == () for args, _ in client.calls)  # no request named a topic


def test_producer_refresh_lists_all_topics() -> None:
    client = _Client({})
    producer = TxnProducer({}, transactional=False, factory=lambda conf: client)

    producer.refresh("maybe.deleted", timeout=2.5)
    assert client.calls == [((), {"timeout": 2.5})]
