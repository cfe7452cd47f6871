"""The on-storage contract: step directories, rank indexes, manifest, ``latest``, retention and verification.

A step is committed iff ``step-XXXXXXXX/manifest.json`` exists. It is written last and create-only, after every
rank's index (which is written after that rank's data is durable) and after ``.metadata``. Everything here is
written against the :class:`~ckptio.storage.Storage` protocol, so POSIX and S3 share one implementation.

Retention deletes a step's manifest first, so an interrupted deletion leaves an uncommitted (ignored) directory,
never a committed one with holes. It never deletes the newest committed step.
"""

from __future__ import annotations

import json
import platform
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import crc32c

from ckptio.errors import (
    AlreadyExistsError,
    CheckpointNotFoundError,
    ChecksumError,
    CommitError,
    CorruptCheckpointError,
    NotFoundError,
    PreconditionError,
    StorageError,
)
from ckptio.storage.base import Buffer, Storage, join_key

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


def checksum(buffers: Iterable[Buffer]) -> str:
    value = 0
    for b in buffers:
        value = crc32c.crc32c(b, value)
    return f"{value:08x}"


# ---- rank index ---------------------------------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class FileRecord:
    """One data file: its name within the step directory, size and crc32c."""

    name: str
    size: int
    crc32c: str
    key: str = ""
    """The object's key under the root when it is not ``step-XXXXXXXX/<name>`` (hash-prefixed S3 data)."""


@dataclass(kw_only=True, slots=True)
class ItemRecord:
    """Where one DCP write item landed: the file, byte offset and length."""

    fqn: str
    offset: list[int] | None
    index_hint: int | None
    file: str
    file_offset: int
    length: int


@dataclass(kw_only=True, slots=True)
class RankIndex:
    """What one rank wrote for one step; written after its data files are durable."""

    step: int
    rank: int
    world_size: int
    save_id: int
    files: list[FileRecord]
    items: list[ItemRecord]

    def to_json(self) -> bytes:
        body = {"format": INDEX_FORMAT, **asdict(self)}
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, key: str = "") -> RankIndex:
        try:
            d = json.loads(raw)
            if d.pop("format", None) != INDEX_FORMAT:
                raise ValueError("unknown format")
            d["files"] = [FileRecord(**f) for f in d["files"]]
            d["items"] = [ItemRecord(**i) for i in d["items"]]
            return cls(**d)
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptCheckpointError(f"unreadable rank index: {exc}", path=key) from exc


def _hash_prefix_enabled(storage: Storage) -> bool:
    while True:
        if getattr(storage, "hash_prefix", False):
            return True
        inner = getattr(storage, "inner", None)
        if inner is None:
            return False
        storage = inner


def durable_data_key(storage: Storage, step: int, name: str) -> str:
    """Where a data file goes on the durable tier: under a short hash directory when the storage asks for it
    (spreads S3 partitions), else in the step directory. The manifest records the real key."""
    key = join_key(step_dir(step), name)
    if _hash_prefix_enabled(storage):
        from ckptio.storage.s3 import hashed_key

        return hashed_key(key)
    return key


def record_key(step: int, rec: FileRecord) -> str:
    return rec.key or join_key(step_dir(step), rec.name)


def index_key(step: int, rank: int) -> str:
    return join_key(step_dir(step), RANKS_DIR, f"{rank}.json")


def failed_key(step: int, who: str) -> str:
    return join_key(step_dir(step), FAILED_DIR, f"{who}.json")


def write_failure(storage: Storage, step: int, who: str, save_id: int, error: BaseException) -> None:
    """Tell the committer and the other ranks' watchers that this save attempt cannot commit."""
    body = {"save_id": save_id, "error": f"{type(error).__name__}: {error}", "time": time.time()}
    try:
        storage.put(failed_key(step, who), json.dumps(body).encode())
    except StorageError:
        pass  # the committer's timeout is the fallback


def read_failures(storage: Storage, step: int, save_id: int) -> list[str]:
    prefix = join_key(step_dir(step), FAILED_DIR) + "/"
    out = []
    for info in storage.list(prefix):
        try:
            body = json.loads(storage.get(info.key))
        except (StorageError, ValueError):
            continue
        if body.get("save_id") == save_id:
            out.append(f"{info.key.rsplit('/', 1)[-1].removesuffix('.json')}: {body.get('error')}")
    return out


# ---- manifest -----------------------------------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class Manifest:
    """The commit record of one step. Its existence is the commit."""

    step: int
    world_size: int
    save_id: int
    files: dict[str, FileRecord]
    """Keyed by name within the step directory (data files of every rank)."""
    total_bytes: int
    metadata_crc32c: str = ""
    """Checksum of ``.metadata`` as the committer wrote it (empty in manifests that predate it)."""
    created: float = field(default_factory=time.time)
    versions: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        body = {"format": MANIFEST_FORMAT, **asdict(self)}
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes, *, key: str = "") -> Manifest:
        try:
            d = json.loads(raw)
            if d.pop("format", None) != MANIFEST_FORMAT:
                raise ValueError("unknown format")
            d["files"] = {k: FileRecord(**v) for k, v in d["files"].items()}
            return cls(**d)
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptCheckpointError(f"unreadable manifest: {exc}", path=key) from exc


def versions() -> dict[str, str]:
    import torch

    from ckptio import __version__

    return {"ckptio": __version__, "torch": torch.__version__, "python": platform.python_version()}


def manifest_key(step: int) -> str:
    return join_key(step_dir(step), MANIFEST)


def write_manifest(storage: Storage, manifest: Manifest) -> None:
    """Create-only write of the manifest: the commit point."""
    key = manifest_key(manifest.step)
    body = manifest.to_json()
    try:
        storage.put(key, body, mode="create")
    except AlreadyExistsError as exc:
        # A retried create may find its own earlier write: same save_id means it is ours.
        try:
            existing = Manifest.from_json(storage.get(key), key=key)
        except (StorageError, CorruptCheckpointError):
            existing = None
        if existing is not None and existing.save_id == manifest.save_id:
            return
        raise CommitError(
            "step is already committed by another save", root=storage.url, step=manifest.step, path=key
        ) from exc


def read_manifest(storage: Storage, step: int) -> Manifest:
    key = manifest_key(step)
    try:
        raw = storage.get(key)
    except NotFoundError:
        raise CheckpointNotFoundError("no committed checkpoint for this step", root=storage.url, step=step) from None
    return Manifest.from_json(raw, key=key)


def committed_steps(storage: Storage) -> list[int]:
    """Steps whose manifest exists, ascending."""
    steps = []
    for name in storage.list_dirs(""):
        step = parse_step_dir(name)
        if step is not None and storage.exists(join_key(name, MANIFEST)):
            steps.append(step)
    return sorted(steps)


def all_step_dirs(storage: Storage) -> list[int]:
    return sorted(s for s in (parse_step_dir(n) for n in storage.list_dirs("")) if s is not None)


def update_latest(storage: Storage, step: int) -> None:
    """Move the advisory ``latest`` pointer forward with compare-and-swap; never backwards."""
    for _ in range(5):
        try:
            info = storage.head(LATEST)
            current = int(storage.get(LATEST).strip() or b"-1")
        except NotFoundError:
            info, current = None, -1
        except ValueError:
            info, current = storage.head(LATEST), -1
        if current >= step:
            return
        try:
            if info is None:
                storage.put(LATEST, str(step).encode(), mode="create")
            else:
                storage.put(LATEST, str(step).encode(), if_match=info.etag)
            return
        except (AlreadyExistsError, PreconditionError):
            continue


def read_latest(storage: Storage) -> int | None:
    try:
        return int(storage.get(LATEST).strip())
    except (NotFoundError, ValueError):
        return None


# ---- retention ----------------------------------------------------------------------------------------------------
def delete_step(storage: Storage, step: int) -> None:
    """Manifest first: a half-deleted step is uncommitted, never a committed step with missing files."""
    try:
        hashed = [rec.key for rec in read_manifest(storage, step).files.values() if rec.key]
    except (CheckpointNotFoundError, CorruptCheckpointError):
        hashed = []
    storage.delete(manifest_key(step))
    for key in hashed:
        storage.delete(key)
    storage.delete_prefix(step_dir(step))


def _delete_uncommitted(storage: Storage, step: int) -> None:
    storage.delete_prefix(step_dir(step))
    if _hash_prefix_enabled(storage):  # hashed data of a failed attempt lives outside the step directory
        for top in storage.list_dirs(""):
            if top.startswith("h-"):
                storage.delete_prefix(join_key(top, step_dir(step)))


def apply_retention(storage: Storage, *, keep_last: int, newest_committed: int) -> list[int]:
    """Delete committed steps beyond ``keep_last`` and uncommitted leftovers older than ``newest_committed``.

    Uncommitted directories newer than the newest commit may belong to a save in flight and are left alone.
    Returns the steps removed.
    """
    committed = committed_steps(storage)
    if newest_committed not in committed:
        return []  # never delete before the newer step is committed
    removed = []
    if keep_last > 0:
        for step in committed[:-keep_last]:
            if step != newest_committed:
                delete_step(storage, step)
                removed.append(step)
    for step in all_step_dirs(storage):
        if step < newest_committed and step not in committed:
            _delete_uncommitted(storage, step)
            removed.append(step)
    return sorted(removed)


def remove_unlisted_files(storage: Storage, manifest: Manifest) -> list[str]:
    """Delete data files of earlier attempts at a committed step (the manifest lists the ones that count)."""
    base = step_dir(manifest.step)
    removed = []
    for info in storage.list(base + "/"):
        name = info.key[len(base) + 1 :]
        if name.endswith(".distcp") and "/" not in name and name not in manifest.files:
            storage.delete(info.key)
            removed.append(name)
    return removed


# ---- verification -------------------------------------------------------------------------------------------------
@dataclass(kw_only=True, slots=True)
class VerifyResult:
    step: int
    ok: bool
    files: int
    bytes: int
    problems: list[str]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify_step(storage: Storage, step: int) -> VerifyResult:
    """Re-read every file of a committed step and compare sizes and checksums with its manifest."""
    problems: list[str] = []
    try:
        manifest = read_manifest(storage, step)
    except (CheckpointNotFoundError, CorruptCheckpointError) as exc:
        return VerifyResult(step=step, ok=False, files=0, bytes=0, problems=[str(exc)])
    base = step_dir(step)
    total = 0
    for _name, rec in sorted(manifest.files.items()):
        key = record_key(step, rec)
        try:
            data = storage.get(key)
        except StorageError as exc:
            problems.append(f"{key}: missing or unreadable ({exc})")
            continue
        total += len(data)
        if len(data) != rec.size:
            problems.append(f"{key}: size {len(data)} != manifest {rec.size}")
        elif checksum([data]) != rec.crc32c:
            problems.append(f"{key}: checksum {checksum([data])} != manifest {rec.crc32c}")
    try:
        meta = storage.get(join_key(base, METADATA))
        if manifest.metadata_crc32c and checksum([meta]) != manifest.metadata_crc32c:
            problems.append(f"{join_key(base, METADATA)}: checksum {checksum([meta])} != manifest "
                            f"{manifest.metadata_crc32c}")
    except StorageError:
        problems.append(f"{join_key(base, METADATA)}: missing")
    return VerifyResult(step=step, ok=not problems, files=len(manifest.files), bytes=total, problems=problems)


def check_file(storage: Storage, step: int, name: str, data: bytes, rec: FileRecord) -> None:
    """Raise ChecksumError when ``data`` (a file read for restore) does not match its manifest record."""
    if len(data) != rec.size or checksum([data]) != rec.crc32c:
        raise ChecksumError(
            f"{name}: expected {rec.size} bytes crc32c {rec.crc32c}, read {len(data)} bytes crc32c "
            f"{checksum([data])}",
            root=storage.url,
            step=step,
            path=join_key(step_dir(step), name),
        )
