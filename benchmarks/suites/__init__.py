"""The benchmark suites, in run order: name -> ``run(bench) -> None`` (writes its result)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.harness import Bench

__all__ = ["SUITES", "load"]

#: Suite name -> module under benchmarks.suites.
SUITES: dict[str, str] = {
    "ceiling": "ceiling",
    "stateful": "stateful",
    "latency": "latency",
    "app": "app",
    "slow": "slow",
    "stages": "stages",
    "listeners": "listeners",
    "restore": "restore",
    "query": "query",
    "spark": "spark",
    "capacity": "capacity",
    "scaling": "scaling",
}


def load(name: str) -> Callable[[Bench], None]:
    """The ``run`` function of suite ``name``."""
    module = importlib.import_module(f"benchmarks.suites.{SUITES[name]}")
    run: Callable[[Bench], None] = module.run
    return run
