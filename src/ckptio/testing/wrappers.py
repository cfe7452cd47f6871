"""Storage wrappers for tests, the probe and the demo: throttle, latency, gated reads and fault injection on top of
any backend.

Used by tests (ENOSPC/EIO without filling a disk), by the probe and by the demo (a local directory behind a
bandwidth cap that emulates a shared filesystem under contention). Wrappers pickle with their inner storage,
so the writer processes of every rank get the same behaviour; the throttle's budget is shared between those
processes through a small state file guarded by ``flock``.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import os
import struct
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from ckptio.errors import StorageError, StorageFullError
from ckptio.storage.base import Buffer, Data, ObjectInfo, Pacer, PutMode, Storage, WriteMode, data_size
from ckptio.storage.storage_wrapper import StorageWrapper


class ThrottledStorage(StorageWrapper):
    """Caps the aggregate write (and optionally read) bandwidth of every process sharing ``state_path``.

    Each transfer reserves its slot on a shared virtual clock (``next_free``): it starts when the previous one
    would have finished and lasts ``bytes / bandwidth``. Concurrent writers therefore share the bandwidth,
    like clients of a saturated filesystem do. The real write happens first; the wrapper sleeps for the
    remainder.
    """

    def __init__(
        self,
        inner: Storage,
        *,
        write_bytes_per_s: float,
        read_bytes_per_s: float | None = None,
        state_path: str | None = None,
    ) -> None:
        super().__init__(inner)
        if write_bytes_per_s <= 0:
            raise StorageError("throttle bandwidth must be positive")
        self.write_bytes_per_s = float(write_bytes_per_s)
        self.read_bytes_per_s = float(read_bytes_per_s) if read_bytes_per_s else None
        if state_path is None:
            fd, state_path = tempfile.mkstemp(prefix="ckptio-throttle-")
            os.close(fd)
        self.state_path = state_path

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def book(self, nbytes: int, bandwidth: float | None = None) -> float:
        """Book ``nbytes`` on the shared clock (at ``bandwidth``, default the write bandwidth); returns the monotonic
        time the transfer may end. Public so other writers (the demo's DCP baseline) can share the same budget."""
        bandwidth = bandwidth or self.write_bytes_per_s
        # O_CREAT: a state path named by the caller (shared by every rank) need not exist yet.
        fd = os.open(self.state_path, os.O_RDWR | os.O_CREAT, 0o644)
        with open(fd, "r+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            raw = f.read(8)
            next_free = struct.unpack("d", raw)[0] if len(raw) == 8 else 0.0
            end = max(time.monotonic(), next_free) + nbytes / bandwidth
            f.seek(0)
            f.write(struct.pack("d", end))
        return end

    def wait_until(self, end: float) -> None:
        delay = end - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        end = self.book(data_size(data), self.write_bytes_per_s)
        info = self.inner.put(key, data, mode=mode, pacer=pacer)
        self.wait_until(end)
        return info

    def put_file(self, key: str, path: str, *, mode: WriteMode = "overwrite",
                 pacer: Pacer | None = None) -> ObjectInfo:
        end = self.book(os.path.getsize(path), self.write_bytes_per_s)
        info = self.inner.put_file(key, path, mode=mode, pacer=pacer)
        self.wait_until(end)
        return info

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        out = self.inner.get(key, offset=offset, length=length)
        if self.read_bytes_per_s:
            self.wait_until(self.book(len(out), self.read_bytes_per_s))
        return out

    def readinto(self, key: str, buffers: Buffer | Sequence[Buffer], *, offset: int = 0) -> int:
        got = self.inner.readinto(key, buffers, offset=offset)
        if self.read_bytes_per_s:
            self.wait_until(self.book(got, self.read_bytes_per_s))
        return got


class CountingStorage(StorageWrapper):
    """Counts the bytes read from the inner storage, per key (``get`` and ``readinto``), in this process.

    Restore tests and ``bench/bench_restore.py`` hold a restore's store reads to the checkpoint's size with it: the
    bytes the store served, not what a process read from sockets or its own page cache.
    """

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self.bytes_read: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"inner": self.inner}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["inner"])  # type: ignore[misc]

    def _count(self, key: str, n: int) -> None:
        with self._lock:
            self.bytes_read[key] = self.bytes_read.get(key, 0) + n

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.bytes_read.values())

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        out = self.inner.get(key, offset=offset, length=length)
        self._count(key, len(out))
        return out

    def readinto(self, key: str, buffers: Buffer | Sequence[Buffer], *, offset: int = 0) -> int:
        got = self.inner.readinto(key, buffers, offset=offset)
        self._count(key, got)
        return got


class LatencyStorage(StorageWrapper):
    """Adds a fixed delay to every operation (a remote metadata server, a far bucket), or only to operations on keys
    containing ``key_with`` (a slow commit: ``key_with="manifest.json"``)."""

    def __init__(self, inner: Storage, *, seconds: float, key_with: str | None = None) -> None:
        super().__init__(inner)
        self.seconds, self.key_with = seconds, key_with

    def _wait(self, key: str) -> None:
        if self.key_with is None or self.key_with in key:
            time.sleep(self.seconds)

    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        self._wait(key)
        return self.inner.put(key, data, mode=mode, pacer=pacer)

    def put_file(self, key: str, path: str, *, mode: WriteMode = "overwrite",
                 pacer: Pacer | None = None) -> ObjectInfo:
        self._wait(key)
        return self.inner.put_file(key, path, mode=mode, pacer=pacer)

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        self._wait(key)
        return self.inner.get(key, offset=offset, length=length)

    def head(self, key: str) -> ObjectInfo:
        self._wait(key)
        return self.inner.head(key)


class GatedReadStorage(StorageWrapper):
    """Holds reads of keys containing ``key_with`` until ``until_key`` exists, then ``extra_s`` more (at most
    ``timeout_s`` in all): a rank whose watcher falls behind rank 0's commits, made deterministic."""

    def __init__(self, inner: Storage, *, key_with: str, until_key: str, extra_s: float = 1.0,
                 timeout_s: float = 120.0) -> None:
        super().__init__(inner)
        self.key_with, self.until_key, self.extra_s, self.timeout_s = key_with, until_key, extra_s, timeout_s

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        if self.key_with in key:
            deadline = time.monotonic() + self.timeout_s
            while not self.inner.exists(self.until_key) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(self.extra_s)
        return self.inner.get(key, offset=offset, length=length)


class FaultStorage(StorageWrapper):
    """Fails writes with an errno once a byte budget is spent, or for keys containing ``fail_keys_with``.

    ``errno_code=ENOSPC`` emulates a full local tier, ``EIO`` a failing disk. Reads are never affected, so the
    test can check that what was committed before the fault is intact.
    """

    def __init__(
        self,
        inner: Storage,
        *,
        errno_code: int = errno.ENOSPC,
        capacity_bytes: int | None = None,
        fail_keys_with: str | None = None,
    ) -> None:
        super().__init__(inner)
        self.errno_code = errno_code
        self.capacity_bytes = capacity_bytes
        self.fail_keys_with = fail_keys_with

    def _check(self, key: str, nbytes: int) -> None:
        hit = self.fail_keys_with is not None and self.fail_keys_with in key
        if self.capacity_bytes is not None:
            used = sum(i.size for i in self.inner.list(""))
            hit = hit or used + nbytes > self.capacity_bytes
        if hit:
            message = f"injected {errno.errorcode.get(self.errno_code, self.errno_code)} writing {key!r}"
            cls = StorageFullError if self.errno_code in (errno.ENOSPC, errno.EDQUOT) else StorageError
            raise cls(message, root=self.url, path=key)

    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        self._check(key, data_size(data))
        return self.inner.put(key, data, mode=mode, pacer=pacer)

    def put_file(self, key: str, path: str, *, mode: WriteMode = "overwrite",
                 pacer: Pacer | None = None) -> ObjectInfo:
        self._check(key, os.path.getsize(path))
        return self.inner.put_file(key, path, mode=mode, pacer=pacer)


class OpCountingStorage(StorageWrapper):
    """Counts the operations made on the inner storage, by kind, in this process: the commit path's metadata
    accounting (``format.commit_ops``) is held against these counts in tests and ``bench/bench_commit.py``.

    Kinds are the protocol's operations: ``put`` (``put_file`` too: both create one object), ``get`` (and
    ``readinto``), ``head`` (``exists`` goes through it), ``list``, ``list_dirs``, ``delete``, ``delete_prefix``:
    one per call, whatever the call lists or moves. Derived operations a backend may override (``get_many``,
    ``exists``) are counted as the primitives they are built from here.
    """

    def __init__(self, inner: Storage) -> None:
        super().__init__(inner)
        self._lock = threading.Lock()
        self.counts: dict[str, int] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"inner": self.inner}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["inner"])  # type: ignore[misc]

    def _count(self, kind: str) -> None:
        with self._lock:
            self.counts[kind] = self.counts.get(kind, 0) + 1

    def snapshot(self) -> dict[str, int]:
        """The counts so far (a copy: subtract two snapshots to count what happened between them)."""
        with self._lock:
            return dict(self.counts)

    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        self._count("put")
        return self.inner.put(key, data, mode=mode, pacer=pacer)

    def put_file(self, key: str, path: str, *, mode: WriteMode = "overwrite",
                 pacer: Pacer | None = None) -> ObjectInfo:
        self._count("put")
        return self.inner.put_file(key, path, mode=mode, pacer=pacer)

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        self._count("get")
        return self.inner.get(key, offset=offset, length=length)

    def readinto(self, key: str, buffers: Buffer | Sequence[Buffer], *, offset: int = 0) -> int:
        self._count("get")
        return self.inner.readinto(key, buffers, offset=offset)

    def head(self, key: str) -> ObjectInfo:
        self._count("head")
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._count("list")
        return self.inner.list(prefix)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        self._count("list_dirs")
        return self.inner.list_dirs(prefix)

    def delete(self, key: str) -> None:
        self._count("delete")
        self.inner.delete(key)

    def delete_prefix(self, prefix: str) -> int:
        self._count("delete_prefix")
        return self.inner.delete_prefix(prefix)
