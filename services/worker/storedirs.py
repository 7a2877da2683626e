"""Deleting a RocksDB store's directory, so that a kill midway leaves no half store behind.

``shutil.rmtree`` deletes file by file: a worker killed in the middle of a wipe (a store
rebuilt from its changelog) would leave, say, ``CURRENT`` without the ``MANIFEST`` it names,
and RocksDB would refuse to open the store again. The directory is renamed first (atomic),
so the store path either holds the whole store or nothing; what a kill leaves of the renamed
copy is deleted by the next drop of that path.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

__all__ = ["drop"]


def drop(path: Path) -> None:
    """Delete the store directory ``path`` (nothing if there is none)."""
    trash = path.with_name(path.name + ".dropped")
    shutil.rmtree(trash, ignore_errors=True)  # left by a kill during an earlier drop
    with contextlib.suppress(FileNotFoundError):
        path.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)
