"""Verification: re-read a committed step, hold every file to its manifest record, and cross-check the records.

Problems (the step is not intact: ``ok`` is False) are missing or damaged files, a manifest that fails its checks
(keys outside its step, names that differ from their records), and a ``.metadata`` that is damaged, names code,
or disagrees with the manifest or with the rank indexes of the committed save. Warnings (``--strict`` fails on
them) are files in the step that no record lists, rank indexes of another attempt or missing, and a manifest
without a ``.metadata`` checksum.

Each level is verified where its records are. A durable step is verified whole. A local-level step (two levels:
``levels/local/step-XXXXXXXX/`` on the durable root) is verified by its records only: its manifest, ``.metadata``
and rank indexes, their cross-checks, and that every file has a node holding it. Its data lives on node-local
disks that a command run elsewhere cannot read, so the result says so in ``notes`` rather than pretend the bytes
were checked; a restore checks each copy's checksum before using it. :func:`verify_levels` verifies a step on every
level it is committed on: what ``ckptio ls`` lists as committed on a level is what ``verify`` checks there.

``.metadata`` is read only with the restricted unpickler (:func:`~ckptio.format.safe_pickle.load_metadata`: DCP's
metadata classes and plain builtins); non-tensor values are never unpickled here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

from ckptio.errors import CheckpointNotFoundError, ChecksumError, CorruptCheckpointError, StorageError
from ckptio.format.commit import committed_steps, read_manifest
from ckptio.format.crosscheck import index_findings, metadata_problems
from ckptio.format.keys import FAILED_DIR, MANIFEST, METADATA, RANKS_DIR, hash_prefix_enabled, step_dir
from ckptio.format.local_manifest import (
    LocalManifest,
    LocalRankIndex,
    local_committed_steps,
    local_metadata_key,
    local_step_key,
    read_local_manifest,
)
from ckptio.format.records import FileRecord, Manifest, RankIndex, checksum, record_key
from ckptio.format.safe_pickle import load_metadata
from ckptio.storage.base import HASHED_DIR_PREFIX, Storage, join_key

_MAX_HASH_DIRS_SCANNED = 256
_Index = TypeVar("_Index", RankIndex, LocalRankIndex)


@dataclass(kw_only=True, slots=True)
class VerifyResult:
    step: int
    ok: bool
    files: int
    bytes: int
    problems: list[str]
    warnings: list[str] = field(default_factory=list)
    """Findings that do not make the step unrestorable (orphaned files, stale rank indexes); ``--strict`` fails."""
    level: Literal["durable", "local"] = "durable"
    """The level whose records were verified."""
    notes: list[str] = field(default_factory=list)
    """What was not checked, and why (a local-level step's data on node-local disks); never a failure."""

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
    metadata = _check_metadata(storage, manifest, join_key(step_dir(step), METADATA), problems, warnings)
    indexes = _read_indexes(storage, join_key(step_dir(step), RANKS_DIR), RankIndex.from_json, warnings)
    index_problems, index_warnings = index_findings(metadata, manifest, indexes)
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


def _check_metadata(storage: Storage, manifest: Manifest, key: str, problems: list[str], warnings: list[str]) -> Any:
    """The step's DCP metadata (at ``key``), read with the restricted unpickler and checked against the manifest;
    None (and a problem) when it cannot be."""
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


def _rank_of(index: RankIndex | LocalRankIndex) -> int:
    return index.index.rank if isinstance(index, LocalRankIndex) else index.rank


def _read_indexes(storage: Storage, ranks_dir: str, parse: Callable[..., _Index],
                  warnings: list[str]) -> dict[int, _Index]:
    """The readable rank indexes under ``ranks_dir``, by rank; an unreadable or misfiled one is a warning."""
    indexes: dict[int, _Index] = {}
    prefix = ranks_dir + "/"
    for info in storage.list(prefix):
        name = info.key[len(prefix):]
        try:
            index = parse(storage.get(info.key), key=info.key)
        except (StorageError, CorruptCheckpointError) as exc:
            warnings.append(f"{info.key}: unreadable ({exc})")
            continue
        if name != f"{_rank_of(index)}.json":
            warnings.append(f"{info.key}: holds the index of rank {_rank_of(index)}")
            continue
        indexes[_rank_of(index)] = index
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


def verify_local_step(storage: Storage, step: int) -> VerifyResult:
    """Verify the records of a step committed on the local level: its manifest, ``.metadata`` and rank indexes
    on the durable root, their cross-checks, and where each file is held. The data files are not read (they are
    on node-local disks); ``notes`` says so."""
    try:
        local = read_local_manifest(storage, step)
    except (CorruptCheckpointError, StorageError) as exc:
        return VerifyResult(step=step, level="local", ok=False, files=0, bytes=0, problems=[str(exc)])
    if local is None:
        return VerifyResult(step=step, level="local", ok=False, files=0, bytes=0,
                            problems=[f"no committed local-level checkpoint for step {step}"])
    manifest = local.manifest
    problems = [f"{name}: no node holds it, and the save did not go to the durable level"
                for name in sorted(manifest.files) if not local.holders[name] and not local.durable]
    warnings: list[str] = []
    metadata = _check_metadata(storage, manifest, local_metadata_key(step), problems, warnings)
    indexes = _read_indexes(storage, local_step_key(step, RANKS_DIR), LocalRankIndex.from_json, warnings)
    index_problems, index_warnings = index_findings(metadata, manifest, {r: e.index for r, e in indexes.items()})
    problems += index_problems
    warnings += index_warnings + _holder_findings(local, indexes) + _local_orphans(storage, step)
    nodes = sorted({n for held in local.holders.values() for n in held})
    notes = [f"data not read: its {len(manifest.files)} files ({manifest.total_bytes:,} bytes) live on node-local "
             f"disks ({', '.join(nodes) or 'no node'}), which this command cannot reach; a restore checks each "
             "copy's checksum before using it"]
    if local.durable:
        notes.append("this save also went to the durable level")
    return VerifyResult(step=step, level="local", ok=not problems, files=len(manifest.files),
                        bytes=manifest.total_bytes, problems=problems, warnings=warnings, notes=notes)


def _holder_findings(local: LocalManifest, indexes: dict[int, LocalRankIndex]) -> list[str]:
    """Warnings where a current rank index and the local manifest disagree on which nodes hold its files."""
    out = []
    for rank, entry in sorted(indexes.items()):
        if entry.index.save_id != local.manifest.save_id:
            continue  # index_findings already warns about another attempt's index
        if local.nodes.get(rank) != entry.node:
            out.append(f"ranks/{rank}.json: node {entry.node!r}, the manifest says {local.nodes.get(rank)!r}")
        differ = [f.name for f in entry.index.files if local.holders.get(f.name) != entry.holders]
        if differ:
            out.append(f"ranks/{rank}.json: holders {entry.holders} differ from the manifest's for {differ}")
    return out


def _local_orphans(storage: Storage, step: int) -> list[str]:
    """Keys among a local-level step's records that are none of them (its data never lies on the root)."""
    base = local_step_key(step)
    known = {local_step_key(step, MANIFEST), local_step_key(step, METADATA)}
    out = []
    for info in storage.list(base + "/"):
        rest = info.key[len(base) + 1:]
        bookkeeping = rest.startswith((RANKS_DIR + "/", FAILED_DIR + "/")) and rest.count("/") == 1
        if info.key not in known and not bookkeeping:
            out.append(f"{info.key}: orphaned (not a record of the local level)")
    return out


def verify_levels(storage: Storage, step: int | None = None) -> list[VerifyResult]:
    """Verify ``step`` (None: every committed step) on each level it is committed on, durable first, in step
    order. A step committed on no level gets the durable result, which says that it is not committed."""
    durable, local = set(committed_steps(storage)), set(local_committed_steps(storage))
    results = []
    for s in [step] if step is not None else sorted(durable | local):
        if s in durable or s not in local:
            results.append(verify_step(storage, s))
        if s in local:
            results.append(verify_local_step(storage, s))
    return results


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
