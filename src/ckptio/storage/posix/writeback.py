"""Paced writes through the page cache: the disk must see the pace, not only ``write()``.

A buffered ``write()`` only fills the page cache. The disk sees those bytes when the kernel writes them back: once
the dirty pages pass its thresholds (a share of the host's memory, often gigabytes away), once they are old enough
(seconds later), or at the ``fsync`` that ends the file, all at once. A flush paced through ``write()`` alone would
therefore reach the disk as the very burst the pace exists to avoid, just later. So a paced buffered write hands
each slice to the disk as soon as it is written, and before the next slice goes it waits until the previous one is
on the disk and drops it from the cache: at most two slices of the file are dirty or in flight at any time, the
disk sees the flush at its pace, and the checkpoint's pages (written once, seldom read back soon) do not evict the
training job's own.

Linux does this without waiting on the slice just written (``sync_file_range``: start its writeback, wait for the
one before). Elsewhere each slice is ``fdatasync``-ed: the same pace at the disk, with a wait per slice. Writes
that are not paced never come here: they go as fast as the store takes them, and their ``fsync`` ends the file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable

# <linux/fs.h>
_WAIT_BEFORE, _WRITE, _WAIT_AFTER = 1, 2, 4


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's ``sync_file_range`` (Linux, glibc or musl), or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        func = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


_SYNC_FILE_RANGE = _sync_file_range()


class PacedWriteback:
    """Follows one file's buffered writes, in order from offset 0: call :meth:`written` after each slice and
    :meth:`finish` after the last (before the file's ``fsync``)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.offset = 0
        """Bytes written so far."""
        self._clean = 0
        """Bytes known on the disk and dropped from the cache."""
        self._ranged = _SYNC_FILE_RANGE is not None

    def written(self, nbytes: int) -> None:
        """The next ``nbytes`` of the file were just written: send them to the disk, and wait for the slice before
        them to be there."""
        if nbytes <= 0:
            return
        start, self.offset = self.offset, self.offset + nbytes
        if self._ranged and self._range(start, nbytes, _WRITE):
            self._settle(start)
        else:
            self._datasync()

    def finish(self) -> None:
        """Wait for the last slice to be on the disk and drop it from the cache."""
        self._settle(self.offset)

    def _settle(self, upto: int) -> None:
        """Wait for the bytes before ``upto`` to be on the disk, and drop them from the cache."""
        if upto <= self._clean:
            return
        if self._ranged and self._range(self._clean, upto - self._clean, _WAIT_BEFORE | _WRITE | _WAIT_AFTER):
            self._drop(upto)
        else:
            self._datasync()

    def _datasync(self) -> None:
        os.fdatasync(self.fd)
        self._drop(self.offset)

    def _range(self, start: int, nbytes: int, flags: int) -> bool:
        """``sync_file_range``; False (and ``fdatasync`` from then on) where this file's filesystem has none."""
        assert _SYNC_FILE_RANGE is not None
        if _SYNC_FILE_RANGE(self.fd, start, nbytes, flags) == 0:
            return True
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ESPIPE):
            self._ranged = False
            return False
        raise OSError(err, os.strerror(err))

    def _drop(self, upto: int) -> None:
        """The bytes before ``upto`` are on the disk: drop those not dropped yet from the cache (a hint: a
        filesystem that keeps the pages anyway is not an error)."""
        if hasattr(os, "posix_fadvise") and upto > self._clean:
            os.posix_fadvise(self.fd, self._clean, upto - self._clean, os.POSIX_FADV_DONTNEED)
        self._clean = max(self._clean, upto)
