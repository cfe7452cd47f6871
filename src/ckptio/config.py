"""Configuration of a :class:`~ckptio.Checkpointer`: one kw-only dataclass, validated on construction.

The CLI and the keyword form of ``Checkpointer(...)`` both build this object; nothing else reads options. An
unknown option name, a missing ``root`` or a value of the wrong type is a :class:`~ckptio.errors.ConfigError`
naming the option (and, for a misspelling, the closest valid name), never a bare ``TypeError``: the checks are
:mod:`ckptio._option_checks`; the range checks are ``CheckpointerConfig.__post_init__``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from ckptio._finite import reject_non_finite
from ckptio._option_checks import check_option_types, keyword_options_only
from ckptio._pace_option import MAX_PACE_BYTES_PER_S, MIN_PACE_BYTES_PER_S, check_flush_pace, check_pace_fraction
from ckptio._wait import MAX_TIMEOUT_S
from ckptio.errors import ConfigError

if TYPE_CHECKING:

    from ckptio.policy.residency import Residency
    from ckptio.storage.base import Storage

class CheckpointerOptions(TypedDict, total=False):
    """The keyword options of ``Checkpointer(root, **options)``: :class:`CheckpointerConfig`'s fields but ``root``,
    spelled out so that a type checker checks the keyword call (a test keeps the two in step)."""

    local_dir: str | os.PathLike[str] | Storage | None
    local_capacity_bytes: int | None
    max_pending: int
    staging_dir: str | os.PathLike[str] | None
    overflow: Literal["block", "skip"]
    staging: Literal["async", "sync"]
    keep_last: int
    every_steps: int | None
    every_seconds: float | None
    file_size_bytes: int
    upload_concurrency: int
    commit_timeout_s: float
    fsync: bool
    residency: Residency | None
    residency_recheck_s: float
    commit: Literal["conditional", "lease"]
    allow_public: bool
    store_private: bool
    volume_check: Literal["off", "warn", "error"]
    data_dirs: tuple[str, ...] | list[str]
    events_path: str | None
    metrics_registry: Any
    metrics_port: int | None
    metrics_host: str
    start_writer: Literal["on_init", "on_first_save"]
    writer_nice: int
    lease_s: float
    job_id: str | None
    close_timeout_s: float
    storage_options: dict[str, Any]
    trust_pickles: bool
    safe_globals: tuple[Any, ...] | list[Any]
    durable_every: int
    replicas: int
    node_id: str | None
    preempt_grace_s: float
    preempt_duplicate_window_s: float
    partner_timeout_s: float
    flush_pace: float | Literal["auto"] | None
    flush_pace_fraction: float
    flush_pace_local: bool
    partner_pace: float | None


WRITER_NICE_ENV = "CKPTIO_WRITER_NICE"
"""Overrides ``writer_nice``'s default (an explicit ``writer_nice`` still wins)."""


def _writer_nice_default() -> int:
    """``CKPTIO_WRITER_NICE`` as an int in 0..19, else 10; a value that is not one is a ConfigError naming it
    (a typo in a site's environment must not silently run every writer at full priority)."""
    raw = os.environ.get(WRITER_NICE_ENV)
    if raw is None or raw.strip() == "":
        return 10
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{WRITER_NICE_ENV} must be an integer within 0..19, got {raw!r}") from None
    if not 0 <= value <= 19:
        raise ConfigError(f"{WRITER_NICE_ENV} must be within 0..19, got {value}")
    return value


@keyword_options_only
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

    staging_dir: str | os.PathLike[str] | None = None
    """Directory of the staging slots (None: ``/dev/shm``, the temp dir where there is none). Each rank needs
    ``max_pending`` × its state bytes there; the first save checks that they fit and raises
    :class:`~ckptio.errors.StorageFullError` with the fixes when they do not. A tmpfs keeps staging in RAM; a local
    disk works too (the page cache absorbs the copy) but a slow one slows ``save()``."""

    overflow: Literal["block", "skip"] = "block"
    """What ``save()`` does when this rank's staging slots are all busy: ``block`` waits for this rank's own slot;
    ``skip`` gives the save up. Every rank ends with the same outcome, without a collective per save: a rank that
    skips leaves a drop marker, and every other rank's save of that step completes as dropped (``handle.skipped``
    and ``handle.dropped``, a ``save_skipped`` event, the skipped-saves metric) instead of committing."""

    staging: Literal["async", "sync"] = "async"
    """``async``: ``save()`` launches the copy into the staging slot and returns; a staging thread (CPU) or a side
    CUDA stream (GPU) copies meanwhile. The state must not be mutated until the copy is done: use
    ``Checkpointer.guard(optimizer, model)``, or call ``wait_staged()`` before mutating. ``sync``: the copy runs
    inside ``save()`` on the training thread (the state may be mutated as soon as it returns)."""

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

    commit: Literal["conditional", "lease"] = "conditional"
    """How a step is committed. ``"conditional"``: the manifest is written create-only and ``latest`` moves by
    compare-and-swap; a store that does not honour these conditional writes is refused at construction with
    :class:`~ckptio.errors.StoreCapabilityError`. ``"lease"``: an explicit opt-in for such stores, relying on the
    ownership lease (``lease_s`` > 0) and a read-after-write check of the manifest; it no longer guarantees that
    of two racing committers exactly one wins (docs/s3.md, "Lease mode")."""

    allow_public: bool = False
    """Allow a public bucket (by policy or ACL). Off by default, with or without ``residency``: an ``s3://`` root
    whose bucket is public is refused before anything is written."""

    store_private: bool = False
    """Declare the store private where it has no API to say so (no public-access block, policy status or ACL
    API: s3rver, most on-prem gateways). Without it such a store is refused with
    :class:`~ckptio.errors.StoreCapabilityError`; a store whose API says it is public is refused either way."""

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

    writer_nice: int = field(default_factory=_writer_nice_default)
    """CPU niceness added to the writer processes (0 keeps the trainer's), and their I/O runs at the lowest
    best-effort priority: on hosts with few spare cores the flush yields to training instead of inflating steps.
    A flush that falls behind is then bounded by ``max_pending``/``overflow``, never by memory. Default 10, or
    ``CKPTIO_WRITER_NICE`` where set: a site (or a test session that packs many jobs on few cores, where a nice-10
    writer waits behind every other job's busy processes) sets it once for every job."""

    lease_s: float = 60.0
    """Ownership lease of the root: another job may not use it while this job's heartbeat is younger than this
    (on the same host a dead owner process frees it at once). 0 disables the ownership check."""

    job_id: str | None = None
    """Names this job in the owner record; a restarted job with the same id takes its root over at once."""

    close_timeout_s: float = 1800.0
    """How long ``close()`` waits for pending saves (and a save for an earlier save of the same step) before it
    kills the writer and raises :class:`~ckptio.errors.CommitError` naming the steps that never committed. A stuck
    or stopped writer never makes ``close()`` hang. ``close(timeout=...)`` overrides it for one call."""

    storage_options: dict[str, Any] = field(default_factory=dict)
    """Extra keyword options for the durable storage (S3: ``endpoint_url``, ``region``, ``part_size``, …)."""

    trust_pickles: bool = False
    """Let restore unpickle ``.metadata`` and non-tensor values without an allowlist. Anyone who can write to the
    root can then run code in every process that restores from it: only for roots that only trusted writers
    reach (docs/security.md). Off: ``.metadata`` admits DCP's metadata classes only, and values load with
    ``torch.load(weights_only=True)`` plus ``safe_globals``; anything else is UntrustedCheckpointError."""

    safe_globals: tuple[Any, ...] | list[Any] = ()
    """Classes and functions (the objects, or ``(obj, "module.name")`` pairs) that non-tensor values may reference
    on restore, on top of what ``torch.load(weights_only=True)`` admits: ``torch.serialization.safe_globals``
    semantics. Each one is code that a writer of the store may call with arguments it chooses. A list is stored as
    a tuple."""

    durable_every: int = 1
    """Two levels: with k > 1 every ``save`` is a local-level save (this node's ``local_dir`` plus copies on
    ``replicas`` partner nodes, committed with its own manifest) and every k-th call of ``save`` (counted per
    Checkpointer, the first at the k-th; skipped saves count too, so every rank agrees) also goes to the durable
    root. Needs ``local_dir``. 1: every save is durable, as without levels (``replicas`` is then unused)."""

    replicas: int = 1
    """Partner nodes that receive a copy of each rank's local-level files (the same local rank on the next
    ``replicas`` nodes). 0 keeps local-level saves on their own node only (a node loss then loses them)."""

    node_id: str | None = None
    """This rank's node, for placing partner copies on other nodes. None: the host name (plus torchrun's
    ``GROUP_RANK`` when set). Tests place "nodes" on one machine with it."""

    preempt_grace_s: float = 30.0
    """Two levels only: a SIGTERM makes the next ``maybe_save`` an emergency local-level save (waited for at most
    this long from the signal), then the process exits cleanly (``SystemExit(0)``); 0 leaves SIGTERM alone.
    ``emergency_save`` waits at most this long too."""

    preempt_duplicate_window_s: float = 2.0
    """Two levels only: a SIGTERM within this many seconds of the first is the same preemption delivered twice
    (Slurm signals every process of the step and ``torchrun`` forwards what it got) and is absorbed; a later one
    ends the process as SIGTERM would, as does the grace period running out (docs/preemption.md)."""

    partner_timeout_s: float = 30.0
    """A partner that does not take a copy within this long is unreachable for that save (the save commits on the
    local level without it, and it is skipped for this long); restores give up on a partner's copy after this long
    too."""

    flush_pace: float | Literal["auto"] | None = None
    """Spread each save's durable write over the time until the next save, so the store and its other users (the
    data loader, other jobs) never take a whole job's checkpoint at full speed at once. None: as fast as the store
    takes it. A number: bytes per second for the whole node, shared evenly by its ranks (1 B/s to 1e15 B/s, as
    ``--flush-pace``). ``"auto"``: finish each flush within ``flush_pace_fraction`` of the measured time between
    saves. A flush goes to full speed when the next save arrives, on an emergency save and in ``close()``; pacing
    never changes what commits (engine.trainer.pace_rule)."""

    flush_pace_fraction: float = 0.5
    """With ``flush_pace="auto"``: the share of the time between saves each flush may take (0.01 <= f <= 1, as
    ``--flush-pace-fraction``: ``ckptio._pace_option``)."""

    flush_pace_local: bool = False
    """Pace the local tier's write too (off by default: it holds the staging slot, and the durable store is what
    other tenants share). Partner copies have their own pace: ``partner_pace``."""

    partner_pace: float | None = None
    """Bytes per second for the node's partner copies, shared evenly by its ranks, so the copies leave the fabric to
    the training's collectives (in the cluster lab an unpaced copy slows the all-reduce that shares the NIC). None: as
    fast as the link takes them. A copy is never paced below the partner's minimum transfer rate (it would miss the
    partner's deadline), and goes to full speed like a paced flush: when the next save arrives, on an emergency save
    and in ``close()`` (engine.partner.client)."""

    def writer_config(self) -> WriterConfig:
        """The part of this config the writer process reads (same field names: a projection, never a copy). Its
        residency is the one in force (:func:`~ckptio.policy.residency.resolve_residency`: never None)."""
        from ckptio.policy.residency import resolve_residency

        projected = {f.name: getattr(self, f.name) for f in fields(WriterConfig)}
        projected["residency"] = resolve_residency(self.residency, allow_public=self.allow_public,
                                                   store_private=self.store_private)
        return WriterConfig(**projected)

    def __post_init__(self) -> None:
        check_option_types(self)  # first: the range checks below compare numbers
        reject_non_finite(self)  # then: NaN passes every comparison below
        problems = [
            (self.max_pending < 1, f"max_pending must be >= 1, got {self.max_pending}"),
            (self.keep_last < 0, f"keep_last must be >= 0, got {self.keep_last}"),
            (self.every_steps is not None and self.every_steps < 1,
             f"every_steps must be >= 1, got {self.every_steps}"),
            (self.every_seconds is not None and self.every_seconds <= 0,
             f"every_seconds must be > 0, got {self.every_seconds}"),
            (self.file_size_bytes < 1 << 20, f"file_size_bytes must be at least 1 MiB, got {self.file_size_bytes}"),
            (self.upload_concurrency < 1, f"upload_concurrency must be >= 1, got {self.upload_concurrency}"),
            (self.commit_timeout_s <= 0, f"commit_timeout_s must be > 0, got {self.commit_timeout_s}"),
            (self.close_timeout_s < 0, f"close_timeout_s must be >= 0, got {self.close_timeout_s}"),
            (self.lease_s < 0, f"lease_s must be >= 0, got {self.lease_s}"),
            (self.commit == "lease" and self.lease_s == 0,
             'commit="lease" relies on the ownership lease: lease_s must be > 0'),
            (not 0 <= self.writer_nice <= 19, f"writer_nice must be within 0..19, got {self.writer_nice}"),
            (self.local_capacity_bytes is not None and self.local_capacity_bytes <= 0,
             "local_capacity_bytes must be positive"),
            (isinstance(self.root, str) and not self.root, "root must not be empty"),
            (self.staging_dir is not None and not os.fspath(self.staging_dir), "staging_dir must not be empty"),
            (self.durable_every < 1, f"durable_every must be >= 1, got {self.durable_every}"),
            (self.durable_every > 1 and self.local_dir is None, "durable_every > 1 needs local_dir (the local level)"),
            (self.replicas < 0, f"replicas must be >= 0, got {self.replicas}"),
            (self.preempt_grace_s < 0, f"preempt_grace_s must be >= 0, got {self.preempt_grace_s}"),
            (self.preempt_duplicate_window_s < 0,
             f"preempt_duplicate_window_s must be >= 0, got {self.preempt_duplicate_window_s}"),
            (self.partner_timeout_s <= 0, f"partner_timeout_s must be > 0, got {self.partner_timeout_s}"),
            (self.node_id is not None and not self.node_id, "node_id must not be empty"),
            *((getattr(self, name) > MAX_TIMEOUT_S, f"{name} must be at most {MAX_TIMEOUT_S:g} s (ckptio._wait)")
              for name in ("commit_timeout_s", "close_timeout_s", "partner_timeout_s", "preempt_grace_s")),
            (self.partner_pace is not None and not MIN_PACE_BYTES_PER_S <= self.partner_pace <= MAX_PACE_BYTES_PER_S,
             f"partner_pace must be None or bytes per second within [{MIN_PACE_BYTES_PER_S:g}, "
             f"{MAX_PACE_BYTES_PER_S:g}], got {self.partner_pace!r}"),
        ]
        for bad, message in problems:
            if bad:
                raise ConfigError(message)
        check_flush_pace(self.flush_pace), check_pace_fraction(self.flush_pace_fraction)  # the CLI's rule too
        self.data_dirs = tuple(os.fspath(d) for d in self.data_dirs)
        self.safe_globals = tuple(self.safe_globals)
        for entry in self.safe_globals:  # torch.serialization.safe_globals' shape, checked before any restore
            pair = isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str)
            if not callable(entry[0] if pair else entry):
                raise ConfigError(f"safe_globals entries must be classes or functions (or (obj, 'module.name') "
                                  f"pairs), got {entry!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class WriterConfig:
    """What a writer process reads of :class:`CheckpointerConfig`, pickled to it once at start.

    Built only by :meth:`CheckpointerConfig.writer_config`; every field has the name (and meaning) of the
    ``CheckpointerConfig`` field it comes from, which is validated there.
    """

    keep_last: int
    """Committed steps kept on the durable tier (0 keeps all); rank 0's committer applies it after each commit."""

    max_pending: int
    """Staging slots: a level's committer may also be this many saves behind before the writer holds the next
    save's files back (written but uncommitted saves stay at most ``max_pending`` + 1 per level)."""

    upload_concurrency: int
    """Threads that serialize, write and upload files of one save."""

    commit_timeout_s: float
    """How long a committer (rank 0) or watcher (other ranks) waits for a step to commit before it fails."""

    residency: Residency | None
    """Where checkpoints may be written; the writer re-checks it every ``residency_recheck_s``."""

    residency_recheck_s: float
    """Seconds between the writer's residency checks."""

    commit: Literal["conditional", "lease"]
    """``"lease"``: the committer verifies the manifest by reading it back after writing it."""

    local_capacity_bytes: int | None
    """Byte budget of the local tier (None: whatever the filesystem holds)."""

    writer_nice: int
    """CPU niceness the writer adds to itself; its I/O goes to the lowest best-effort class when > 0."""

    flush_pace_local: bool
    """Whether the local tier's writes are paced like the durable one."""

    partner_pace: float | None
    """The node's budget for partner copies, bytes per second (None: full speed)."""

    def __post_init__(self) -> None:
        reject_non_finite(self)  # a projection of a checked config, but it crosses into another process


def resolve_config(root: Any, config: CheckpointerConfig | None, options: Mapping[str, Any]) -> CheckpointerConfig:
    """The Checkpointer's config from either ``config=`` or keyword options (never both)."""
    if config is None:
        if root is None:
            raise ConfigError("Checkpointer needs a root (or a config)")
        return CheckpointerConfig(root=root, **options)
    if root is not None or options:
        raise ConfigError("pass either config= or keyword options, not both")
    return config
