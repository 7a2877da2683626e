"""Quix Streams in its own venv (it pins an older confluent-kafka than fifolane).

:func:`quix_python` creates ``benchmarks/.venv-quix`` on first use (``python -m venv`` +
``pip install quixstreams``) and returns its interpreter, or why it could not.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["QUIX_VENV", "QuixEnv", "quix_python"]

QUIX_VENV = Path(__file__).resolve().parent / ".venv-quix"
_PACKAGE = "quixstreams"


@dataclass(frozen=True)
class QuixEnv:
    """The Quix venv: its python and quixstreams version, or the reason it is missing."""

    python: Path | None
    version: str | None
    confluent_kafka: str | None
    error: str | None = None


def _versions(python: Path) -> tuple[str | None, str | None]:
    code = ("from importlib.metadata import version as v; "
            "print(v('quixstreams')); print(v('confluent-kafka'))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        return None, None
    lines = out.stdout.split()
    return lines[0], lines[1] if len(lines) > 1 else None


def quix_python(timeout: float = 600.0) -> QuixEnv:
    """The venv's python, installing Quix Streams if needed; never raises."""
    python = QUIX_VENV / "bin" / "python"
    try:
        if python.exists():
            qv, ck = _versions(python)
            if qv:
                return QuixEnv(python, qv, ck)
        subprocess.run([sys.executable, "-m", "venv", str(QUIX_VENV)], check=True,
                       capture_output=True, timeout=timeout)
        pip = subprocess.run([str(python), "-m", "pip", "install", "-q", _PACKAGE],
                             capture_output=True, text=True, timeout=timeout)
        if pip.returncode != 0:
            return QuixEnv(None, None, None, f"pip install {_PACKAGE} failed: {pip.stderr[-800:]}")
        qv, ck = _versions(python)
        if not qv:
            return QuixEnv(None, None, None, f"{_PACKAGE} installed but not importable")
        return QuixEnv(python, qv, ck)
    except (OSError, subprocess.SubprocessError) as exc:
        return QuixEnv(None, None, None, f"cannot create {QUIX_VENV}: {exc}")
