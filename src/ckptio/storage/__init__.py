"""Storage tiers behind one protocol: POSIX directories, S3 buckets, and test/demo wrappers."""

from __future__ import annotations

import os
from typing import Any

from ckptio.errors import ConfigError
from ckptio.storage.base import ObjectInfo, Storage
from ckptio.storage.posix import PosixStorage
from ckptio.storage.wrappers import StorageWrapper

__all__ = [
    "ObjectInfo",
    "PosixStorage",
    "Storage",
    "StorageWrapper",
    "open_storage",
]


def open_storage(target: str | os.PathLike[str] | Storage, **options: Any) -> Storage:
    """A storage for ``target``: a :class:`Storage` as is, ``s3://bucket/prefix``, ``file://`` or a path."""
    if isinstance(target, Storage):
        return target
    text = os.fspath(target)
    if text.startswith("s3://"):
        from ckptio.storage.s3 import S3Storage

        return S3Storage.from_url(text, **options)
    if "://" in text and not text.startswith("file://"):
        raise ConfigError(f"unsupported storage URL {text!r} (use a path, file://, or s3://)")
    path = text[len("file://") :] if text.startswith("file://") else text
    if not path:
        raise ConfigError("empty storage path")
    return PosixStorage(path, **options)
