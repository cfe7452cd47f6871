"""PosixStorage passes the conformance suite, with fsync on and off; plus what only a directory can show."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ckptio.errors import NotFoundError, StorageError
from ckptio.storage import PosixStorage, Storage, open_storage
from ckptio.storage.posix import directories
from ckptio.storage.posix.posix_storage import TMP_PREFIX
from ckptio.testing.conformance import StoreTests


class TestPosixFsync(StoreTests):
    @pytest.fixture
    def storage(self, tmp_path: Path) -> Storage:
        return PosixStorage(tmp_path / "root", fsync=True)


class TestPosixNoFsync(StoreTests):
    @pytest.fixture
    def storage(self, tmp_path: Path) -> Storage:
        return PosixStorage(tmp_path / "root", fsync=False, region="eu-west-1")


class TestPosixDirectIO(StoreTests):
    """Every object through O_DIRECT (the default only uses it for large objects on an fsynced tier)."""

    @pytest.fixture
    def storage(self, tmp_path: Path) -> Storage:
        return PosixStorage(tmp_path / "root", fsync=True, direct_io=True)


def test_no_temp_files_left_after_a_lost_create(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path, fsync=False)
    storage.put("m", b"1", mode="create")
    with pytest.raises(FileExistsError):
        storage.put("m", b"2", mode="create")
    assert [n for n in os.listdir(tmp_path) if n.startswith(TMP_PREFIX)] == []


def test_keys_cannot_escape_the_root(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path / "root", fsync=False)
    with pytest.raises(StorageError):
        storage.put("../outside", b"x")
    assert not (tmp_path / "outside").exists()


def test_open_storage_paths(tmp_path: Path) -> None:
    by_path = open_storage(tmp_path)
    by_url = open_storage(f"file://{tmp_path}", fsync=False)
    assert isinstance(by_path, PosixStorage) and isinstance(by_url, PosixStorage)
    assert by_path.root == by_url.root == str(tmp_path)
    assert open_storage(by_path) is by_path
    with pytest.raises(ValueError):
        open_storage("gs://bucket/x")


def test_list_dirs_reads_one_directory_and_never_walks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = PosixStorage(tmp_path, fsync=False)
    for step in range(1, 21):
        for rank in range(5):
            storage.put(f"step-{step:08d}/ranks/{rank}.json", b"{}")
    scans: list[str] = []
    real_scandir = os.scandir

    def counting_scandir(path: str) -> object:
        scans.append(path)
        return real_scandir(path)

    def no_walk(*args: object, **kwargs: object) -> None:
        raise AssertionError("list_dirs walked the tree")

    monkeypatch.setattr(os, "scandir", counting_scandir)
    monkeypatch.setattr(os, "walk", no_walk)
    assert storage.list_dirs() == [f"step-{s:08d}" for s in range(1, 21)]
    assert scans == [str(tmp_path)]


def test_list_dirs_may_list_a_directory_a_crash_left_empty(tmp_path: Path) -> None:
    # The contract allows it (callers treat names as candidates); a clean delete leaves no such directory.
    storage = PosixStorage(tmp_path, fsync=False)
    (tmp_path / "step-00000009").mkdir()
    (tmp_path / "step-00000010").mkdir()
    (tmp_path / "step-00000010" / f"{TMP_PREFIX}manifest.json-1-ab").write_bytes(b"half")
    assert storage.list_dirs() == ["step-00000009", "step-00000010"]
    assert list(storage.list()) == []


def test_a_clean_delete_leaves_no_name_behind(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path, fsync=False)
    storage.put("a/b/c/deep", b"1")
    storage.put("a/x", b"1")
    storage.delete("a/b/c/deep")
    assert storage.list_dirs("a") == []
    storage.delete("a/x")
    assert storage.list_dirs() == [] and os.listdir(tmp_path) == []


class _HalfMadeDirectory:
    """Stand-in for a GlusterFS client racing another client's mkdir (no test can make that race happen on cue;
    tests/lab/test_cross_client_locks.py races real clients): the first ``times`` creates of a temp file fail ENOENT
    and the first ``times`` mkdirs fail ESTALE, as they do while the other client's mkdir reaches the bricks."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, times: int) -> None:
        self.opens = self.mkdirs = times
        real_open, real_mkdir = os.open, os.mkdir

        def flaky_open(path: str, flags: int, *args: object, **kwargs: object) -> int:
            if os.path.basename(path).startswith(TMP_PREFIX) and self.opens > 0:
                self.opens -= 1
                raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
            return real_open(path, flags, *args, **kwargs)

        def flaky_mkdir(path: str, *args: object, **kwargs: object) -> None:
            if self.mkdirs > 0:
                self.mkdirs -= 1
                raise OSError(errno.ESTALE, "Stale file handle", path)
            real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "open", flaky_open)
        monkeypatch.setattr(os, "mkdir", flaky_mkdir)


@pytest.mark.parametrize("mode", ["create", "overwrite"])
def test_a_write_into_a_directory_another_client_is_still_making_lands(tmp_path: Path, mode: str,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    storage = PosixStorage(tmp_path / "root", fsync=True)
    race = _HalfMadeDirectory(monkeypatch, times=1)
    storage.put("step/manifest.json", b"m", mode=mode)  # type: ignore[arg-type]
    assert race.opens == race.mkdirs == 0  # both failures were met, and waited out
    assert storage.get("step/manifest.json") == b"m"


def test_a_directory_that_never_appears_is_a_named_error_and_leaves_nothing(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    storage = PosixStorage(tmp_path / "root", fsync=False)
    storage.put("step/a", b"a")
    _HalfMadeDirectory(monkeypatch, times=10**6).mkdirs = 0
    naps: list[float] = []
    monkeypatch.setattr(directories.time, "sleep", naps.append)
    with pytest.raises(NotFoundError):
        storage.put("step/b", b"b", mode="create")
    assert naps == list(directories.DIRECTORY_RACE_WAITS_S)  # waited, then gave up
    assert sorted(os.listdir(tmp_path / "root" / "step")) == ["a"]


def test_a_missing_source_file_is_not_waited_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = PosixStorage(tmp_path / "root", fsync=False)
    naps: list[float] = []
    monkeypatch.setattr(directories.time, "sleep", naps.append)
    with pytest.raises(NotFoundError):
        storage.put_file("x", str(tmp_path / "absent"))
    assert naps == []
