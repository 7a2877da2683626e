"""A store's directory is dropped whole (services/worker/storedirs.py): a kill during a wipe
leaves either the whole store or none, never a half store RocksDB refuses to open."""

from __future__ import annotations

from pathlib import Path

from services.worker.state import StoreManager
from services.worker.storedirs import drop


def _store_with_a_row(root: Path) -> None:
    stores = StoreManager(root, "g", group_index=False)
    stores.open(0).restore_batch([(b"reservation/E", 1, False, "F1", b"v")], 5)
    stores.close_all()


def test_a_wipe_leaves_an_empty_store_and_no_copy(tmp_path: Path) -> None:
    _store_with_a_row(tmp_path)
    stores = StoreManager(tmp_path, "g", group_index=False)
    try:
        store = stores.wipe(0)
        assert store.is_empty() and store.changelog_offset == 0
    finally:
        stores.close_all()
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["p0"]


def test_a_kill_between_the_rename_and_the_delete_leaves_a_store_that_opens(tmp_path: Path) -> None:
    _store_with_a_row(tmp_path)
    store_dir = tmp_path / "g" / "p0"
    # What a kill right after drop()'s rename leaves: the whole old store under the new name.
    store_dir.rename(store_dir.with_name("p0.dropped"))
    stores = StoreManager(tmp_path, "g", group_index=False)
    try:
        assert stores.open(0).is_empty()  # the store path holds nothing: a new, empty store
        stores.wipe(0)  # the next drop removes the copy the kill left
    finally:
        stores.close_all()
    assert not (tmp_path / "g" / "p0.dropped").exists()


def test_drop_of_a_missing_directory_is_nothing(tmp_path: Path) -> None:
    drop(tmp_path / "absent")
    assert list(tmp_path.iterdir()) == []
