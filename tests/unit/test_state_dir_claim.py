"""One worker process per state directory (services.worker.storedirs.claim)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fifolane.config import PROJECT_ROOT
from fifolane.errors import StateError
from services.worker import storedirs
from services.worker.state import StoreManager

HOLD = """
import sys
from pathlib import Path
from services.worker.storedirs import claim
claim(Path(sys.argv[1]), "w1")
print("held", flush=True)
sys.stdin.read()  # until the test closes our input
"""


def _holder(root: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=PROJECT_ROOT, env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_a_second_process_cannot_claim_a_held_directory(tmp_path: Path) -> None:
    root = tmp_path / "state" / "w1" / "fifolane-app"
    holder = _holder(root)
    try:
        with pytest.raises(StateError) as caught:
            StoreManager(tmp_path / "state" / "w1", "fifolane-app", owner="w1")
        text = str(caught.value)
        assert text.startswith(f"another worker process uses the state directory {root.resolve()} (pid {holder.pid} on ")
        assert "is a worker with --worker-id w1 running on this machine already?" in text
        assert "own --worker-id (the same id with another --state-dir fences the running worker)" in text
        assert root.resolve() not in storedirs._HELD
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(10)
    # The holder is gone (the kernel let go of its lock): the directory is ours now.
    mgr = StoreManager(tmp_path / "state" / "w1", "fifolane-app", owner="w1")
    assert (root / storedirs.OWNER_FILE).read_text().startswith(f"pid {os.getpid()} on ")
    mgr.close_all()


def test_a_killed_holder_lets_go(tmp_path: Path) -> None:
    root = tmp_path / "s"
    holder = _holder(root)
    holder.kill()
    holder.wait(10)
    storedirs.claim(root, "w1")
    storedirs.claim(root, "w1")  # again in the same process: a no-op
    assert root.resolve() in storedirs._HELD


def test_no_owner_no_claim(tmp_path: Path) -> None:
    """Readers and tools that open a store manager without an owner take no claim."""
    StoreManager(tmp_path, "g").close_all()
    assert not (tmp_path / "g" / storedirs.OWNER_FILE).exists()
