"""`topics create` reads back what the brokers made, also from a broker that learns of a new
topic late (3 nodes): no topic is left at replication -1 and warned about (a CI run showed it)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import fifolane.topics as topics
from fifolane.config import Settings


class _LateBroker:
    """An admin client whose metadata requests go to two brokers in turn: the first knows a
    topic as soon as it is created, the second only from the fourth look after that."""

    def __init__(self) -> None:
        self.created: dict[str, int] = {}  # name -> looks since its creation
        self.looks = 0

    def create_topics(self, new: list[Any], request_timeout: float) -> dict[str, Future[None]]:
        out = {}
        for t in new:
            self.created[t.topic] = 0
            fut: Future[None] = Future()
            fut.set_result(None)
            out[t.topic] = fut
        return out

    def list_topics(self, timeout: float) -> Any:
        self.looks += 1
        late = self.looks % 2 == 0  # the second broker answers
        shown = {}
        for name in self.created:
            self.created[name] += 1
            if not late or self.created[name] >= 4:
                part = SimpleNamespace(replicas=[0, 1, 2], leader=0)
                shown[name] = SimpleNamespace(error=None, partitions={0: part})
        return SimpleNamespace(topics=shown, brokers={0: None, 1: None, 2: None})

    def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Future[dict[str, Any]]]:
        out = {}
        for r in resources:
            fut: Future[dict[str, Any]] = Future()
            fut.set_result({})
            out[r] = fut
        return out


def test_created_topics_are_read_back_once_the_broker_lists_them(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    admin = _LateBroker()
    monkeypatch.setattr(topics, "_admin", lambda _s: admin)
    settings = Settings(bootstrap_servers="127.0.0.1:1", home=tmp_path, replication_factor=-1)
    states = topics.ensure_topics(settings, partitions=2, timeout=5)
    assert set(states) == set(topics.ROLES)
    assert {role: (s.replication_factor, s.created) for role, s in states.items()} == {
        role: (3, True) for role in topics.ROLES}
