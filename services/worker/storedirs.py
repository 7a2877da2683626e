"""A worker's store directories: one process at a time (:func:`claim`), and deleting a
RocksDB store's directory so that a kill midway leaves no half store behind (:func:`drop`).

Claim. Two worker processes with the same ``--worker-id`` on one machine share the state
directory (``<home>/state/<worker id>``). Before this claim the second one joined the group,
fenced the first one's consumer and producer, and then failed to open the partitions'
stores, whose RocksDB ``LOCK`` the first one held, again and again: the two took turns until
one gave up, and that could be the worker that had been running for days. The claim is an
exclusive ``flock`` on ``<store root>/OWNER``, taken when the store manager is made, before
any Kafka client: the second process stops at once, saying which process holds the
directory, and the first one never notices. The kernel lets go of the lock when the holding
process exits, however it exits, so a worker restarted after a crash claims it again.

``shutil.rmtree`` deletes file by file: a worker killed in the middle of a wipe (a store
rebuilt from its changelog) would leave, say, ``CURRENT`` without the ``MANIFEST`` it names,
and RocksDB would refuse to open the store again. The directory is renamed first (atomic),
so the store path either holds the whole store or nothing; what a kill leaves of the renamed
copy is deleted by the next drop of that path.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import time
from pathlib import Path

from fifolane.errors import StateError

__all__ = ["OWNER_FILE", "claim", "drop", "make_root"]

OWNER_FILE = "OWNER"
#: root -> the open file holding its lock (for this process's life: closing it would let go).
_HELD: dict[Path, int] = {}


#: the most of another process's OWNER line a refusal shows
_HOLDER_CHARS = 120


def make_root(root: Path, worker_id: str | None) -> None:
    """Make a store manager's directory ``root`` and, given the ``worker_id`` that owns it,
    :func:`claim` it; :class:`StateError` naming the path and ``--state-dir`` if it cannot
    be used (a file where a directory should be, no permission, OWNER a directory)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        if worker_id is not None:
            claim(root, worker_id)
    except (NotADirectoryError, FileExistsError, IsADirectoryError, PermissionError, FileNotFoundError) as exc:
        raise StateError(_unusable(root, exc)) from None


def _unusable(root: Path, exc: OSError) -> str:
    path = exc.filename or root
    if isinstance(exc, IsADirectoryError):
        why = f"{path} is a directory, not the lock file {OWNER_FILE} it should be: remove it"
    elif isinstance(exc, NotADirectoryError | FileExistsError):
        why = f"a part of {root} is a file, not a directory ({exc.strerror})"
    elif isinstance(exc, PermissionError):
        why = f"no permission to write {path}"
    else:
        why = f"{path} cannot be made ({exc.strerror})"
    return (f"cannot use the state directory {root}: {why}; give --state-dir a directory this user "
            "can create and write (default: <FIFOLANE_HOME>/state/<worker id>)")


def _holder(fd: int) -> str:
    """The other process's OWNER line, printable and short (it may hold anything)."""
    text = os.read(fd, 500).decode("utf-8", "replace")
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    if len(text) > _HOLDER_CHARS:
        text = text[:_HOLDER_CHARS - 3] + "..."
    return text or "unknown"


def claim(root: Path, worker_id: str) -> None:
    """Hold ``root`` (a store manager's directory) for this process, or raise
    :class:`StateError` naming the process that holds it. Claiming a root this process
    holds already is a no-op (a store manager made again in the same process)."""
    root = root.resolve()
    if root in _HELD:
        return
    root.mkdir(parents=True, exist_ok=True)
    path = root / OWNER_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise StateError(
            f"another worker process uses the state directory {root} ({holder}): is a worker with "
            f"--worker-id {worker_id} running on this machine already? Give each worker its own "
            "--worker-id (the same id with another --state-dir fences the running worker), or stop the other one first") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, since "
                 f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}".encode())
    _HELD[root] = fd


def drop(path: Path) -> None:
    """Delete the store directory ``path`` (nothing if there is none)."""
    trash = path.with_name(path.name + ".dropped")
    shutil.rmtree(trash, ignore_errors=True)  # left by a kill during an earlier drop
    with contextlib.suppress(FileNotFoundError):
        path.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)
