"""The storage profile: what ``ckptio probe`` measured, in the file ``plan``, ``admit`` and ``simulate`` read.

Owns the profile's JSON form (contract: keys below are read by other tools) and its validation. It must never
measure anything itself (that is :mod:`ckptio.plan.measure.probe`) nor decide anything (that is the budget).

Example (abridged)::

    {"version": 1, "target": "/mnt/pfs/ckpt", "kind": "posix", "fs_type": "lustre",
     "write_bytes_per_s": 2.1e9, "per_writer_bytes_per_s": 6.5e8, "read_bytes_per_s": 3.0e9,
     "metadata_ops_per_s": 4200.0, "fsync_s": 0.004,
     "concurrency": [{"writers": 1, "write_bytes_per_s": 6.5e8}, {"writers": 4, "write_bytes_per_s": 2.1e9}],
     ...}
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ckptio.errors import ConfigError

PROFILE_VERSION = 1
# A profile is a few KiB; anything far larger is the wrong file, and is refused before it is parsed.
_MAX_PROFILE_BYTES = 16 << 20
_MAX_POINTS = 1024


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
    """Small-object operations per second over the kinds of ``metadata`` but fsync (all ops together)."""

    metadata: dict[str, float] = field(default_factory=dict)
    """Operations per second by kind, those a commit makes: ``create``, ``stat``, ``rename``, ``list``, ``fsync``,
    ``unlink`` (:mod:`ckptio.plan.measure.probe_metadata`; an object store has no rename or fsync). Profiles from
    before named unlink ``delete``."""

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
        if not isinstance(self.target, str):
            raise ConfigError(f"profile target must be a string, got {type(self.target).__name__}")
        if self.kind not in ("posix", "object"):
            raise ConfigError(f"profile kind must be posix or object, got {self.kind!r}")
        for name in ("write_bytes_per_s", "per_writer_bytes_per_s", "read_bytes_per_s", "metadata_ops_per_s"):
            setattr(self, name, _number(getattr(self, name), name, positive=True))
        for name in ("fsync_s", "free_bytes", "seconds"):
            if getattr(self, name) is not None:
                setattr(self, name, _number(getattr(self, name), name, positive=False))
        for name in ("serialize_bytes_per_s", "file_size_bytes"):
            if getattr(self, name) is not None:
                setattr(self, name, _number(getattr(self, name), name, positive=True))
        self.metadata = _rates(self.metadata, "metadata")
        if self.fio is not None:
            self.fio = _rates(self.fio, "fio")
        for name in ("fs_type", "created"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), str):
                raise ConfigError(f"profile {name} must be a string, got {type(getattr(self, name)).__name__}")
        if not isinstance(self.truncated, bool):
            raise ConfigError(f"profile truncated must be true or false, got {self.truncated!r}")
        if not isinstance(self.concurrency, list) or len(self.concurrency) > _MAX_POINTS:
            raise ConfigError(f"profile concurrency must be a list of at most {_MAX_POINTS} points")
        self.concurrency = [_point(p) for p in self.concurrency]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the profile atomically (temp file, then rename); a path that cannot take it is a ConfigError."""
        text = json.dumps(self.to_json(), indent=2) + "\n"
        name = os.fspath(path)
        tmp = f"{name}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise ConfigError(f"cannot write the profile to {name!r}: {exc.strerror or exc}", path=name) from None

    @classmethod
    def from_json(cls, data: dict[str, Any], *, source: str = "profile") -> StorageProfile:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: a storage profile is a JSON object")
        version = data.get("version", PROFILE_VERSION)
        if isinstance(version, bool) or version != PROFILE_VERSION:
            raise ConfigError(
                f"{source}: profile version {_short(version)} is not supported (expected {PROFILE_VERSION})"
            )
        known = set(cls.__dataclass_fields__)
        missing = sorted(k for k in ("target", "write_bytes_per_s", "per_writer_bytes_per_s", "read_bytes_per_s",
                                     "metadata_ops_per_s") if k not in data)
        if missing:
            raise ConfigError(f"{source}: not a storage profile (missing {', '.join(missing)})")
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise ConfigError(f"{source}: not a storage profile ({exc})") from None
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc.message}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> StorageProfile:
        """The profile in the file at ``path``; anything that is not one is a ConfigError naming the file."""
        name = os.fspath(path)
        try:
            with open(path, "rb") as f:
                raw = f.read(_MAX_PROFILE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read profile {name!r}: {exc.strerror or exc}", path=name) from None
        if len(raw) > _MAX_PROFILE_BYTES:
            raise ConfigError(f"profile {name!r} is over {_MAX_PROFILE_BYTES >> 20} MiB: not a storage profile",
                              path=name)
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"profile {name!r} is not text (UTF-8 JSON): is it the right file?", path=name) from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"profile {name!r} is not JSON: {exc}", path=name) from None
        except (RecursionError, ValueError) as exc:  # nesting too deep; an integer too long to convert
            raise ConfigError(f"profile {name!r} is not a storage profile: {exc}", path=name) from None
        return cls.from_json(data, source=name)


def _number(value: Any, name: str, *, positive: bool) -> float:
    """``value`` as a finite float (> 0 when ``positive``, else >= 0), or ConfigError naming the field."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    try:
        number = float(value) if ok else math.nan
    except OverflowError:  # an integer with hundreds of digits
        number = math.inf
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        bound = "a positive number" if positive else "a number >= 0"
        raise ConfigError(f"profile {name} must be {bound}, got {_short(value)}")
    return number


def _rates(value: Any, name: str) -> dict[str, float]:
    if not isinstance(value, dict) or len(value) > _MAX_POINTS:
        raise ConfigError(f"profile {name} must be an object of at most {_MAX_POINTS} numbers")
    return {str(k): _number(v, f"{name}.{k}", positive=False) for k, v in value.items()}


def _point(value: Any) -> ConcurrencyPoint:
    if isinstance(value, ConcurrencyPoint):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"profile concurrency points are objects, got {_short(value)}")
    writers = value.get("writers")
    if not isinstance(writers, int) or isinstance(writers, bool) or writers < 1:
        raise ConfigError(f"profile concurrency writers must be an integer >= 1, got {_short(writers)}")
    read = value.get("read_bytes_per_s")
    return ConcurrencyPoint(
        writers=writers,
        write_bytes_per_s=_number(value.get("write_bytes_per_s"), "concurrency write_bytes_per_s", positive=True),
        read_bytes_per_s=None if read is None else _number(read, "concurrency read_bytes_per_s", positive=True),
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."
