"""Where everything lives under a root: step directories, rank indexes, manifests, ``latest``, data keys.

Only canonical names count: exactly what :func:`step_dir` writes (``step-`` and the step zero-padded to eight
digits, more only when the step needs them). ``step-0000000099`` is junk, not an alias of step 99.

It also owns the containment rule for keys a manifest may name (:func:`check_data_key`): a step's data lives in
its own directory or under a hash directory followed by its own step directory, and nowhere else. This module
computes and checks names; it never reads or writes storage.
"""

from __future__ import annotations

import re

from ckptio.errors import CorruptCheckpointError
from ckptio.storage.base import HASHED_DIR_PREFIX, Storage, join_key

MANIFEST = "manifest.json"
METADATA = ".metadata"
LATEST = "latest"
RANKS_DIR = "ranks"
FAILED_DIR = "failed"
MANIFEST_FORMAT = "ckptio-manifest/1"
INDEX_FORMAT = "ckptio-rank-index/1"
_STEP_RE = re.compile(r"^step-(\d{8,})$")
# A data file's name within its step directory: one plain path segment, no separators, no dot-only names.
_FILE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+=-]*$")
_HASH_DIR_RE = re.compile(rf"^{re.escape(HASHED_DIR_PREFIX)}[0-9a-f]{{1,16}}$")


def step_dir(step: int) -> str:
    return f"step-{step:08d}"


def parse_step_dir(name: str) -> int | None:
    """The step a directory name stands for, or None unless the name is exactly ``step_dir(step)``."""
    m = _STEP_RE.match(name)
    if m is None:
        return None
    step = int(m.group(1))
    return step if step_dir(step) == name else None


def check_file_name(name: str, *, step: int, path: str = "") -> None:
    """Raise CorruptCheckpointError unless ``name`` is a plain file name (one segment, no ``..``, no ``/``)."""
    if not isinstance(name, str) or not _FILE_NAME_RE.match(name) or len(name) > 255:
        raise CorruptCheckpointError(f"data file name {name!r} is not a plain file name", step=step, path=path)


def check_data_key(key: str, name: str, *, step: int, path: str = "") -> None:
    """Raise CorruptCheckpointError unless ``key`` is where step ``step`` may keep its data file ``name``:
    ``step-XXXXXXXX/<name>`` or ``h-<hex>/step-XXXXXXXX/<name>``. Anything else (another step's file, ``..``,
    an absolute key, a file elsewhere under the root) is a manifest retention and restore must not follow."""
    check_file_name(name, step=step, path=path)
    parts = key.split("/") if isinstance(key, str) else []
    own = parts[-2:] == [step_dir(step), name]
    if own and (len(parts) == 2 or (len(parts) == 3 and _HASH_DIR_RE.match(parts[0]))):
        return
    raise CorruptCheckpointError(f"data key {key!r} of {name!r} lies outside step {step}'s own keys",
                                 step=step, path=path)


def hash_prefix_enabled(storage: Storage) -> bool:
    """True when ``storage`` puts data files under hash directories (its ``hash_prefix`` capability)."""
    return storage.hash_prefix


def durable_data_key(storage: Storage, step: int, name: str) -> str:
    """Where a data file goes on the durable tier: under a short hash directory when the storage asks for it
    (spreads S3 partitions), else in the step directory. The manifest records the real key."""
    return storage.data_key(join_key(step_dir(step), name))


def index_key(step: int, rank: int) -> str:
    return join_key(step_dir(step), RANKS_DIR, f"{rank}.json")


def failed_key(step: int, who: str) -> str:
    return join_key(step_dir(step), FAILED_DIR, f"{who}.json")


def manifest_key(step: int) -> str:
    return join_key(step_dir(step), MANIFEST)
