"""PosixStorage refuses every key whose path leaves what it names: ``..`` segments and symbolic links below the
root, for put, get, head, delete and list alike. Real files and links."""

from __future__ import annotations

import os

import pytest

from ckptio.errors import StorageError
from ckptio.storage.posix.posix_storage import PosixStorage


@pytest.fixture
def layout(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "foreign.distcp").write_bytes(b"foreign")
    (root / "inner").mkdir()
    (root / "inner" / "f").write_bytes(b"inner")
    os.symlink(outside, root / "step-00000005")  # a pre-created symlinked step directory
    os.symlink(root / "inner", root / "alias")  # a link that stays inside the root is refused too
    os.symlink(outside / "foreign.distcp", root / "filelink")
    return PosixStorage(str(root), fsync=False), outside


@pytest.mark.parametrize("key", ["step-00000005/foreign.distcp", "step-00000005/new", "alias/f", "filelink",
                                 "a/../../outside/foreign.distcp", "../outside/foreign.distcp"])
def test_every_operation_refuses_keys_through_links(layout, key):
    storage, outside = layout
    with pytest.raises(StorageError):
        storage.put(key, b"x")
    with pytest.raises(StorageError):
        storage.get(key)
    with pytest.raises(StorageError):
        storage.head(key)
    with pytest.raises(StorageError):
        storage.delete(key)
    assert sorted(os.listdir(outside)) == ["foreign.distcp"]
    assert (outside / "foreign.distcp").read_bytes() == b"foreign"


def test_listing_neither_follows_nor_reports_links(layout):
    storage, outside = layout
    assert [i.key for i in storage.list("")] == ["inner/f"]
    assert storage.list_dirs("") == ["inner"]
    with pytest.raises(StorageError):
        storage.list_dirs("step-00000005")
    with pytest.raises(StorageError):
        storage.list_dirs("alias")
    with pytest.raises(StorageError):
        list(storage.list("step-00000005/"))
    with pytest.raises(StorageError):
        storage.delete_prefix("step-00000005")
    assert (outside / "foreign.distcp").read_bytes() == b"foreign"


def test_a_root_that_is_itself_a_link_works(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "linked")
    storage = PosixStorage(str(tmp_path / "linked"), fsync=False)
    storage.put("step-00000001/a", b"x")
    assert storage.get("step-00000001/a") == b"x" and (real / "step-00000001" / "a").exists()
