"""A storage that is one subtree of another: every key is relative to ``prefix`` inside the inner storage.

Why it exists: the local level of a two-level job keeps its records (rank indexes, ``.metadata``, manifests,
markers, ``latest``, ``retired.json``) under ``<root>/levels/local/``, laid out exactly like the durable level's
records under ``<root>/``. Seen through a subtree, those records are a root of their own, so one commit protocol,
one retention and one verifier serve both levels without a key function per level.

Unlike the wrappers of :mod:`ckptio.storage.storage_wrapper`, a subtree changes where the bytes land (that is its
point); it never lets a key leave its subtree: keys are joined below ``prefix`` and ``..`` segments are refused.
It holds no client of its own: closing it leaves the inner storage open (the inner storage has its own owner).
"""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable, Iterator, Sequence

from ckptio.errors import ConfigError
from ckptio.storage.base import (
    Data,
    LocalDirectory,
    ObjectInfo,
    Pacer,
    PutMode,
    Storage,
    WriteConditions,
    WriteMode,
    join_key,
)


class _SubtreeDirectory:
    """The local directory of a subtree: the inner directory's, below the prefix."""

    def __init__(self, inner: LocalDirectory, prefix: str, key: Callable[[str], str]) -> None:
        self.inner, self.root, self._key = inner, os.path.join(inner.root, prefix), key

    def local_path(self, key: str) -> str:
        return self.inner.local_path(self._key(key))


class SubtreeStorage(Storage):
    """The keys of ``inner`` below ``prefix``, as a storage whose root is that prefix."""

    def __init__(self, inner: Storage, prefix: str) -> None:
        parts = [p for p in prefix.split("/") if p]
        if not parts or any(p in (".", "..") for p in parts):
            raise ConfigError(f"a subtree prefix must name a directory below the root, got {prefix!r}")
        self.inner = inner
        self.prefix = "/".join(parts)

    def _key(self, key: str) -> str:
        if any(p in (".", "..") for p in key.split("/")):
            raise ConfigError(f"key {key!r} would leave the subtree {self.prefix!r}")
        return join_key(self.prefix, key) if key else self.prefix

    def _info(self, info: ObjectInfo) -> ObjectInfo:
        return ObjectInfo(key=info.key[len(self.prefix) + 1 :], size=info.size, etag=info.etag)

    # ---- capabilities ------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return join_key(self.inner.url, self.prefix)

    @property
    def store_id(self) -> str:
        return self.inner.store_id  # the same store: what it honours does not depend on the prefix

    @property
    def write_conditions(self) -> WriteConditions:
        return self.inner.write_conditions

    @property
    def writes_in_parts(self) -> bool:
        return self.inner.writes_in_parts

    @property
    def region(self) -> str | None:
        return self.inner.region

    def local_directory(self) -> LocalDirectory | None:
        inner = self.inner.local_directory()
        return None if inner is None else _SubtreeDirectory(inner, self.prefix, self._key)

    # ---- primitives --------------------------------------------------------------------------------------------
    def put(self, key: str, data: Data, *, mode: PutMode = "overwrite", pacer: Pacer | None = None) -> ObjectInfo:
        return self._info(self.inner.put(self._key(key), data, mode=mode, pacer=pacer))

    def put_file(self, key: str, path: str, *, mode: WriteMode = "overwrite",
                 pacer: Pacer | None = None) -> ObjectInfo:
        return self._info(self.inner.put_file(self._key(key), path, mode=mode, pacer=pacer))

    def get(self, key: str, *, offset: int = 0, length: int | None = None) -> bytes:
        return self.inner.get(self._key(key), offset=offset, length=length)

    def head(self, key: str) -> ObjectInfo:
        return self._info(self.inner.head(self._key(key)))

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # A prefix is matched as a string (``ranks/`` or ``step-0000``), so it is joined, not checked as a key.
        for info in self.inner.list(f"{self.prefix}/{prefix}"):
            yield self._info(info)

    def delete(self, key: str) -> None:
        self.inner.delete(self._key(key))

    def copy_to(self, key: str, target: Storage, target_key: str, *, pacer: Pacer | None = None) -> ObjectInfo:
        return self.inner.copy_to(self._key(key), target, target_key, pacer=pacer)

    def put_parts(self, key: str, parts: Sequence[bytes], *, mode: PutMode = "overwrite") -> ObjectInfo:
        return self._info(self.inner.put_parts(self._key(key), parts, mode=mode))

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        got = self.inner.get_many([self._key(k) for k in keys])
        return {k[len(self.prefix) + 1 :]: v for k, v in got.items()}

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        return self.inner.list_dirs(self._key(prefix))

    def delete_prefix(self, prefix: str) -> int:
        return self.inner.delete_prefix(self._key(prefix))

    def __repr__(self) -> str:
        return f"SubtreeStorage({self.inner!r}, {self.prefix!r})"
