"""The storage profile: what ``ckptio probe`` measured, in the file ``plan``, ``admit`` and ``simulate`` read.

Owns the profile's JSON form (contract: keys below are read by other tools) and its validation. It must never
measure anything itself (that is :mod:`ckptio.plan.probe`) nor decide anything (that is the budget).

Example (abridged)::

    {"version": 1, "target": "/mnt/pfs/ckpt", "kind": "posix", "fs_type": "lustre",
     "write_bytes_per_s": 2.1e9, "per_writer_bytes_per_s": 6.5e8, "read_bytes_per_s": 3.0e9,
     "metadata_ops_per_s": 4200.0, "fsync_s": 0.004,
     "concurrency": [{"writers": 1, "write_bytes_per_s": 6.5e8}, {"writers": 4, "write_bytes_per_s": 2.1e9}],
     ...}
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ckptio.errors import ConfigError

PROFILE_VERSION = 1


@dataclass(kw_only=True, slots=True)
class ConcurrencyPoint:
    """Throughput measured with a given number of concurrent writers (and readers)."""

    writers: int
    """Concurrent writers (threads of one process, each writing its own files)."""

    write_bytes_per_s: float
    """Aggregate write throughput, each file fsynced before it counts."""

    read_bytes_per_s: float | None = None
    """Aggregate read-back throughput of the same files, when measured at this concurrency."""


@dataclass(kw_only=True, slots=True)
class StorageProfile:
    """Measured behaviour of one storage target, as the planner consumes it."""

    target: str
    """What was probed: a directory or an ``s3://`` URL."""

    kind: Literal["posix", "object"] = "posix"
    """POSIX filesystem (metadata ops limit) or object store (request-rate limit per prefix)."""

    write_bytes_per_s: float
    """Best aggregate write throughput over the concurrency levels probed (the planner's aggregate cap)."""

    per_writer_bytes_per_s: float
    """Throughput of one writer alone (the planner's per-writer cap)."""

    read_bytes_per_s: float
    """Best aggregate read throughput of the written files (restore estimate)."""

    metadata_ops_per_s: float
    """Small-object operations per second over create, rename, stat, list and delete (all ops together)."""

    metadata: dict[str, float] = field(default_factory=dict)
    """Operations per second by kind: ``create``, ``rename``, ``stat``, ``list``, ``delete``."""

    fsync_s: float | None = None
    """Median cost of one fsync of a small freshly written file (POSIX)."""

    serialize_bytes_per_s: float | None = None
    """Rate at which one ckptio writer on the probing host turns tensors into checksummed file bytes."""

    concurrency: list[ConcurrencyPoint] = field(default_factory=list)
    """Throughput against the number of concurrent writers."""

    fs_type: str | None = None
    """Filesystem type from /proc/mounts (nfs, lustre, ext4, tmpfs, …)."""

    free_bytes: float | None = None
    """Free space at the target when probed."""

    file_size_bytes: float | None = None
    """Size of each probe data file (shaped like the job's files)."""

    seconds: float | None = None
    """Wall time the probe took."""

    truncated: bool = False
    """True when the time bound cut a phase short (figures come from fewer bytes than asked)."""

    created: str | None = None
    """ISO-8601 time of the probe."""

    fio: dict[str, float] | None = None
    """fio's figures in the same directory (anchor), when ``--fio`` was given."""

    version: int = PROFILE_VERSION
    """Profile format version."""

    def __post_init__(self) -> None:
        if self.kind not in ("posix", "object"):
            raise ConfigError(f"profile kind must be posix or object, got {self.kind!r}")
        for name in ("write_bytes_per_s", "per_writer_bytes_per_s", "read_bytes_per_s", "metadata_ops_per_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"profile {name} must be a positive number, got {value!r}")
        self.concurrency = [
            p if isinstance(p, ConcurrencyPoint) else ConcurrencyPoint(**p)
            for p in self.concurrency
        ]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | os.PathLike[str]) -> None:
        text = json.dumps(self.to_json(), indent=2) + "\n"
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)

    @classmethod
    def from_json(cls, data: dict[str, Any], *, source: str = "profile") -> StorageProfile:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: a storage profile is a JSON object")
        version = data.get("version", PROFILE_VERSION)
        if version != PROFILE_VERSION:
            raise ConfigError(
                f"{source}: profile version {version} is not supported (expected {PROFILE_VERSION})"
            )
        known = set(cls.__dataclass_fields__)
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise ConfigError(f"{source}: not a storage profile ({exc})") from None
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc.message}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> StorageProfile:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read profile {os.fspath(path)!r}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"profile {os.fspath(path)!r} is not JSON: {exc}") from None
        return cls.from_json(data, source=os.fspath(path))
