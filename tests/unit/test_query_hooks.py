"""The query service's partition hooks (services/worker/query/service.py): a partition that
restores (again) loses its view first, in the worker and in its readers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from services.worker.query.service import _Hooks


def test_a_restore_of_an_input_partition_withdraws_its_view_first() -> None:
    calls: list[Any] = []
    service = SimpleNamespace(_input="in", standbys=SimpleNamespace(release=lambda p: calls.append(("release", p))),
                              _closing=lambda p: calls.append(("withdraw", p)))
    def restore(topic: str, p: int) -> str:
        calls.append(("restore", topic, p))
        return "task"
    parts = SimpleNamespace(restore=restore)
    hooks = _Hooks(service, parts)  # type: ignore[arg-type]
    assert hooks.restore("in", 2) == "task"
    assert calls == [("release", 2), ("withdraw", 2), ("restore", "in", 2)]
    calls.clear()
    assert hooks.restore("directory", 1) == "task"  # a directory partition has no owner view
    assert calls == [("restore", "directory", 1)]
