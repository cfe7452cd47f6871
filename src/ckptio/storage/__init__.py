"""Storage tiers behind one protocol: POSIX directories, S3 buckets, and test/demo wrappers.

The map: ``base`` is the protocol (:class:`Storage`) every tier speaks; ``registry`` reads root strings and opens
the backend a scheme names (``posix/``, ``s3/``: one package per backend, each with its own transport seam);
``root`` is the parsed-root value they share; ``storage_wrapper`` and ``subtree`` stack on any storage;
``capabilities`` finds out what a store really honours. docs/architecture.md lists what a new backend touches.
"""

from __future__ import annotations

from ckptio.storage.base import Exposure, IfMatch, ObjectInfo, PutMode, Storage
from ckptio.storage.posix.posix_root import PosixRoot
from ckptio.storage.posix.posix_storage import PosixStorage
from ckptio.storage.registry import open_storage, parse_root
from ckptio.storage.root import Root
from ckptio.storage.storage_wrapper import StorageWrapper

#: Any parsed root (an older name of :class:`Root`).
RootSpec = Root

__all__ = [
    "Exposure",
    "IfMatch",
    "ObjectInfo",
    "PosixRoot",
    "PosixStorage",
    "PutMode",
    "Root",
    "RootSpec",
    "Storage",
    "StorageWrapper",
    "open_storage",
    "parse_root",
]
