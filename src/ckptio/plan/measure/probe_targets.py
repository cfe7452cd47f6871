"""What the probe can do to a target: a POSIX directory through system calls, or any Storage.

Owns the probe's side effects, all confined to one scratch directory (or key prefix) that :meth:`cleanup`
removes, together with the parents :meth:`setup` had to create. Must never write, rename or delete anything
outside that scratch area.
"""

from __future__ import annotations

import abc
import contextlib
import os
import shutil
import time
from typing import Literal

from ckptio.errors import ConfigError, StorageError
from ckptio.plan.measure.clock import Clock
from ckptio.policy.volumes import volume_of
from ckptio.storage.base import Storage, join_key

_RENAMED = ".renamed"
_SYNC_EVERY_BYTES = 64 << 20
#: Every metadata kind the probe measures, in the order it runs them (unlink last: it removes the files).
METADATA_KINDS = ("create", "stat", "rename", "list", "fsync", "unlink")


class ProbeTarget(abc.ABC):
    """One probed place, seen through the operations the probe times."""

    url: str
    kind: Literal["posix", "object"]
    #: Metadata operations this target supports, in the order the probe runs them.
    metadata_ops: tuple[str, ...]

    def setup(self) -> None:  # noqa: B027 - most targets need no set-up; POSIX overrides it
        """Create the scratch area."""

    @abc.abstractmethod
    def cleanup(self) -> None:
        """Remove the scratch area and everything under it; never raises."""

    @abc.abstractmethod
    def write_file(self, name: str, size: int, block: memoryview, clock: Clock, deadline: float) -> int:
        """Write ``size`` bytes (``block`` repeated) durably at ``name``; returns bytes that count."""

    @abc.abstractmethod
    def read_file(self, name: str, buffer: bytearray, clock: Clock, deadline: float) -> int:
        """Read ``name`` back from storage (not from a cache); returns bytes read."""

    @abc.abstractmethod
    def metadata_op(self, op: str, name: str, payload: bytes) -> None:
        """One operation of kind ``op`` (:data:`METADATA_KINDS` but ``list``) on the small file ``name``."""

    @abc.abstractmethod
    def list_dir(self, prefix: str) -> int:
        """List ``prefix``; returns the number of entries."""

    @abc.abstractmethod
    def remove_tree(self, prefix: str) -> None:
        """Remove everything under ``prefix`` of the scratch area."""

    def fsync_cost(self, name: str, payload: bytes) -> float | None:
        """Seconds one fsync of a fresh small file takes (None where fsync means nothing)."""
        return None

    def free_bytes(self) -> int | None:
        return None

    def fs_type(self) -> str | None:
        return None

    def fio_directory(self) -> str | None:
        """A directory fio may write into (inside the scratch area), or None."""
        return None


class PosixTarget(ProbeTarget):
    """A directory probed with system calls: writes stop mid-file at the deadline, reads bypass the cache."""

    kind: Literal["posix", "object"] = "posix"

    def __init__(self, parent: str, name: str, *, fsync: bool) -> None:
        self.parent = os.path.abspath(parent)
        self.root = os.path.join(self.parent, name)
        self.url = self.parent
        self.fsync = fsync
        self.metadata_ops = METADATA_KINDS if fsync else tuple(k for k in METADATA_KINDS if k != "fsync")
        self._created_parents: list[str] = []

    def setup(self) -> None:
        missing = []
        path = self.parent
        while not os.path.exists(path):
            missing.append(path)
            path = os.path.dirname(path)
        if not os.path.isdir(path):
            raise ConfigError(f"probe target {self.parent!r} is not a directory")
        try:
            for directory in reversed(missing):
                os.mkdir(directory)
                self._created_parents.append(directory)
            os.mkdir(self.root, 0o700)
        except OSError as exc:
            raise StorageError(f"cannot create the probe directory: {exc.strerror}", path=self.root) from exc

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        for directory in reversed(self._created_parents):
            with contextlib.suppress(OSError):
                os.rmdir(directory)

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def write_file(self, name: str, size: int, block: memoryview, clock: Clock, deadline: float) -> int:
        path = self._path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        written = synced = 0
        try:
            while written < size and not clock.expired(deadline):
                view = block[: min(block.nbytes, size - written)]
                while view.nbytes:
                    n = os.write(fd, view)
                    view = view[n:]
                    written += n
                # Bounded dirty data: the figure is the store's sustained rate, not the page cache's, and the
                # last fsync after the deadline stays short.
                if self.fsync and written - synced >= _SYNC_EVERY_BYTES:
                    os.fdatasync(fd)
                    synced = written
            if clock.stop.is_set():
                return 0  # interrupted: nothing counts, and no time goes to syncing what will be deleted
            if self.fsync:
                os.fsync(fd)
            # Written pages are clean after fsync: drop them so the read-back comes from storage.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        return written

    def read_file(self, name: str, buffer: bytearray, clock: Clock, deadline: float) -> int:
        fd = os.open(self._path(name), os.O_RDONLY)
        total = 0
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            while not clock.expired(deadline):
                n = os.readv(fd, [buffer])
                if n == 0:
                    break
                total += n
        finally:
            os.close(fd)
        return total

    def fsync_cost(self, name: str, payload: bytes) -> float | None:
        path = self._path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, payload)
            start = time.perf_counter()
            os.fsync(fd)
            return time.perf_counter() - start
        finally:
            os.close(fd)

    def metadata_op(self, op: str, name: str, payload: bytes) -> None:
        path = self._path(name)
        if op == "create":
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, payload)
            finally:
                os.close(fd)
        elif op == "rename":
            os.rename(path, path + _RENAMED)
        elif op in ("stat", "fsync", "unlink"):
            current = path + _RENAMED if os.path.exists(path + _RENAMED) else path
            if op == "stat":
                os.stat(current)
            elif op == "fsync":
                _rewrite_durably(current, payload)
            else:
                os.unlink(current)
        else:
            raise ConfigError(f"unknown metadata op {op!r}")

    def list_dir(self, prefix: str) -> int:
        with os.scandir(self._path(prefix)) as entries:
            return sum(1 for _ in entries)

    def remove_tree(self, prefix: str) -> None:
        shutil.rmtree(self._path(prefix), ignore_errors=True)

    def free_bytes(self) -> int | None:
        return volume_of(self.parent).free_bytes

    def fs_type(self) -> str | None:
        return volume_of(self.parent).fs_type

    def fio_directory(self) -> str | None:
        path = self._path("fio")
        os.makedirs(path, exist_ok=True)
        return path


class StorageTarget(ProbeTarget):
    """Any :class:`Storage` (an object store, a wrapped store): one object per file, no mid-file stop."""

    metadata_ops = ("create", "stat", "list", "unlink")  # an object store has no rename, and no fsync to ask for

    def __init__(self, storage: Storage, name: str) -> None:
        self.storage = storage
        self.prefix = name
        self.url = storage.url
        self.kind = "posix" if storage.local_directory() is not None else "object"

    def _key(self, name: str) -> str:
        return join_key(self.prefix, name)

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            self.storage.delete_prefix(self.prefix)

    def write_file(self, name: str, size: int, block: memoryview, clock: Clock, deadline: float) -> int:
        full, rest = divmod(size, block.nbytes)
        parts = [block] * full + ([block[:rest]] if rest else [])
        self.storage.put(self._key(name), parts)
        return size

    def read_file(self, name: str, buffer: bytearray, clock: Clock, deadline: float) -> int:
        return len(self.storage.get(self._key(name)))

    def metadata_op(self, op: str, name: str, payload: bytes) -> None:
        key = self._key(name)
        if op == "create":
            self.storage.put(key, payload)
        elif op == "stat":
            self.storage.head(key)
        elif op == "unlink":
            self.storage.delete(key)
        else:
            raise ConfigError(f"unknown metadata op {op!r}")

    def list_dir(self, prefix: str) -> int:
        return sum(1 for _ in self.storage.list(self._key(prefix) + "/"))

    def remove_tree(self, prefix: str) -> None:
        self.storage.delete_prefix(self._key(prefix))

    def fio_directory(self) -> str | None:
        directory = self.storage.local_directory()
        if directory is None:
            return None
        path = directory.local_path(self._key("fio"))
        os.makedirs(path, exist_ok=True)
        return path


def _rewrite_durably(path: str, payload: bytes) -> None:
    """Rewrite the first 4 KiB of ``path`` and fsync it: one page of new data made durable, as a publish waits for."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, payload[:4096], 0)
        os.fsync(fd)
    finally:
        os.close(fd)
