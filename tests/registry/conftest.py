"""A real Schema Registry (Apicurio Registry, Confluent-compatible API) for the session.

Started on first use and stopped at the end; never skipped: if it cannot be fetched or
started, the tests using it error with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from apicurio import ApicurioRegistry, start_apicurio

from fifolane.config import load_settings


@pytest.fixture(scope="session")
def apicurio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApicurioRegistry]:
    """Apicurio Registry on 127.0.0.1 (in-memory storage); its jars cached under the
    project home so they are fetched once per machine."""
    registry = start_apicurio(load_settings().home, tmp_path_factory.mktemp("apicurio"))
    try:
        yield registry
    finally:
        registry.stop()
