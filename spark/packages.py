"""Which Maven artifacts give Spark its Kafka source and Avro functions.

The connectors should match the pyspark version, but Maven Central can lag behind PyPI
(pyspark 4.3.0 is on PyPI while Central has ``spark-sql-kafka-0-10`` up to 4.2.0 and
``spark-avro`` up to 4.1.1). So each artifact resolves to the pyspark version when Central
has it, else to the newest release of the same major version not newer than pyspark (the
data-source APIs they use are stable within a major version; the test suite checks the
pair end to end). The choice is remembered in ``<home>/spark/packages.json`` so later runs
need no look-up; passing ``spark.jars.packages`` in ``conf`` overrides all of this.
"""

from __future__ import annotations

import json
import logging
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import httpx
import pyspark

__all__ = ["CONNECTORS", "MAVEN_CENTRAL", "connector_packages", "pick_version"]

log = logging.getLogger(__name__)

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
#: artifact ids (group ``org.apache.spark``) of the connectors the views need
CONNECTORS: tuple[str, ...] = ("spark-sql-kafka-0-10_2.13", "spark-avro_2.13")
_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)$")


def _parse(version: str) -> tuple[int, int, int] | None:
    match = _RELEASE.match(version)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def pick_version(wanted: str, available: list[str]) -> str:
    """``wanted`` if available, else the newest release of its major version below it.

    Returns ``wanted`` when nothing fits, so that resolution fails loudly in ivy.
    """
    if wanted in available:
        return wanted
    target = _parse(wanted)
    if target is None:
        return wanted
    candidates = [v for v in (_parse(a) for a in available) if v and v[0] == target[0] and v < target]
    if not candidates:
        return wanted
    return ".".join(map(str, max(candidates)))


def _available(artifact: str) -> list[str]:
    url = f"{MAVEN_CENTRAL}/org/apache/spark/{artifact}/maven-metadata.xml"
    response = httpx.get(url, timeout=20.0, follow_redirects=True)
    response.raise_for_status()
    return [v.text or "" for v in ET.fromstring(response.text).iter("version")]


def connector_packages(home: Path) -> tuple[str, ...]:
    """Maven coordinates (``group:artifact:version``) for ``spark.jars.packages``."""
    wanted = pyspark.__version__
    cache = home / "spark" / "packages.json"
    try:
        remembered = json.loads(cache.read_text())
    except (OSError, ValueError):
        remembered = {}
    chosen: dict[str, str] = remembered.get(wanted, {})
    if set(chosen) != set(CONNECTORS):
        chosen = {}
        for artifact in CONNECTORS:
            try:
                chosen[artifact] = pick_version(wanted, _available(artifact))
            except (httpx.HTTPError, ET.ParseError) as exc:
                log.warning("cannot list %s versions on Maven Central (%s); trying %s", artifact, exc, wanted)
                chosen[artifact] = wanted
            if chosen[artifact] != wanted:
                log.warning("%s %s is not on Maven Central; using %s", artifact, wanted, chosen[artifact])
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_text(json.dumps({**remembered, wanted: chosen}, indent=2))
    return tuple(f"org.apache.spark:{a}:{chosen[a]}" for a in CONNECTORS)
