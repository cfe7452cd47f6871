"""A paced buffered write reaches the disk at its pace, not in one burst at the fsync that ends the file: each slice
is written back before the one after the next is written, and dropped from the page cache.

What the tests see is the page cache itself (``mincore`` on the file being written): a slice that was written back
and dropped is no longer resident (a dirty page cannot be dropped). A filesystem that keeps pages after
``POSIX_FADV_DONTNEED`` (tmpfs) cannot show it, and the tests skip there.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest

from ckptio.storage import PosixStorage
from ckptio.storage.posix import writeback as writeback_module
from ckptio.storage.posix.direct_io import CHUNK
from ckptio.storage.posix.posix_storage import TMP_PREFIX

_libc = ctypes.CDLL(None, use_errno=True)
SLICES = 4


def resident(path: Path, start: int = 0, length: int | None = None) -> float:
    """The share of the pages of ``path`` in [start, start + length) that are in the page cache."""
    size = os.path.getsize(path)
    length = size - start if length is None else length
    pages = -(-length // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)  # private: mincore shows the page cache
    try:
        anchor = ctypes.c_char.from_buffer(mapped, start)
        if _libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(length), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        del anchor
    finally:
        mapped.close()
    return sum(v & 1 for v in vec) / pages


@pytest.fixture
def root(tmp_path: Path) -> Path:
    probe = tmp_path / "probe"
    probe.write_bytes(os.urandom(1 << 20))
    fd = os.open(probe, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if resident(probe) > 0:
        pytest.skip("this filesystem keeps pages after POSIX_FADV_DONTNEED (tmpfs): the drop cannot be seen")
    return tmp_path / "root"


class WatchingPacer:
    """Lets every slice through at once; when asked for the last one, looks at the first slice of the file being
    written (the only temp file under ``root``)."""

    def __init__(self, root: Path) -> None:
        self.root, self.asked, self.first_slice_resident = root, 0, None

    def take(self, nbytes: int) -> None:
        self.asked += 1
        if self.asked == SLICES:
            (tmp,) = [p for p in self.root.rglob(f"{TMP_PREFIX}*")]
            self.first_slice_resident = resident(tmp, 0, CHUNK)


def _write(storage: PosixStorage, how: str, payload: bytes, pacer: WatchingPacer | None, tmp_path: Path) -> None:
    if how == "put":
        storage.put("step/big", payload, pacer=pacer)
    else:
        source = tmp_path / "staged"
        source.write_bytes(payload)
        storage.put_file("step/big", str(source), pacer=pacer)


@pytest.mark.parametrize("how", ["put", "put_file"])
@pytest.mark.parametrize("ranged", [True, False], ids=["sync_file_range", "fdatasync"])
def test_a_paced_buffered_write_reaches_the_disk_slice_by_slice(root: Path, tmp_path: Path, how: str, ranged: bool,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if not ranged:  # a platform without sync_file_range (macOS) cannot run here: take it away
        monkeypatch.setattr(writeback_module, "_SYNC_FILE_RANGE", None)
    elif writeback_module._SYNC_FILE_RANGE is None:
        pytest.skip("no sync_file_range on this platform")
    storage = PosixStorage(root, fsync=True, direct_io=False)
    payload = os.urandom(SLICES * CHUNK - 5)
    pacer = WatchingPacer(root)
    _write(storage, how, payload, pacer, tmp_path)
    assert pacer.asked == SLICES
    assert pacer.first_slice_resident == 0  # written back and dropped while the flush still ran
    assert resident(root / "step" / "big") == 0
    assert storage.get("step/big") == payload


@pytest.mark.parametrize("how", ["put", "put_file"])
def test_an_unpaced_buffered_write_is_left_to_the_kernel(root: Path, tmp_path: Path, how: str) -> None:
    """The contrast that shows the test above can fail: without a pace the file's pages stay cached."""
    storage = PosixStorage(root, fsync=True, direct_io=False)
    payload = os.urandom(SLICES * CHUNK)
    _write(storage, how, payload, None, tmp_path)
    assert resident(root / "step" / "big") > 0.5
    assert storage.get("step/big") == payload
