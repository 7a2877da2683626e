"""Module sizes (issue 13): no module in services/ or listeners/ over 400 lines, none
elsewhere in the project's packages over 500."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _sizes(package: str) -> dict[str, int]:
    found = {}
    for p in (ROOT / package).rglob("*.py"):
        rel = p.relative_to(ROOT)
        if not any(part.startswith(".") for part in rel.parts):  # venvs of the benchmarks
            found[str(rel)] = len(p.read_text().splitlines())
    return found


def test_worker_and_listener_modules_stay_small() -> None:
    over = {path: n for package in ("services", "listeners") for path, n in _sizes(package).items() if n > 400}
    assert over == {}


def test_other_modules_stay_under_500_lines() -> None:
    over = {path: n for package in ("fifolane", "spark", "benchmarks", "examples")
            for path, n in _sizes(package).items() if n > 500}
    assert over == {}
