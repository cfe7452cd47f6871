"""The base of every storage wrapper: delegates each primitive and capability to the storage it wraps.

Wrappers (throttle, latency, fault injection in :mod:`ckptio.testing.wrappers`) subclass it and override what
they change; a capability of the inner storage (url, store id, local directory, hash-prefixed data keys, write
conditions, region, public exposure) is never hidden by a wrapper: wrappers change behaviour, never where the bytes
land. A wrapper that changes reads (its own ``get``) sees ranged reads and copies out go through that ``get``.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator, Sequence

from ckptio.storage.base import (
    Buffer,
    Data,
    Exposure,
    LocalDirectory,
    ObjectInfo,
    Pacer,
    PutMode,
    Storage,
    WriteConditions,
    WriteMode,
)


class StorageWrapper(Storage):
    """Delegates everything to ``inner``; subclasses override what they change."""

    def __init__(self, inner: Storage) -> None:
        self.inner = inner

    # ---- capabilities: always the inner storage's ---------------------------------------------------------------
    @property
    def url(self) -> str:
        return self.inner.url

    @property
    def store_id(self) -> str:
        return self.inner.store_id

    @property
    def write_conditions(self) -> WriteConditions:
        return self.inner.write_conditions

    @property
    def writes_in_parts(self) -> bool:
        return self.inner.writes_in_parts

    def local_directory(self) -> LocalDirectory | None:
        return self.inner.local_directory()

    @property
    def hash_prefix(self) -> bool:
        return self.inner.hash_prefix

    @property
    def region(self) -> str | None:
        return self.inner.region

    def public_exposure(self) -> Exposure:
        return self.inner.public_exposure()

    @property
    def read_batch_bytes(self) -> int:
        return self.inner.read_batch_bytes

    def data_key(self, key: str) -> str:
        return self.inner.data_key(key)

    # ---- primitives and derived operations ----------------------------------------------------------------------
    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        return self.inner.put(key, data, mode=mode, pacer=pacer)

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        return self.inner.get(key, offset=offset, length=length)

    def _changes_reads(self) -> bool:
        return type(self).get is not StorageWrapper.get

    def readinto(self, key: str, buffers: Buffer | Sequence[Buffer], *, offset: int = 0) -> int:
        if self._changes_reads():
            # The subclass changes reads (latency, throttle, gates): ranged reads go through its get too.
            return Storage.readinto(self, key, buffers, offset=offset)
        return self.inner.readinto(key, buffers, offset=offset)

    def copy_to(self, key: str, target: Storage, target_key: str, *, pacer: Pacer | None = None) -> ObjectInfo:
        if self._changes_reads():
            return Storage.copy_to(self, key, target, target_key, pacer=pacer)
        return self.inner.copy_to(key, target, target_key, pacer=pacer)

    def put_parts(self, key: str, parts: Sequence[bytes], *, mode: PutMode = "overwrite") -> ObjectInfo:
        return self.inner.put_parts(key, parts, mode=mode)

    def head(self, key: str) -> ObjectInfo:
        return self.inner.head(key)

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def put_file(self, key: str, path: str, *, mode: WriteMode = "overwrite",
                 pacer: Pacer | None = None) -> ObjectInfo:
        # The inner backend's own put_file streams (S3 multipart) instead of reading the file into memory.
        return self.inner.put_file(key, path, mode=mode, pacer=pacer)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return self.inner.list_dirs(prefix)

    def delete_prefix(self, prefix: str) -> int:
        return self.inner.delete_prefix(prefix)

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
