"""The compiled general path (fifolane/compiled.py) is used only when it is current."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fifolane import compiled
from fifolane.config import PROJECT_ROOT


@pytest.fixture
def build_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A build directory of its own: a stamp and no modules."""
    monkeypatch.setattr(compiled, "BUILD", tmp_path / "_compiled")
    monkeypatch.setattr(compiled, "STAMP", tmp_path / "_compiled" / "stamp.json")
    monkeypatch.delenv("FIFOLANE_COMPILED", raising=False)
    compiled._current.cache_clear()
    yield tmp_path / "_compiled"
    compiled._current.cache_clear()


def _stamp(build: Path, **changes: object) -> None:
    build.mkdir(parents=True, exist_ok=True)
    stamp = {"python": compiled._tag(), "sources": compiled._digests(), **changes}
    (build / "stamp.json").write_text(json.dumps(stamp))


def test_not_built_means_pure_python(build_dir: Path) -> None:
    assert compiled.status() == "not built"
    path = ["/src/services/worker"]
    compiled.activate("services.worker", path)
    assert path == ["/src/services/worker"]


def test_a_current_build_goes_first_on_the_packages_path(build_dir: Path) -> None:
    _stamp(build_dir)
    assert compiled.status() == "current"
    path = ["/src/services/worker"]
    compiled.activate("services.worker", path)
    compiled.activate("services.worker", path)  # once
    assert path == [str(build_dir / "services" / "worker"), "/src/services/worker"]
    assert str(build_dir) not in sys.path  # its package directories would shadow the real ones


def test_compiled_modules_import_from_any_directory(tmp_path: Path) -> None:
    """An app run elsewhere, which imports fifolane.serde before services.worker, gets the
    real packages (the build's directories are no namespace packages on sys.path)."""
    code = ("import fifolane.serde, sys; from services.worker import Event, App; "
            "import services.worker.events as e; print(e.__file__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    if compiled.status() == "current":
        assert done.stdout.strip().endswith(".so")


def test_a_source_changed_since_the_build_means_pure_python_for_all(build_dir: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    sources = compiled._digests()
    sources["services.worker.events"] = "0" * 64  # built from another events.py
    _stamp(build_dir, sources=sources)
    assert compiled.status() == "stale: services.worker.events changed since the build"
    path = ["/src/fifolane/serde"]
    compiled.activate("fifolane.serde", path)  # another package's module changed: none is used
    assert path == ["/src/fifolane/serde"]
    assert "compiled modules not used (stale: services.worker.events changed since the build)" in caplog.text


def test_a_build_of_other_modules_is_not_used(build_dir: Path) -> None:
    """Its directory would also hold modules that no stamp check covers."""
    _stamp(build_dir, sources={**compiled._digests(), "services.worker.runtime": "0" * 64})
    assert compiled.status() == "built for another list of modules"
    sources = compiled._digests()
    del sources["services.worker.events"]
    _stamp(build_dir, sources=sources)
    assert compiled.status() == "built for another list of modules"


def test_another_python_or_switched_off_means_pure_python(build_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stamp(build_dir, python="cpython-399")
    assert compiled.status() == f"built for cpython-399, this is {compiled._tag()}"
    _stamp(build_dir)
    monkeypatch.setenv("FIFOLANE_COMPILED", "0")
    assert compiled.status() == "off"
    path: list[str] = []
    compiled.activate("services.worker", path)
    assert path == []


def test_the_modules_in_use_are_the_ones_status_says() -> None:
    """In this process: compiled modules when the build is current (./dev builds it), the
    plain sources otherwise (FIFOLANE_COMPILED=0, no C compiler)."""
    state = compiled.status()
    for name in compiled.MODULES:
        where = Path(importlib.import_module(name).__file__ or "")
        if state == "current":
            assert where.is_relative_to(compiled.BUILD) and where.suffix == ".so", name
        else:
            assert where == compiled._source(name), name


def test_the_command_line_reports_the_status() -> None:
    done = subprocess.run([sys.executable, "-m", "fifolane.compiled", "status"], capture_output=True, text=True,
                          cwd=PROJECT_ROOT, check=False, timeout=60)
    assert done.returncode == 0
    assert done.stdout.strip() == compiled.status()


def test_the_switch_is_not_taken_for_an_unknown_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Settings refuse unknown FIFOLANE_* variables; this one is known (not a setting)."""
    from fifolane.config import load_settings

    monkeypatch.setenv("FIFOLANE_COMPILED", "0")
    monkeypatch.setenv("FIFOLANE_HOME", str(tmp_path))
    assert load_settings().home == tmp_path


def test_the_per_event_objects_behave_as_plain_dataclasses() -> None:
    """Event, Row and Write have an __init__ of their own (native when compiled): they still
    copy, pickle, replace and compare like the dataclasses they are, in both modes."""
    import copy
    import dataclasses
    import pickle

    from services.worker import Event
    from services.worker.effects import Write
    from services.worker.rows import Row

    event = Event("reservation", "R1", "F1", 3, "upsert", {"seats": 2}, 0, 41, 1700, raw=b"v",
                  headers=[("h", b"1")])
    assert event.lane == "F1" and event.entity_key == b"reservation/R1" and event.passed == frozenset()
    assert Event("t", "k", "g", 1, "delete", None, 0, 0, 0).headers == []
    assert Event("t", "k", "g", 1, "delete", None, 0, 0, 0).headers is not \
        Event("t", "k", "g", 1, "delete", None, 0, 0, 0).headers  # a fresh list per event
    objects = [event, Row(3, False, "F1", b"v"), Write("reservation", "R1", "F1", 3, b"v", {"seats": 2})]
    for obj in objects:
        for twin in (copy.copy(obj), copy.deepcopy(obj), pickle.loads(pickle.dumps(obj))):
            assert twin == obj and twin is not obj and type(twin) is type(obj)
        assert repr(obj).startswith(type(obj).__name__ + "(")
    deep = copy.deepcopy(event)
    deep.headers.append(("x", b"2"))
    assert event.headers == [("h", b"1")]
    moved = dataclasses.replace(event, group="F2", value={"seats": 3})
    assert (moved.group, moved.lane, moved.value, moved.offset) == ("F2", "F1", {"seats": 3}, 41)
    assert [f.name for f in dataclasses.fields(Event)][:6] == ["type", "key", "group", "version", "op", "value"]
