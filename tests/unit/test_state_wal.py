"""RocksDB's write-ahead log in the partition stores (services/worker/state.py).

Off by default: the changelog is the log, so a crash may lose the rows RocksDB had not
flushed, and what is left is a prefix of the committed batches whose ``m:changelog`` marker
belongs to it (the restore replays from there). A clean close flushes. On (``wal=True``,
for the query readers' secondaries): a crash loses nothing.

Each writer runs in its own process and ends with ``os._exit`` (no close, no flush), as a
SIGKILL would end it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from services.worker.state import Row, StoreManager

_WRITER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from services.worker.state import Row, StoreManager
    root, wal, how = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3]
    stores = StoreManager(root, "g", group_index=False, wal=wal, marks=lambda p: 1000)
    store = stores.open(0)
    for batch in range(3):
        for i in range(100):
            key = f"reservation/R{batch * 100 + i}".encode()
            store.put(key, Row(batch + 1, False, "F1", b"v"), None)
        stores.apply(stores.prepare())
    if how == "close":
        stores.close_all()
    os._exit(0)
""")


def _write(root: Path, *, wal: bool, how: str) -> None:
    subprocess.run([sys.executable, "-c", _WRITER, str(root), "1" if wal else "0", how], check=True,
                   cwd=Path(__file__).resolve().parents[2], timeout=60)


def _rows(root: Path) -> tuple[int, int]:
    """Rows in partition 0's store, and its changelog marker."""
    stores = StoreManager(root, "g", group_index=False)
    try:
        store = stores.open(0)
        return sum(1 for _ in store.iter_committed()), store.changelog_offset
    finally:
        stores.close_all()


def test_a_crash_without_the_log_loses_unflushed_rows_and_their_marker_together(tmp_path: Path) -> None:
    _write(tmp_path, wal=False, how="crash")
    # Nothing was flushed: the store is empty, and so the restore starts at offset 0.
    assert _rows(tmp_path) == (0, 0)


@pytest.mark.parametrize(("wal", "how"), [(False, "close"), (True, "crash"), (True, "close")])
def test_a_clean_close_or_the_log_keeps_every_row(tmp_path: Path, wal: bool, how: str) -> None:
    _write(tmp_path, wal=wal, how=how)
    assert _rows(tmp_path) == (300, 1000)


def test_rows_read_back_as_written_after_a_clean_close(tmp_path: Path) -> None:
    _write(tmp_path, wal=False, how="close")
    stores = StoreManager(tmp_path, "g", group_index=False)
    try:
        assert stores.open(0).get(b"reservation/R250") == Row(3, False, "F1", b"v")
    finally:
        stores.close_all()
