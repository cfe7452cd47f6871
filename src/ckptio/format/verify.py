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

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ckptio.errors import CheckpointNotFoundError, ChecksumError, CorruptCheckpointError, StorageError
from ckptio.format.blocks import crc32c
from ckptio.format.commit import all_step_dirs, committed_steps, read_manifest
from ckptio.format.crosscheck import index_findings, metadata_problems
from ckptio.format.keys import FAILED_DIR, MANIFEST, METADATA, RANKS_DIR, hash_prefix_enabled, step_dir
from ckptio.format.local_level_records import LEVELS_LOCAL, holder_nodes, local_records
from ckptio.format.plain_dcp import is_plain_dcp, plain_manifest
from ckptio.format.records import FileRecord, Manifest, RankIndex, checksum, record_key
from ckptio.format.safe_pickle import load_metadata
from ckptio.format.torchsave import zip_crc_problem
from ckptio.storage.base import HASHED_DIR_PREFIX, ReadStore, Storage, join_key

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
    level: Literal["durable", "local", "dcp"] = "durable"
    """The level whose records were verified (``dcp``: a plain DCP checkpoint in the durable root, no manifest)."""
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
    indexes = _read_indexes(storage, join_key(step_dir(step), RANKS_DIR), warnings)
    index_problems, index_warnings = index_findings(metadata, manifest, indexes)
    problems += index_problems
    warnings += index_warnings + _orphans(storage, manifest, "not in the manifest")
    return VerifyResult(step=step, ok=not problems, files=len(manifest.files), bytes=total, problems=problems,
                        warnings=warnings)


_PIECE = 16 << 20
"""A file is checked in pieces of this size: verifying a step costs one piece of memory, whatever its files' sizes."""


def _file_problem(storage: Storage, key: str, rec: FileRecord) -> tuple[str | None, int]:
    """Why the object at ``key`` is not the file ``rec`` describes (its size first, from ``head``: a record's claim
    is never read into memory), or None; and how many bytes were read."""
    size = storage.head(key).size
    if size != rec.size:
        return f"{key}: size {size} != manifest {rec.size} ({rec.name})", 0
    piece, value, done = memoryview(bytearray(min(_PIECE, max(size, 1)))), 0, 0
    while done < size:
        got = storage.readinto(key, piece[: min(_PIECE, size - done)], offset=done)
        if got == 0:
            return f"{key}: ended at {done} of {size} bytes ({rec.name})", done
        value, done = crc32c(piece[:got], value), done + got
    if f"{value:08x}" != rec.crc32c:
        return f"{key}: checksum {value:08x} != manifest {rec.crc32c} ({rec.name})", done
    return None, done


def _check_files(storage: Storage, manifest: Manifest) -> tuple[list[str], int]:
    problems: list[str] = []
    total = 0
    for _name, rec in sorted(manifest.files.items()):
        key = record_key(manifest.step, rec)  # read_manifest checked that rec.name == name and the key is the step's
        try:
            problem, read = _file_problem(storage, key, rec)
        except StorageError as exc:
            problems.append(f"{key}: missing or unreadable ({exc})")
            continue
        total += read
        if problem:
            problems.append(problem)
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


def _read_indexes(storage: Storage, ranks_dir: str, warnings: list[str]) -> dict[int, RankIndex]:
    """The readable rank indexes under ``ranks_dir``, by rank; an unreadable or misfiled one is a warning."""
    indexes: dict[int, RankIndex] = {}
    prefix = ranks_dir + "/"
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


def _orphans(storage: Storage, manifest: Manifest, why: str) -> list[str]:
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
            out.append(f"{key}: orphaned ({why})")
    return out


def verify_local_step(durable: Storage, step: int) -> VerifyResult:
    """Verify the records of a step committed on the local level: its manifest, ``.metadata`` and rank indexes
    under ``levels/local/`` of the durable root, their cross-checks, and where each file is held. The data files
    are not read (they are on node-local disks); ``notes`` says so. Findings name keys from the durable root."""
    records = local_records(durable)
    try:
        manifest = read_manifest(records, step)
    except CheckpointNotFoundError:
        return VerifyResult(step=step, level="local", ok=False, files=0, bytes=0,
                            problems=[f"no committed local-level checkpoint for step {step}"])
    except (CorruptCheckpointError, StorageError) as exc:
        return VerifyResult(step=step, level="local", ok=False, files=0, bytes=0, problems=[str(exc)])
    durable_too = _same_save(durable, manifest)
    problems = [f"{name}: no node holds it, and the save did not go to the durable level"
                for name, rec in sorted(manifest.files.items()) if not rec.holders and not durable_too]
    warnings: list[str] = []
    metadata = _check_metadata(records, manifest, join_key(step_dir(step), METADATA), problems, warnings)
    indexes = _read_indexes(records, join_key(step_dir(step), RANKS_DIR), warnings)
    index_problems, index_warnings = index_findings(metadata, manifest, indexes)
    problems += index_problems
    warnings += (index_warnings + _holder_findings(manifest, indexes)
                 + _orphans(records, manifest, "not a record of the local level"))
    nodes = holder_nodes(manifest)
    notes = [f"data not read: its {len(manifest.files)} files ({manifest.total_bytes:,} bytes) live on node-local "
             f"disks ({', '.join(nodes) or 'no node'}), which this command cannot reach; a restore checks each "
             "copy's checksum before using it"]
    if durable_too:
        notes.append("this save also went to the durable level")
    return VerifyResult(step=step, level="local", ok=not problems, files=len(manifest.files),
                        bytes=manifest.total_bytes, problems=_from_root(problems), warnings=_from_root(warnings),
                        notes=notes)


def _same_save(durable: Storage, manifest: Manifest) -> bool:
    try:
        return read_manifest(durable, manifest.step).save_id == manifest.save_id
    except (CheckpointNotFoundError, CorruptCheckpointError, StorageError):
        return False


def _from_root(findings: list[str]) -> list[str]:
    """Findings about the local level's records, keyed from the durable root (``levels/local/step-…``)."""
    return [f"{LEVELS_LOCAL}/{f}" if f.startswith("step-") else f for f in findings]


def _holder_findings(manifest: Manifest, indexes: dict[int, RankIndex]) -> list[str]:
    """Warnings where a current rank index and the manifest disagree on which nodes hold its files."""
    out = []
    for rank, index in sorted(indexes.items()):
        if index.save_id != manifest.save_id:
            continue  # index_findings already warns about another attempt's index
        for rec in index.files:
            listed = manifest.files.get(rec.name)
            if listed is not None and listed.holders != rec.holders:
                out.append(f"ranks/{rank}.json: holders {rec.holders} of {rec.name} differ from the manifest's "
                           f"{listed.holders}")
    return out


def verify_levels(storage: Storage, step: int | None = None) -> list[VerifyResult]:
    """Verify ``step`` (None: every committed step) on each level it is committed on, durable first, in step
    order. A step committed on no level gets the durable result, which says that it is not committed."""
    durable, local = set(committed_steps(storage)), set(committed_steps(local_records(storage)))
    plain = {s for s in all_step_dirs(storage) if s not in durable and (step is None or s == step)
             and is_plain_dcp(storage, s)}
    results = []
    for s in [step] if step is not None else sorted(durable | local | plain):
        if s in plain:
            results.append(verify_plain_step(storage, s))
        elif s in durable or s not in local:
            results.append(verify_step(storage, s))
        if s in local:
            results.append(verify_local_step(storage, s))
    return results


_PLAIN_NOTE = ("a plain DCP checkpoint (no ckptio manifest; dcp.save wrote it): DCP records no checksums, so what was "
               "checked is that every file .metadata names is present and holds its items, and each item against the "
               "zip CRC-32s torch.save keeps inside it (decoded first when a stream extension stored it)")


def verify_plain_step(storage: Storage, step: int) -> VerifyResult:
    """A plain DCP checkpoint in ``step``'s directory (:mod:`ckptio.format.plain_dcp`), checked with what DCP and
    torch.save record: ``.metadata`` (restricted unpickler), the files it names (present, large enough) and each
    item's zip CRC-32s. Each item is read on its own: memory is the largest item."""
    prefix = step_dir(step)
    key = join_key(prefix, METADATA)
    try:
        metadata = load_metadata(storage.get(key), path=key)
        manifest = plain_manifest(storage, prefix, step, metadata)
    except (CorruptCheckpointError, StorageError) as exc:
        return VerifyResult(step=step, level="dcp", ok=False, files=0, bytes=0, problems=[str(exc)],
                            notes=[_PLAIN_NOTE])
    problems = [f"{key}: {p}" for p in metadata_problems(metadata, manifest)]
    for idx, info in ([] if problems else metadata.storage_data.items()):
        problem = _plain_item_problem(storage, manifest.files[info.relative_path].key, info)
        if problem:
            problems.append(f"{join_key(prefix, info.relative_path)}: item {getattr(idx, 'fqn', idx)!r}: {problem}")
    return VerifyResult(step=step, level="dcp", ok=not problems, files=len(manifest.files),
                        bytes=manifest.total_bytes, problems=problems, notes=[_PLAIN_NOTE])


def _plain_item_problem(storage: Storage, key: str, info: Any) -> str | None:
    buf = bytearray(info.length)
    if storage.readinto(key, buf, offset=info.offset) != info.length:
        return "shorter than .metadata says"
    blob: bytes | bytearray = buf
    descriptors = list(getattr(info, "transform_descriptors", None) or ())
    if descriptors:
        import io

        from torch.distributed.checkpoint._extension import ExtensionRegistry, StreamTransformExtension

        try:
            stream: Any = io.BytesIO(buf)
            for ext in ExtensionRegistry().from_descriptor_list(descriptors):
                if isinstance(ext, StreamTransformExtension):
                    stream = ext.transform_from(stream)
            blob = stream.read()
        except Exception as exc:  # an unknown extension (ValueError) or a stream that does not decode
            return f"stored through {descriptors}, not decodable here ({type(exc).__name__}: {exc})"
    return zip_crc_problem(blob)


def check_file(storage: ReadStore, step: int, name: str, data: bytes, rec: FileRecord) -> None:
    """Raise ChecksumError when ``data`` (a file read for restore) does not match its manifest record."""
    if len(data) != rec.size or checksum([data]) != rec.crc32c:
        raise ChecksumError(
            f"{name}: expected {rec.size} bytes crc32c {rec.crc32c}, read {len(data)} bytes crc32c "
            f"{checksum([data])}",
            root=storage.url,
            step=step,
            path=join_key(step_dir(step), name),
        )
