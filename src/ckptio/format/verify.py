"""Verification: re-read a committed step, hold every file to its manifest record, and cross-check the records.

Problems (the step is not intact: ``ok`` is False) are missing or damaged files, a manifest that fails its checks
(keys outside its step, names that differ from their records), and a ``.metadata`` that is damaged, names code,
or disagrees with the manifest or with the rank indexes of the committed save. Warnings (``--strict`` fails on
them) are files in the step that no record lists, rank indexes of another attempt or missing, and a manifest
without a ``.metadata`` checksum.

``.metadata`` is read only with the restricted unpickler (:func:`~ckptio.format.safe_pickle.load_metadata`: DCP's
metadata classes and plain builtins); non-tensor values are never unpickled here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ckptio.errors import CheckpointNotFoundError, ChecksumError, CorruptCheckpointError, StorageError
from ckptio.format.commit import read_manifest
from ckptio.format.crosscheck import index_findings, metadata_problems
from ckptio.format.keys import FAILED_DIR, MANIFEST, METADATA, RANKS_DIR, hash_prefix_enabled, step_dir
from ckptio.format.records import FileRecord, Manifest, RankIndex, checksum, record_key
from ckptio.format.safe_pickle import load_metadata
from ckptio.storage.base import HASHED_DIR_PREFIX, Storage, join_key

_MAX_HASH_DIRS_SCANNED = 256


@dataclass(kw_only=True, slots=True)
class VerifyResult:
    step: int
    ok: bool
    files: int
    bytes: int
    problems: list[str]
    warnings: list[str] = field(default_factory=list)
    """Findings that do not make the step unrestorable (orphaned files, stale rank indexes); ``--strict`` fails."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def verify_step(storage: Storage, step: int) -> VerifyResult:
    """Re-read every file of a committed step, compare sizes and checksums with its manifest, and cross-check
    the manifest, ``.metadata`` and the rank indexes."""
    try:
        manifest = read_manifest(storage, step)
    except (CheckpointNotFoundError, CorruptCheckpointError) as exc:
        return VerifyResult(step=step, ok=False, files=0, bytes=0, problems=[str(exc)])
    problems, total = _check_files(storage, manifest)
    warnings: list[str] = []
    metadata = _check_metadata(storage, manifest, problems, warnings)
    index_problems, index_warnings = index_findings(metadata, manifest, _read_indexes(storage, step, warnings))
    problems += index_problems
    warnings += index_warnings + _orphans(storage, manifest)
    return VerifyResult(step=step, ok=not problems, files=len(manifest.files), bytes=total, problems=problems,
                        warnings=warnings)


def _check_files(storage: Storage, manifest: Manifest) -> tuple[list[str], int]:
    problems: list[str] = []
    total = 0
    for name, rec in sorted(manifest.files.items()):
        key = record_key(manifest.step, rec)  # read_manifest checked that rec.name == name and the key is the step's
        try:
            data = storage.get(key)
        except StorageError as exc:
            problems.append(f"{key}: missing or unreadable ({exc})")
            continue
        total += len(data)
        if len(data) != rec.size:
            problems.append(f"{key}: size {len(data)} != manifest {rec.size} ({name})")
        elif checksum([data]) != rec.crc32c:
            problems.append(f"{key}: checksum {checksum([data])} != manifest {rec.crc32c} ({name})")
    return problems, total


def _check_metadata(storage: Storage, manifest: Manifest, problems: list[str], warnings: list[str]) -> Any:
    """The step's DCP metadata, read with the restricted unpickler and checked against the manifest; None (and a
    problem) when it cannot be."""
    key = join_key(step_dir(manifest.step), METADATA)
    try:
        raw = storage.get(key)
    except StorageError:
        problems.append(f"{key}: missing")
        return None
    if not manifest.metadata_crc32c:
        warnings.append(f"{key}: the manifest records no checksum for it")
    elif checksum([raw]) != manifest.metadata_crc32c:
        problems.append(f"{key}: checksum {checksum([raw])} != manifest {manifest.metadata_crc32c}")
        return None
    try:
        metadata = load_metadata(raw, path=key)
    except CorruptCheckpointError as exc:
        problems.append(f"{key}: {exc}")
        return None
    problems += [f"{key}: {p}" for p in metadata_problems(metadata, manifest)]
    return metadata


def _read_indexes(storage: Storage, step: int, warnings: list[str]) -> dict[int, RankIndex]:
    indexes: dict[int, RankIndex] = {}
    prefix = join_key(step_dir(step), RANKS_DIR) + "/"
    for info in storage.list(prefix):
        name = info.key[len(prefix):]
        try:
            index = RankIndex.from_json(storage.get(info.key), key=info.key)
        except (StorageError, CorruptCheckpointError) as exc:
            warnings.append(f"{info.key}: unreadable ({exc})")
            continue
        if name != f"{index.rank}.json":
            warnings.append(f"{info.key}: holds the index of rank {index.rank}")
            continue
        indexes[index.rank] = index
    return indexes


def _orphans(storage: Storage, manifest: Manifest) -> list[str]:
    """Files of this step that no record accounts for (earlier attempts' data, strays)."""
    base = step_dir(manifest.step)
    listed = {record_key(manifest.step, rec) for rec in manifest.files.values()}
    known = {join_key(base, MANIFEST), join_key(base, METADATA)}
    keys = [i.key for i in storage.list(base + "/")]
    out = []
    if hash_prefix_enabled(storage):
        tops = [top for top in storage.list_dirs("") if top.startswith(HASHED_DIR_PREFIX)]
        if len(tops) > _MAX_HASH_DIRS_SCANNED:
            # One LIST per hash directory per step: past this many, only the step directory is checked.
            out.append(f"{len(tops)} hash directories: orphaned hashed data of this step not checked")
            tops = []
        for top in tops:
            keys += [i.key for i in storage.list(join_key(top, base) + "/")]
    for key in sorted(keys):
        rest = key[len(base) + 1:] if key.startswith(base + "/") else ""
        bookkeeping = rest.startswith((RANKS_DIR + "/", FAILED_DIR + "/")) and rest.count("/") == 1
        if key not in listed and key not in known and not bookkeeping:
            out.append(f"{key}: orphaned (not in the manifest)")
    return out


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
