"""Writes and reads that bypass the page cache (``O_DIRECT``) for large objects on a durable POSIX tier.

Why: a buffered write copies every byte into freshly allocated page-cache pages, which the kernel then writes back.
On a host whose cores are training, that allocation and copy is the writer's largest CPU cost, and it lands on the
training step (the planner's measurement of the writer's costs times both ways; docs/planning-measurements.md has
the figures). Checkpoint bytes are written once and seldom read back soon, so caching them only evicts the
training job's own pages — the reason DeepSpeed's FastPersist writes them with ``O_DIRECT`` too.

``O_DIRECT`` needs the buffer address, the file offset and the length aligned to the device's logical block. The
bytes go through a reusable page-aligned bounce buffer (one per thread: the writer writes files concurrently), the
last block is padded and the file truncated back to its true size. A filesystem that refuses ``O_DIRECT`` (tmpfs,
some FUSE and NFS mounts) fails the open or the first write with ``EINVAL``: :class:`DirectIOUnsupported` tells the
caller to write buffered instead.

Reads can go the same way (``PosixStorage(direct_io=True)``): the device fills the page-aligned bounce buffer and
the bytes the caller asked for are copied into its buffers (tensor memory is not block-aligned, so the device
cannot fill it directly). Restore reads buffered by default: see ``PosixStorage.readinto``.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import threading
from collections.abc import Iterable, Sequence

from ckptio.storage.base import Pacer

# 4 KiB covers every logical block size in use (512 B and 4 KiB sectors); the bounce buffer is page-aligned.
ALIGN = 4096
CHUNK = 8 << 20
# Below this the page cache costs little, and O_DIRECT's synchronous device write would only add latency.
MIN_BYTES = 16 << 20

_O_DIRECT = getattr(os, "O_DIRECT", 0)
_bounce = threading.local()


class DirectIOUnsupported(Exception):
    """This filesystem (or platform) refuses ``O_DIRECT``; nothing was left behind."""


def available() -> bool:
    return _O_DIRECT != 0


def _buffer() -> mmap.mmap:
    buf: mmap.mmap | None = getattr(_bounce, "buf", None)
    if buf is None:
        buf = _bounce.buf = mmap.mmap(-1, CHUNK)  # anonymous maps are page-aligned
    return buf


def write_all(fd: int, view: memoryview) -> None:
    while view.nbytes:
        view = view[os.write(fd, view) :]


def _write_paced(fd: int, view: memoryview, nbytes: int, pacer: Pacer | None) -> None:
    """Write ``view`` (``nbytes`` of it data, the rest padding) once ``pacer`` lets ``nbytes`` go."""
    if pacer is not None:
        pacer.take(nbytes)
    write_all(fd, view)


def write_direct(path: str, parts: Iterable[memoryview], *, fsync: bool = True, pacer: Pacer | None = None) -> int:
    """Create ``path`` (exclusively) holding the concatenation of ``parts``, written with ``O_DIRECT``; return its
    size. ``pacer`` is told each bounce buffer's size before it is written. Raises :class:`DirectIOUnsupported`
    (the file removed) when the filesystem refuses direct I/O, and ``OSError`` for every other failure (the caller
    removes the file)."""
    if not available():
        raise DirectIOUnsupported("no O_DIRECT on this platform")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_DIRECT, 0o644)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise DirectIOUnsupported(str(exc)) from None
        raise
    bounce = _buffer()
    view = memoryview(bounce)
    filled = total = 0
    wrote_any = False
    try:
        try:
            for part in parts:
                taken = 0
                while taken < part.nbytes:
                    n = min(part.nbytes - taken, CHUNK - filled)
                    view[filled : filled + n] = part[taken : taken + n]
                    taken, filled = taken + n, filled + n
                    if filled == CHUNK:
                        _write_paced(fd, view, CHUNK, pacer)
                        wrote_any, total, filled = True, total + CHUNK, 0
            if filled:
                padded = -(-filled // ALIGN) * ALIGN  # the tail block padded; truncated below
                _write_paced(fd, view[:padded], filled, pacer)
                wrote_any, total = True, total + filled
        except OSError as exc:
            if exc.errno == errno.EINVAL and not wrote_any:
                os.close(fd)
                fd = -1
                os.unlink(path)
                raise DirectIOUnsupported(str(exc)) from None
            raise
        os.ftruncate(fd, total)
        if fsync:  # the data is on the device already; this makes the size and the device cache durable
            os.fsync(fd)
        return total
    finally:
        view.release()
        if fd >= 0:
            os.close(fd)


def file_chunks(path: str, size: int = CHUNK) -> Iterable[memoryview]:
    """``path``'s bytes in pieces of ``size`` (:data:`CHUNK`: for copying a file with :func:`write_direct`)."""
    with open(path, "rb", buffering=0) as src:
        while chunk := src.read(size):
            yield memoryview(chunk)


def _copy(dst: memoryview, src: memoryview) -> None:
    """memcpy from ``src`` into ``dst`` (same size), without holding the GIL: reader threads copy in parallel."""
    if dst.nbytes:
        ctypes.memmove(ctypes.addressof(ctypes.c_char.from_buffer(dst)),
                       ctypes.addressof(ctypes.c_char.from_buffer(src)), dst.nbytes)


def read_direct(path: str, offset: int, views: Sequence[memoryview]) -> int:
    """Fill ``views`` (in order) from ``path`` at ``offset`` with ``O_DIRECT`` reads through this thread's bounce
    buffer; return the bytes read (short only at the end of the file). :class:`DirectIOUnsupported` when the
    filesystem refuses direct I/O; ``OSError`` for every other failure."""
    if not available():
        raise DirectIOUnsupported("no O_DIRECT on this platform")
    try:
        fd = os.open(path, os.O_RDONLY | _O_DIRECT)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise DirectIOUnsupported(str(exc)) from None
        raise
    bounce = memoryview(_buffer())
    total = sum(v.nbytes for v in views)
    done, vi, vpos = 0, 0, 0
    try:
        while done < total:
            start = offset + done
            aligned = start - start % ALIGN
            want = min(CHUNK, -(-(start + total - done - aligned) // ALIGN) * ALIGN)
            try:
                got = os.preadv(fd, [bounce[:want]], aligned)
            except OSError as exc:
                if exc.errno == errno.EINVAL and done == 0:
                    raise DirectIOUnsupported(str(exc)) from None
                raise
            avail = got - (start - aligned)
            if avail <= 0:
                break
            src = bounce[start - aligned : start - aligned + min(avail, total - done)]
            while src.nbytes:  # scatter into the caller's buffers
                view = views[vi]
                n = min(view.nbytes - vpos, src.nbytes)
                _copy(view[vpos : vpos + n], src[:n])
                src, vpos, done = src[n:], vpos + n, done + n
                if vpos == view.nbytes:
                    vi, vpos = vi + 1, 0
            if got < want:
                break
        return done
    finally:
        bounce.release()
        os.close(fd)
