"""Fault suite options: ``--long`` (or ``FIFOLANE_FAULTS_LONG=1``) runs the long variants.

Give the path so this conftest loads at start-up: ``pytest tests/faults --long``.
"""

from __future__ import annotations

import os

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--long", action="store_true", default=False,
                     help="fault suite: run the long variants (many kill cycles, more data)")


@pytest.fixture
def long_run(request: pytest.FixtureRequest) -> bool:
    """True for the long variants (``--long`` or ``FIFOLANE_FAULTS_LONG=1``)."""
    return bool(request.config.getoption("--long", default=False)) or os.environ.get("FIFOLANE_FAULTS_LONG") == "1"
