"""The bundled Avro schemas (``*.avsc``) of fifolane's entity types and system records."""

from __future__ import annotations

from pathlib import Path

__all__ = ["SCHEMAS_DIR"]

#: Directory holding the current schemas; older versions live in ``SCHEMAS_DIR / "history"``.
SCHEMAS_DIR = Path(__file__).resolve().parent
