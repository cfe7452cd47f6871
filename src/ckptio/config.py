"""Configuration of a :class:`~ckptio.Checkpointer`: one kw-only dataclass, validated on construction.

The CLI and the keyword form of ``Checkpointer(...)`` both build this object; nothing else reads options.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from ckptio.errors import ConfigError

if TYPE_CHECKING:
    from ckptio.policy.residency import Residency
    from ckptio.storage.base import Storage


@dataclass(kw_only=True, slots=True)
class CheckpointerConfig:
    root: str | os.PathLike[str] | Storage
    """Durable tier: a POSIX path, ``s3://bucket/prefix``, or a :class:`~ckptio.storage.Storage`."""

    local_dir: str | os.PathLike[str] | Storage | None = None
    """Optional local tier (NVMe or RAM path). The writer lands each step here first and frees the staging slot
    before uploading; restore prefers it when its checksums match."""

    local_capacity_bytes: int | None = None
    """Byte budget of the local tier; older local steps are evicted to fit, and a step that cannot fit raises
    :class:`~ckptio.errors.StorageFullError` for that save (training goes on)."""

    max_pending: int = 1
    """Staged snapshots held at once (staging slots). This is the memory bound: host memory for staging is
    ``max_pending`` × state bytes, allocated on first save and reused."""

    overflow: Literal["block", "skip"] = "block"
    """What ``save()`` does when no staging slot is free on some rank: wait for one, or drop this save.
    All ranks take the same decision."""

    keep_last: int = 3
    """Committed steps kept on the durable tier (0 keeps all). The newest committed step is never deleted."""

    every_steps: int | None = None
    """``maybe_save`` saves when ``step`` is a multiple of this."""

    every_seconds: float | None = None
    """``maybe_save`` saves when this many seconds passed since the last save (agreed across ranks)."""

    file_size_bytes: int = 1 << 30
    """Target size of one data file: small tensors are coalesced into files up to this size; a tensor larger than
    this is split into row chunks (DCP chunks) so no file is much larger."""

    upload_concurrency: int = 4
    """Concurrent uploads per writer (files to the durable tier, parts of one object on S3)."""

    commit_timeout_s: float = 600.0
    """How long rank 0's committer waits for every rank's index before the step fails."""

    fsync: bool = True
    """fsync data, index and manifest on POSIX tiers. Off only for RAM tiers and tests."""

    residency: Residency | None = None
    """Where checkpoints may be written (region allow-list, public buckets). Checked before any byte is written
    and again every ``residency_recheck_s``."""

    residency_recheck_s: float = 300.0
    """How often the writer repeats the residency check during a run."""

    volume_check: Literal["off", "warn", "error"] = "warn"
    """At start, check the root against $HOME and ``data_dirs`` (same device, home directory)."""

    data_dirs: tuple[str, ...] = ()
    """Directories the data loader reads; a root on the same volume is reported by ``volume_check``."""

    events_path: str | None = None
    """JSONL event log (one file per rank: ``{rank}`` in the path is replaced, else ``.rank{N}`` is appended)."""

    metrics_registry: Any = None
    """A ``prometheus_client.CollectorRegistry``; None uses the default registry."""

    metrics_port: int | None = None
    """Serve Prometheus metrics over HTTP on this port (rank 0 only, 127.0.0.1 unless ``metrics_host``)."""

    metrics_host: str = "127.0.0.1"
    """Bind address of the metrics exporter."""

    start_writer: Literal["on_init", "on_first_save"] = "on_init"
    """When the writer process boots (an interpreter importing torch: seconds). ``on_init`` overlaps the boot with
    the first training steps; ``on_first_save`` spares restore-only users the boot."""

    writer_nice: int = 10
    """CPU niceness added to the writer processes (0 keeps the trainer's), and their I/O runs at the lowest
    best-effort priority: on hosts with few spare cores the flush yields to training instead of inflating steps.
    A flush that falls behind is then bounded by ``max_pending``/``overflow``, never by memory."""

    lease_s: float = 60.0
    """Ownership lease of the root: another job may not use it while this job's heartbeat is younger than this
    (on the same host a dead owner process frees it at once). 0 disables the ownership check."""

    job_id: str | None = None
    """Names this job in the owner record; a restarted job with the same id takes its root over at once."""

    storage_options: dict[str, Any] = field(default_factory=dict)
    """Extra keyword options for the durable storage (S3: ``endpoint_url``, ``region``, ``part_size``, …)."""

    def writer_config(self) -> WriterConfig:
        """The part of this config the writer process reads (same field names: a projection, never a copy)."""
        return WriterConfig(**{f.name: getattr(self, f.name) for f in fields(WriterConfig)})

    def __post_init__(self) -> None:
        problems = [
            (self.max_pending < 1, f"max_pending must be >= 1, got {self.max_pending}"),
            (self.overflow not in ("block", "skip"), f"overflow must be 'block' or 'skip', got {self.overflow!r}"),
            (self.keep_last < 0, f"keep_last must be >= 0, got {self.keep_last}"),
            (self.every_steps is not None and self.every_steps < 1,
             f"every_steps must be >= 1, got {self.every_steps}"),
            (self.every_seconds is not None and self.every_seconds <= 0,
             f"every_seconds must be > 0, got {self.every_seconds}"),
            (self.file_size_bytes < 1 << 20, f"file_size_bytes must be at least 1 MiB, got {self.file_size_bytes}"),
            (self.upload_concurrency < 1, f"upload_concurrency must be >= 1, got {self.upload_concurrency}"),
            (self.commit_timeout_s <= 0, f"commit_timeout_s must be > 0, got {self.commit_timeout_s}"),
            (self.start_writer not in ("on_init", "on_first_save"),
             f"start_writer must be on_init or on_first_save, got {self.start_writer!r}"),
            (self.lease_s < 0, f"lease_s must be >= 0, got {self.lease_s}"),
            (not 0 <= self.writer_nice <= 19, f"writer_nice must be within 0..19, got {self.writer_nice}"),
            (self.volume_check not in ("off", "warn", "error"),
             f"volume_check must be off, warn or error, got {self.volume_check!r}"),
            (self.local_capacity_bytes is not None and self.local_capacity_bytes <= 0,
             "local_capacity_bytes must be positive"),
            (isinstance(self.root, str) and not self.root, "root must not be empty"),
        ]
        for bad, message in problems:
            if bad:
                raise ConfigError(message)
        self.data_dirs = tuple(os.fspath(d) for d in self.data_dirs)


@dataclass(frozen=True, kw_only=True, slots=True)
class WriterConfig:
    """What a writer process reads of :class:`CheckpointerConfig`, pickled to it once at start.

    Built only by :meth:`CheckpointerConfig.writer_config`; every field has the name (and meaning) of the
    ``CheckpointerConfig`` field it comes from, which is validated there.
    """

    keep_last: int
    """Committed steps kept on the durable tier (0 keeps all); rank 0's committer applies it after each commit."""

    upload_concurrency: int
    """Threads that serialize, write and upload files of one save."""

    commit_timeout_s: float
    """How long a committer (rank 0) or watcher (other ranks) waits for a step to commit before it fails."""

    residency: Residency | None
    """Where checkpoints may be written; the writer re-checks it every ``residency_recheck_s``."""

    residency_recheck_s: float
    """Seconds between the writer's residency checks."""

    local_capacity_bytes: int | None
    """Byte budget of the local tier (None: whatever the filesystem holds)."""

    writer_nice: int
    """CPU niceness the writer adds to itself; its I/O goes to the lowest best-effort class when > 0."""
