"""Storage tiers behind one protocol: POSIX directories, S3 buckets, and test/demo wrappers."""

from __future__ import annotations

import os
from typing import Any

from ckptio.storage.base import Exposure, IfMatch, ObjectInfo, PutMode, Storage
from ckptio.storage.posix.posix_storage import PosixStorage
from ckptio.storage.root import PosixRoot, RootSpec, S3Root, parse_root
from ckptio.storage.wrappers import StorageWrapper

__all__ = [
    "Exposure",
    "IfMatch",
    "ObjectInfo",
    "PosixRoot",
    "PosixStorage",
    "PutMode",
    "RootSpec",
    "S3Root",
    "Storage",
    "StorageWrapper",
    "open_storage",
    "parse_root",
]


def open_storage(target: str | os.PathLike[str] | RootSpec | Storage, **options: Any) -> Storage:
    """A storage for ``target``: a :class:`Storage` as is, ``s3://bucket/prefix``, ``file://`` or a path.

    ``options`` go to the backend (:class:`PosixStorage` or :class:`~ckptio.storage.s3.s3_storage.S3Options` fields).
    """
    if isinstance(target, Storage):
        return target
    root = parse_root(target)
    if isinstance(root, S3Root):
        from ckptio.storage.s3.s3_storage import S3Storage  # boto3 is optional: imported only for s3:// roots

        return S3Storage(root.bucket, root.prefix, **options)
    return PosixStorage(root.path, **options)
