"""POSIX directory storage: local NVMe/RAM tiers and parallel filesystems (Lustre, GPFS, NFS, …).

Atomicity comes from the filesystem: data goes to a hidden temp file in the target directory, is fsynced, then
``os.replace``d (overwrite) or published by a conditional write (:mod:`ckptio.storage.posix.exclusion`: create-only
by ``link()``, compare-and-swap under an ``O_EXCL`` lock file; both exclude writers on other clients of a shared
filesystem, never relying on ``flock``), and the directory is fsynced so the name survives a power loss.
This module must never leave a temp file behind on a clean error path.

Containment: a key names a path under the root and nothing else. ``..`` segments are refused, and so is any key
whose path goes through a symbolic link below the root (a symlinked step directory, hash directory or file), for
put, get, head, delete and list alike: whoever can write into the root cannot redirect ckptio's writes or
deletions elsewhere with a link. The root itself may be a symlink. (A link swapped in between the check and the
system call is a residual race; docs/security.md.)
"""

from __future__ import annotations

import builtins
import errno
import os
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ckptio.errors import (
    AlreadyExistsError,
    ConfigError,
    NotFoundError,
    PreconditionError,
    StorageError,
    StorageFullError,
)
from ckptio.storage.base import (
    Buffer,
    Data,
    IfMatch,
    ObjectInfo,
    Pacer,
    PutMode,
    Storage,
    WriteConditions,
    WriteMode,
    as_buffers,
    check_put_mode,
    join_key,
)
from ckptio.storage.posix.direct_io import (
    CHUNK,
    MIN_BYTES,
    DirectIOUnsupported,
    file_chunks,
    read_direct,
    write_all,
    write_direct,
)
from ckptio.storage.posix.directories import fsync_dir, make_and_fill
from ckptio.storage.posix.exclusion import Exclusion
from ckptio.storage.posix.fs_ops import TMP_PREFIX, FileSystemOps
from ckptio.storage.posix.posix_root import PosixRoot
from ckptio.storage.posix.writeback import PacedWriteback
from ckptio.storage.root import Root

# TMP_PREFIX is re-exported: the partner channel names its temp files with it.
__all__ = ["READ_MIN_BYTES", "TMP_PREFIX", "PosixStorage"]

# os.write moves at most ~2 GiB per call; 64 MiB slices keep the kernel's page cache writeback smooth.
_WRITE_SLICE = 64 << 20
# A paced write's slice: the direct path's chunk, so that both reach the disk in pieces of one size.
_PACED_SLICE = CHUNK
# With direct_io=True, reads below this still go through the page cache: O_DIRECT's synchronous device round trip
# would only add latency.
READ_MIN_BYTES = 1 << 20
# preadv takes at most IOV_MAX (1024 on Linux) buffers per call.
_IOV_MAX = 1024


def _remaining(views: list[memoryview], done: int) -> list[memoryview]:
    """The parts of ``views`` after their first ``done`` bytes (preadv's iovecs after a short read)."""
    out = []
    for view in views:
        if done >= view.nbytes:
            done -= view.nbytes
            continue
        out.append(view[done:])
        done = 0
    return out[:_IOV_MAX]


def _slice(pacer: Pacer | None) -> int:
    return _WRITE_SLICE if pacer is None else _PACED_SLICE


def _etag(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns:x}-{st.st_size:x}-{st.st_ino:x}"


class PosixStorage(Storage):
    """A directory as a key space. ``fsync=False`` trades durability for speed (RAM tiers, tests).

    ``region`` labels where the filesystem is, for residency rules (a directory cannot tell by itself).
    ``direct_io``: write large objects with ``O_DIRECT``, bypassing the page cache
    (:mod:`ckptio.storage.posix.direct_io` says why). ``None`` (the default) does so for objects of 16 MiB or more when
    ``fsync`` is on, and falls back to buffered writes for good on a filesystem that refuses it; ``False`` never;
    ``True`` for every object. ``ops``: the filesystem operations exclusion rests on
    (:class:`~ckptio.storage.posix.fs_ops.FileSystemOps`; tests stand in a filesystem that refuses some).
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True, region: str | None = None,
                 direct_io: bool | None = None, ops: FileSystemOps | None = None) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.fsync = fsync
        self.direct_io = direct_io
        self.ops = ops or FileSystemOps()
        self._exclusion = Exclusion(self.ops)
        self._direct_refused = False
        self._region = region
        # Percent-encoded (spaces, non-ASCII): ckptio.storage.parse_root turns it back into self.root.
        self._url = Path(self.root).as_uri()

    @property
    def url(self) -> str:
        return self._url

    @classmethod
    def open_root(cls, root: Root, **options: Any) -> PosixStorage:
        """The storage of a directory root (the scheme registry's entry point); ``options`` are the keywords of
        the constructor."""
        if not isinstance(root, PosixRoot):
            raise ConfigError(f"not a directory root: {root.url}")
        try:
            return cls(root.path, **options)
        except TypeError as exc:
            raise ConfigError(f"unknown POSIX storage option: {exc}") from None

    def local_directory(self) -> PosixStorage:
        return self

    @property
    def write_conditions(self) -> WriteConditions:
        create = "an O_EXCL lock file, then rename()" if self._exclusion.link_refused else "link()"
        return WriteConditions(create=create, swap="an O_EXCL lock file, then rename()")

    @property
    def region(self) -> str | None:
        return self._region

    def __getstate__(self) -> dict[str, object]:
        return {"root": self.root, "fsync": self.fsync, "region": self._region, "direct_io": self.direct_io,
                "ops": self.ops}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["root"], fsync=state["fsync"], region=state["region"],  # type: ignore[misc]
                      direct_io=state.get("direct_io"), ops=state.get("ops"))

    def local_path(self, key: str) -> str:
        """The path of ``key``; StorageError when the key is not a plain relative key or when the path goes through
        a symbolic link below the root (it would read, write or delete outside what the key names)."""
        key = join_key(key)
        if not key or "\0" in key or any(part in (".", "..") for part in key.split("/")):
            raise StorageError(f"invalid key {key!r}", root=self.url)
        path = os.path.join(self.root, key)
        self._check_contained(path, key)
        return path

    def _check_contained(self, path: str, key: str) -> None:
        # realpath resolves every existing component; without links below the root it is the root's real path
        # joined with the key, exactly.
        real_root = os.path.realpath(self.root)
        if os.path.realpath(path) != os.path.join(real_root, *key.split("/")):
            raise StorageError(f"key {key!r} goes through a symbolic link under the root; refusing to follow it",
                               root=self.url, path=path)

    def _error(self, exc: OSError, key: str) -> StorageError:
        path = os.path.join(self.root, join_key(key)) if key else self.root  # for the message: never raises
        if exc.errno == errno.ENOENT:
            return NotFoundError(f"no such object {key!r}", root=self.url, path=path)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return StorageFullError(f"no space left writing {key!r}: {exc.strerror}", root=self.url, path=path)
        return StorageError(f"{exc.strerror or exc} on {key!r}", root=self.url, path=path)

    # ---- primitives -------------------------------------------------------------------------------------------
    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        return self._commit(key, lambda tmp: self._write_tmp(tmp, data, pacer), check_put_mode(mode))

    def put_file(self, key: str, path: str, *, mode: WriteMode = "overwrite",
                 pacer: Pacer | None = None) -> ObjectInfo:
        def copy(tmp: str) -> None:
            # Lazy: file_chunks opens nothing unless O_DIRECT is used.
            if not self._try_direct(tmp, os.path.getsize(path), file_chunks(path), pacer):
                self._write_buffered(tmp, file_chunks(path, _slice(pacer)), pacer)

        return self._commit(key, copy, check_put_mode(mode))

    def copy_to(self, key: str, target: Storage, target_key: str, *, pacer: Pacer | None = None) -> ObjectInfo:
        """Streams the file into ``target`` (:meth:`Storage.put_file`: S3 uploads it part by part)."""
        return target.put_file(target_key, self.local_path(key), pacer=pacer)

    def _commit(self, key: str, fill: Callable[[str], None], mode: PutMode) -> ObjectInfo:
        path = self.local_path(key)
        directory, name = os.path.split(path)
        tmp = os.path.join(directory, f"{TMP_PREFIX}{name}-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            make_and_fill(directory, tmp, fill, fsync=self.fsync)  # and waits out another client's mkdir
            # The published file is this one (rename and link keep the inode and mtime): its etag is the answer,
            # never a stat of the name afterwards, which a racing writer may already have replaced.
            st = os.stat(tmp)
            self._publish(tmp, path, key, mode)
            if self.fsync:
                fsync_dir(directory)
            return ObjectInfo(key=join_key(key), size=st.st_size, etag=_etag(st))
        except OSError as exc:
            if isinstance(exc, StorageError):
                raise
            raise self._error(exc, key) from exc
        finally:
            try:
                os.unlink(tmp)
            except (FileNotFoundError, NotADirectoryError):
                pass  # never created (linked away, or the directory could not be made)

    def _publish(self, tmp: str, path: str, key: str, mode: PutMode) -> None:
        if isinstance(mode, IfMatch):
            etag = mode.etag
            if not self._exclusion.swap(tmp, path, lambda st: st is not None and _etag(st) == etag):
                raise PreconditionError(f"{key!r} changed (its etag is no longer {etag})", root=self.url, path=path)
        elif mode == "create":
            if not self._exclusion.create(tmp, path):
                raise AlreadyExistsError(f"{key!r} already exists", root=self.url, path=path)
        else:
            os.replace(tmp, path)

    def _try_direct(self, tmp: str, size: int, parts: Iterable[memoryview], pacer: Pacer | None) -> bool:
        """Write ``tmp`` with O_DIRECT when this storage should; False when it wrote nothing (write buffered)."""
        wanted = self.direct_io if self.direct_io is not None else (self.fsync and size >= MIN_BYTES)
        if not wanted or self._direct_refused:
            return False
        try:
            write_direct(tmp, parts, fsync=self.fsync, pacer=pacer)
        except DirectIOUnsupported:
            self._direct_refused = True  # this filesystem never will: stop asking
            return False
        return True

    def _write_tmp(self, tmp: str, data: Data, pacer: Pacer | None) -> None:
        buffers = as_buffers(data)
        if not self._try_direct(tmp, sum(b.nbytes for b in buffers), buffers, pacer):
            size = _slice(pacer)
            self._write_buffered(tmp, (b[i : i + size] for b in buffers for i in range(0, b.nbytes, size)), pacer)

    def _write_buffered(self, tmp: str, slices: Iterable[memoryview], pacer: Pacer | None) -> None:
        """Write ``tmp`` through the page cache, slice by slice; a paced write hands each slice to the disk as it
        goes (:mod:`ckptio.storage.posix.writeback` says why)."""
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            writeback = PacedWriteback(fd) if pacer is not None else None
            for view in slices:
                if pacer is not None:
                    pacer.take(view.nbytes)
                write_all(fd, view)
                if writeback is not None:
                    writeback.written(view.nbytes)
            if writeback is not None:
                writeback.finish()
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        path = self.local_path(key)
        try:
            with open(path, "rb", buffering=0) as f:
                if length is None:
                    length = os.fstat(f.fileno()).st_size - offset
                out = bytearray(max(length, 0))
                view, got = memoryview(out), 0
                while got < len(out):
                    n = os.preadv(f.fileno(), [view[got:]], offset + got)
                    if n == 0:
                        break
                    got += n
                return bytes(out[:got]) if got < len(out) else bytes(out)
        except OSError as exc:
            raise self._error(exc, key) from exc

    def readinto(self, key: str, buffers: Buffer | Sequence[Buffer], *, offset: int = 0) -> int:
        """``preadv`` straight into ``buffers`` (the kernel copies from its page cache into them: no copy of ours).

        With ``direct_io=True``, reads of 1 MiB or more bypass the page cache (``O_DIRECT``) through a page-aligned
        bounce buffer, then a copy into ``buffers``: tensor memory is not block-aligned, so the device cannot fill
        it. The default reads buffered: restore runs before training does, so the page cache it fills costs no
        step, and the kernel's readahead overlaps the device with the copy, which a bounce buffer per reading
        thread does not.
        """
        path = self.local_path(key)
        views = as_buffers(buffers)
        total = sum(v.nbytes for v in views)
        if offset < 0:
            raise StorageError(f"invalid range offset={offset} on {key!r}", root=self.url)
        try:
            if self.direct_io is True and total >= READ_MIN_BYTES and not self._direct_refused:
                try:
                    return read_direct(path, offset, views)
                except DirectIOUnsupported:
                    self._direct_refused = True
            with open(path, "rb", buffering=0) as f:
                done = 0
                while done < total:
                    n = os.preadv(f.fileno(), _remaining(views, done), offset + done)
                    if n == 0:
                        break
                    done += n
                return done
        except OSError as exc:
            raise self._error(exc, key) from exc

    def head(self, key: str) -> ObjectInfo:
        path = self.local_path(key)
        try:
            st = os.stat(path)
        except OSError as exc:
            raise self._error(exc, key) from exc
        if not os.path.isfile(path):
            raise NotFoundError(f"{key!r} is not an object", root=self.url, path=path)
        return ObjectInfo(key=join_key(key), size=st.st_size, etag=_etag(st))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # The prefix may end inside a name ("step-000"): walk its directory and filter.
        rel_dir = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.local_path(rel_dir) if rel_dir else self.root
        # os.walk never descends into a linked directory (followlinks=False); linked files are skipped below.
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(filenames):
                if name.startswith(TMP_PREFIX):
                    continue
                full = os.path.join(dirpath, name)
                if os.path.islink(full):
                    continue
                key = os.path.relpath(full, self.root).replace(os.sep, "/")
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(full)
                except FileNotFoundError:  # deleted while listing
                    continue
                yield ObjectInfo(key=key, size=st.st_size, etag=_etag(st))

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """One ``os.scandir`` of the directory ``prefix``: its subdirectories, never a walk below them (a root
        holding many steps costs one directory read, not a stat of every file). Links are not followed, as for
        every key; a directory a crashed writer left empty may be listed (the contract allows it)."""
        base = join_key(prefix)
        top = self.local_path(base) if base else self.root
        try:
            with os.scandir(top) as entries:
                return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise self._error(exc, base) from exc

    def delete(self, key: str) -> None:
        path = self.local_path(key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._error(exc, key) from exc
        # Empty step directories are removed so listings stay short; a racing writer recreates them.
        directory = os.path.dirname(path)
        while directory != self.root and directory.startswith(self.root):
            try:
                os.rmdir(directory)
            except OSError:
                break
            directory = os.path.dirname(directory)
