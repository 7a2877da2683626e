"""One secured Kafka for the tests under tests/secure/ (TLS, SASL/SCRAM-SHA-512, ACLs).

The broker is ``fifolane kafka up --secure`` itself (a LocalCluster with ``secure=True``),
started once per session on free ports in this process's own test home and shared by every
secure test; each test has its own uuid-suffixed topics, so the ACLs a test grants never
reach another test's topics.

Fixtures:
    secure_cluster  (session)  the LocalCluster (its ``secure_files`` hold CA and passwords)
    secure          a :class:`SecureSetup`: the admin's settings with this test's topics
                    (created), ``as_user(name)`` for any SCRAM user, ``grant(role, user, ...)``
    spark           (session)  the suite's SparkSession (the same one tests/spark/ uses)
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka_fixtures import SHARED_LIBS, TEST_HOMES, _reap_stale_homes, make_settings
from secure_support import SecureSetup

from fifolane.cluster import LocalCluster
from fifolane.topics import ensure_topics


@pytest.fixture(scope="session")
def secure_cluster() -> Iterator[LocalCluster]:
    """A 1-node secured LocalCluster (certificates, users and broker made fresh)."""
    _reap_stale_homes()
    home = TEST_HOMES / f"{os.getpid()}-secure"
    (home / "kafka").mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # so `fifolane kafka up` finds the jars there too
        (home / "kafka" / "libs").symlink_to(SHARED_LIBS)
    cluster = LocalCluster(home, 1, libs=SHARED_LIBS, secure=True)
    cluster.up(timeout=240, fresh=True)
    try:
        yield cluster
    finally:
        cluster.down(timeout=15)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def secure(secure_cluster: LocalCluster, tmp_path: Path) -> SecureSetup:
    admin = make_settings(secure_cluster.bootstrap_servers, home=tmp_path / "home",
                          **secure_cluster.secure_files.client_settings("admin"))
    ensure_topics(admin)
    return SecureSetup(secure_cluster, admin)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The suite's ``local[2]`` SparkSession (one per process; tests/spark/ gets the same)."""
    from fifolane.config import load_settings
    from spark.session import get_session

    session = get_session("local[2]", "fifolane-tests", home=load_settings().home)
    try:
        yield session
    finally:
        session.stop()
