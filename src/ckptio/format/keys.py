"""Where everything lives under a root: step directories, rank indexes, manifests, ``latest``, data keys.

Only canonical names count: ``step-`` followed by at least eight digits. This module computes names; it never
reads or writes storage.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ckptio.storage.base import Storage, join_key

if TYPE_CHECKING:
    from ckptio.format.records import FileRecord

MANIFEST = "manifest.json"
METADATA = ".metadata"
LATEST = "latest"
RANKS_DIR = "ranks"
FAILED_DIR = "failed"
MANIFEST_FORMAT = "ckptio-manifest/1"
INDEX_FORMAT = "ckptio-rank-index/1"
_STEP_RE = re.compile(r"^step-(\d{8,})$")


def step_dir(step: int) -> str:
    return f"step-{step:08d}"


def parse_step_dir(name: str) -> int | None:
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def hash_prefix_enabled(storage: Storage) -> bool:
    """True when ``storage`` puts data files under hash directories (its ``hash_prefix`` capability)."""
    return storage.hash_prefix


def durable_data_key(storage: Storage, step: int, name: str) -> str:
    """Where a data file goes on the durable tier: under a short hash directory when the storage asks for it
    (spreads S3 partitions), else in the step directory. The manifest records the real key."""
    return storage.data_key(join_key(step_dir(step), name))


def record_key(step: int, rec: FileRecord) -> str:
    return rec.key or join_key(step_dir(step), rec.name)


def index_key(step: int, rank: int) -> str:
    return join_key(step_dir(step), RANKS_DIR, f"{rank}.json")


def failed_key(step: int, who: str) -> str:
    return join_key(step_dir(step), FAILED_DIR, f"{who}.json")


def manifest_key(step: int) -> str:
    return join_key(step_dir(step), MANIFEST)
