"""SubtreeStorage (the local level's records below ``levels/local/``) passes the conformance suite over POSIX,
and shows its inner directory below its prefix."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptio.errors import ConfigError, NotFoundError
from ckptio.storage import PosixStorage, Storage
from ckptio.storage.subtree import SubtreeStorage
from ckptio.testing.conformance import StoreTests


class TestSubtreeOverPosix(StoreTests):
    @pytest.fixture
    def storage(self, tmp_path: Path) -> Storage:
        return SubtreeStorage(PosixStorage(tmp_path / "root", fsync=False), "levels/local")

    def test_not_found_carries_context(self, storage: Storage) -> None:
        # A subtree's errors name the root of the job (the inner storage) and the path inside it, below the prefix.
        assert isinstance(storage, SubtreeStorage)
        with pytest.raises(NotFoundError) as info:
            storage.get("nowhere/x")
        assert info.value.root == storage.inner.url
        assert info.value.path is not None and info.value.path.endswith("levels/local/nowhere/x")


def test_local_directory_is_the_inner_one_below_the_prefix(tmp_path: Path) -> None:
    subtree = SubtreeStorage(PosixStorage(tmp_path, fsync=False), "levels/local")
    directory = subtree.local_directory()
    assert directory is not None and directory.root == str(tmp_path / "levels" / "local")
    assert directory.local_path("step-00000001/x") == str(tmp_path / "levels/local/step-00000001/x")
    with pytest.raises(ConfigError):
        directory.local_path("../escape")
    subtree.put("k", b"v")
    assert (tmp_path / "levels" / "local" / "k").read_bytes() == b"v"
