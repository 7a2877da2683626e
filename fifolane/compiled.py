"""The worker's general path, compiled: its hot modules built with mypyc, used when current.

    python -m fifolane.compiled build     # ./dev runs it: compile MODULES (needs a C compiler)
    python -m fifolane.compiled status    # compiled and used, stale, or not built
    FIFOLANE_COMPILED=0                   # pure Python even when built

The modules of :data:`MODULES` stay plain Python: they are the source, they are what runs
where nothing was built (no C compiler, the Docker image), and the compiled build behaves
the same (the unit suite passes on both). Compiled with mypyc (the compiler that ships with
mypy), the general path takes about a third less CPU per event (benchmarks/README.md, "The
flights app").

The build goes to ``fifolane/_compiled/`` (git-ignored), never beside the sources, with a
stamp of the SHA-256 of every source it was built from. A package of MODULES calls
:func:`activate` first thing: only if every source is the one the build was made from does
it put the build first on its ``__path__``. A source edited after the build (or another
Python) means pure Python for all of them, never a compiled module older than its source.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

__all__ = ["MODULES", "activate", "build", "status"]

log = logging.getLogger(__name__)

#: The general path's hot modules (benchmarks.app_cpu under py-spy). Not ``codec``: its
#: classes are subclassed by interpreted ones (ConfluentCodec), which mypyc does not allow.
MODULES = (
    "fifolane.serde.entity",
    "fifolane.serde.flatwrite",
    "fifolane.serde.scan",
    "services.worker.calls",
    "services.worker.checkpoint",
    "services.worker.directory",
    "services.worker.effects",
    "services.worker.event",
    "services.worker.events",
    "services.worker.fastpath",
    "services.worker.limits",
    "services.worker.metrics",
    "services.worker.ingest",
    "services.worker.records",
    "services.worker.rows",
    "services.worker.scheduler",
    "services.worker.state",
    "services.worker.table",
    "services.worker.window",
)

ROOT = Path(__file__).resolve().parent.parent  # where the packages of MODULES live
BUILD = Path(__file__).resolve().parent / "_compiled"
STAMP = BUILD / "stamp.json"


def _source(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def _digests() -> dict[str, str]:
    return {m: hashlib.sha256(_source(m).read_bytes()).hexdigest() for m in MODULES}


def _tag() -> str:
    return sys.implementation.cache_tag or f"{sys.implementation.name}-{sys.version_info[:2]}"


def status() -> str:
    """``current``, ``off`` (FIFOLANE_COMPILED=0), ``not built``, or why the build is not used."""
    if os.environ.get("FIFOLANE_COMPILED", "1") == "0":
        return "off"
    try:
        stamp = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return "not built"
    if stamp.get("python") != _tag():
        return f"built for {stamp.get('python')}, this is {_tag()}"
    built = stamp.get("sources", {})
    if set(built) != set(MODULES):  # its directory holds other modules than those checked
        return "built for another list of modules"
    try:
        digests = _digests()
    except OSError as exc:
        return f"a source is missing ({exc})"
    stale = sorted(m for m in MODULES if built[m] != digests[m])
    return f"stale: {', '.join(stale)} changed since the build" if stale else "current"


@cache
def _current() -> bool:
    found = status()
    if found not in ("current", "off", "not built"):
        log.warning("compiled modules not used (%s): run ./dev setup, or `python -m fifolane.compiled "
                    "build`", found)
    return found == "current"


def activate(package: str, path: list[str]) -> None:
    """Put the build of ``package`` first on its ``__path__`` if it is current (called by
    ``fifolane.serde`` and ``services.worker`` before they import their modules)."""
    if not _current():
        return
    where = BUILD.joinpath(*package.split("."))
    if str(where) not in path:
        path.insert(0, str(where))
    _load_shared()


def _load_shared() -> None:
    """Load mypyc's shared library of the build, a top-level module the compiled modules
    import, by its file. The build directory stays off ``sys.path``: its ``fifolane/`` and
    ``services/`` (no ``__init__.py``) would be found there as namespace packages, ahead of
    an editable install's finder, and hide the real ones from code run elsewhere."""
    for so in BUILD.glob("*__mypyc.*"):
        name = so.name.split(".", 1)[0]
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, so)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def build(quiet: bool = False) -> bool:
    """Compile :data:`MODULES` into ``fifolane/_compiled``; False (and pure Python) if it
    fails, for example without a C compiler."""
    shutil.rmtree(BUILD, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="fifolane-compile-") as tmp:
        work = Path(tmp)
        for package in {m.split(".")[0] for m in MODULES}:  # mypy reads the whole packages
            shutil.copytree(ROOT / package, work / package,
                            ignore=shutil.ignore_patterns("__pycache__", "_compiled", "*.so"))
        digests = _digests()
        files = [str(_source(m).relative_to(ROOT)) for m in MODULES]
        done = subprocess.run([sys.executable, "-m", "mypyc", *files], cwd=work, capture_output=True,
                              text=True, check=False, env={**os.environ, "MYPY_CACHE_DIR": str(work / ".mypy")})
        built = sorted(p for p in work.rglob("*.so") if "build" not in p.relative_to(work).parts)
        if done.returncode != 0 or len(built) < len(MODULES):
            if not quiet:
                print(f"fifolane: compiling the general path failed (pure Python is used):\n"
                      f"{(done.stdout + done.stderr)[-2000:]}", file=sys.stderr)
            return False
        for so in built:
            target = BUILD / so.relative_to(work)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(so, target)
    STAMP.write_text(json.dumps({"python": _tag(), "sources": digests}, indent=1))
    _current.cache_clear()
    return True


def main(argv: list[str]) -> int:
    what = argv[0] if argv else "status"
    if what == "build":
        if status() == "current" and "--force" not in argv:
            print("fifolane: the compiled general path is current")
            return 0
        print("== compiling the general path with mypyc (pure Python is used where it fails)")
        ok = build()
        print(f"fifolane: compiled general path: {status() if ok else 'not built'}")
        return 0  # optional: the pure-Python modules work everywhere
    if what == "status":
        print(status())
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
