"""Verification: re-read a committed step and hold every file to its manifest record."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ckptio.errors import CheckpointNotFoundError, ChecksumError, CorruptCheckpointError, StorageError
from ckptio.format.commit import read_manifest
from ckptio.format.keys import METADATA, record_key, step_dir
from ckptio.format.records import FileRecord, checksum
from ckptio.storage.base import Storage, join_key


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
