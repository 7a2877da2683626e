"""Where views go: Parquet under an output folder, plus a small build manifest.

Layout: ``<out>/<view name>/`` per view and ``<out>/_build.json`` describing the build
(time, as-of, end offsets, entity counts per writer schema). The reservation table, the only
large view, is partitioned by ``state`` (few values, the usual filter); the aggregate views
are small and written as one file each.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

__all__ = ["MANIFEST", "PARTITION_BY", "read_manifest", "read_view", "write_manifest", "write_view"]

MANIFEST = "_build.json"
#: Partition columns per view (views not listed are small: one file).
PARTITION_BY: dict[str, tuple[str, ...]] = {"reservations": ("state",)}


def write_view(name: str, df: DataFrame, out: Path) -> str:
    """Write one view as Parquet to ``<out>/<name>``, replacing an earlier build.

    Returns the view's schema (JSON), kept in the manifest: an empty partitioned view has no
    file to infer it from, and partitioning moves partition columns last on read.
    """
    partition_by = PARTITION_BY.get(name, ())
    writer = (df if partition_by else df.coalesce(1)).write.mode("overwrite")
    if partition_by:
        writer = writer.partitionBy(*partition_by)
    writer.parquet(str(out / name))
    return df.schema.json()


def read_view(spark: SparkSession, name: str, out: Path) -> DataFrame:
    """A view written by :func:`write_view` (partition columns restored)."""
    path = out / name
    if not path.is_dir():
        from fifolane.errors import FifolaneError

        known = sorted(p.name for p in out.iterdir() if p.is_dir()) if out.is_dir() else []
        raise FifolaneError(
            f"no view '{name}' under {out}; built views: {', '.join(known) or 'none (run fifolane views build)'}"
        )
    schema = ((read_manifest(out) or {}).get("schemas") or {}).get(name)
    if schema is None:
        return spark.read.parquet(str(path))
    struct = StructType.fromJson(json.loads(schema))
    return spark.read.schema(struct).parquet(str(path)).select(*struct.fieldNames())


def write_manifest(out: Path, manifest: dict[str, Any]) -> Path:
    """Write the build manifest ``<out>/_build.json``."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
    return path


def read_manifest(out: Path) -> dict[str, Any] | None:
    """The manifest of the last build in ``out``, if any."""
    try:
        data: dict[str, Any] = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data
