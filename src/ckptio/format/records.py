"""The records of the on-storage contract: a rank's index, the manifest, and their checksums.

Plain data with JSON round trips; parsing anything unexpected raises CorruptCheckpointError, and that includes a
record that names a file outside its own step (see :func:`~ckptio.format.keys.check_data_key`): whoever reads a
parsed record may delete or read the keys it lists without re-checking them. No storage access.
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

from ckptio.errors import CorruptCheckpointError
from ckptio.format.blocks import HEX, block_count
from ckptio.format.keys import INDEX_FORMAT, MANIFEST_FORMAT, check_data_key, check_file_name, step_dir
from ckptio.storage.base import Buffer, join_key

DIGEST_PREFIX = "sha256:"
"""The algorithm of :attr:`FileRecord.digest`, as its prefix."""
_DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}\Z")


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
    holders: list[str] = field(default_factory=list)
    """Local level only: the nodes holding a copy of the file, the writing rank's node first (its data lives on
    node-local disks, not under the root)."""
    digest: str = ""
    """Local level only: the file's SHA-256 (``sha256:<hex>``). A copy that crossed the network is checked against
    it, because crc32c catches accidents, not forgeries; it is recorded under the durable root, where a network
    peer cannot write. Empty: none recorded (then no copy from the network is used)."""

    def check(self, *, step: int, path: str = "") -> None:
        """Raise CorruptCheckpointError unless this record is well typed and names a key of ``step``'s own."""
        if not (_is_int(self.size) and self.size >= 0 and isinstance(self.crc32c, str) and isinstance(self.key, str)
                and isinstance(self.digest, str) and (not self.digest or _DIGEST_RE.match(self.digest))
                and isinstance(self.holders, list) and all(isinstance(h, str) for h in self.holders)):
            raise CorruptCheckpointError(f"malformed file record {self.name!r}", step=step, path=path)
        if self.key:
            check_data_key(self.key, self.name, step=step, path=path)
        else:
            check_file_name(self.name, step=step, path=path)


def record_key(step: int, rec: FileRecord) -> str:
    """The key of ``rec``'s bytes under the root: its own key when the manifest records one, else
    ``step-XXXXXXXX/<name>``. It lives beside FileRecord so that keys.py never needs to name a record."""
    return rec.key or join_key(step_dir(step), rec.name)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _check_header(step: Any, world_size: Any, save_id: Any) -> None:
    if not (_is_int(step) and _is_int(world_size) and _is_int(save_id)):
        raise ValueError("step, world_size and save_id must be integers")
    if step < 0 or world_size < 1:
        raise ValueError(f"step {step} / world_size {world_size} out of range")


@dataclass(kw_only=True, slots=True)
class ItemRecord:
    """Where one DCP write item landed (the file, byte offset and length) and the checksums of its blocks.

    The block checksums (:mod:`ckptio.format.blocks`) let a reader verify any range of the item without reading
    its whole file. Records written before them parse with the defaults (no data offset, no blocks): their files
    are verified whole.
    """

    fqn: str
    offset: list[int] | None
    index_hint: int | None
    file: str
    file_offset: int
    length: int
    data_offset: int | None = None
    """Where the tensor's raw bytes start within the item (torch.save's framing precedes them); None for objects
    and for tensors whose framing the writer did not produce itself."""
    data_length: int = 0
    """How many raw tensor bytes follow ``data_offset``."""
    block_size: int = 0
    """Size of the checksum blocks in ``crc32c``; 0 when the item has none (records before block checksums)."""
    crc32c: str = ""
    """crc32c of each ``block_size`` block of the checked bytes (the raw tensor bytes when ``data_offset`` is
    set, else the whole item), 8 hex digits each, concatenated."""

    def checked_span(self) -> tuple[int, int]:
        """(offset within the item, length) of the bytes the block checksums cover."""
        if self.data_offset is None:
            return 0, self.length
        return self.data_offset, self.data_length

    def has_blocks(self) -> bool:
        return self.block_size > 0

    def check(self, *, step: int, path: str = "") -> None:
        """Raise CorruptCheckpointError unless the record is well typed and its checked bytes lie in the item."""
        ints = (self.file_offset, self.length, self.data_length, self.block_size)
        ok = all(_is_int(v) and v >= 0 for v in ints) and isinstance(self.crc32c, str)
        if ok and self.data_offset is not None:
            ok = _is_int(self.data_offset) and 0 <= self.data_offset <= self.length - self.data_length
        if ok and self.block_size:
            nbytes = self.checked_span()[1]
            ok = len(self.crc32c) == HEX * block_count(nbytes, self.block_size) and _is_hex(self.crc32c)
        if not ok:
            raise CorruptCheckpointError(f"malformed item record {self.fqn!r}", step=step, path=path)


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
            index = cls(**d)
            _check_header(index.step, index.world_size, index.save_id)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CorruptCheckpointError(f"unreadable rank index: {exc}", path=key) from exc
        for rec in index.files:
            rec.check(step=index.step, path=key)
        for item in index.items:
            check_file_name(item.file, step=index.step, path=key)
            item.check(step=index.step, path=key)
        return index


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
            manifest = cls(**d)
            _check_header(manifest.step, manifest.world_size, manifest.save_id)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CorruptCheckpointError(f"unreadable manifest: {exc}", path=key) from exc
        for name, rec in manifest.files.items():
            # Readers look files up by the dict key and checkers used to read rec.name: they must be one name.
            if name != rec.name:
                raise CorruptCheckpointError(f"manifest entry {name!r} describes {rec.name!r}",
                                             step=manifest.step, path=key)
            rec.check(step=manifest.step, path=key)
        return manifest


def versions() -> dict[str, str]:
    import torch

    from ckptio._version import __version__

    return {"ckptio": __version__, "torch": torch.__version__, "python": platform.python_version()}
