"""The records of the on-storage contract: a rank's index, the manifest, and their checksums.

Plain data with JSON round trips; parsing anything unexpected raises CorruptCheckpointError. No storage access.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import crc32c

from ckptio.errors import CorruptCheckpointError
from ckptio.format.keys import INDEX_FORMAT, MANIFEST_FORMAT
from ckptio.storage.base import Buffer


def checksum(buffers: Iterable[Buffer]) -> str:
    value = 0
    for b in buffers:
        value = crc32c.crc32c(b, value)
    return f"{value:08x}"


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
