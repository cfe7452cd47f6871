"""What goes into the burst simulator and what comes out: its configuration, one record per save, the result.

Owns the validated :class:`SimulationConfig` and the result types ``ckptio simulate --json`` prints and
``plan.simulation.simulation_events`` turns into events. Must never run the model (``plan.simulation.burst``
does): these are plain data.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ckptio.errors import ConfigError
from ckptio.plan.costs.pace import FlushPace

__all__ = ["MAX_CHECKPOINTS", "CheckpointRecord", "SimulationConfig", "SimulationResult"]

#: Most save requests one simulation runs: the model's cost grows with saves × rank classes (10 000 saves take
#: seconds), and the answer — whether the store keeps up — is settled long before.
MAX_CHECKPOINTS = 10_000


@dataclass(kw_only=True, slots=True)
class SimulationConfig:
    """How the simulated job saves, beyond what ``plan`` already knows."""

    checkpoints: int = 20
    """Save requests to simulate (1 to :data:`MAX_CHECKPOINTS`)."""

    mode: Literal["sync", "async", "tiered"] = "async"
    """``sync``: training waits for the flush; ``async``: a staging slot per pending save; ``tiered``: a
    local tier absorbs the write, then drains to the store."""

    max_pending: int = 1
    """Staging slots per rank (async and tiered)."""

    overflow: Literal["block", "skip"] = "block"
    """With no free slot: wait for one, or skip the save."""

    loader_read_bytes_per_s: float = 0.0
    """Aggregate read bandwidth the data loaders need from the same store while training computes."""

    local_bytes_per_s: float | None = None
    """Tiered: write bandwidth of one node's local tier (NVMe, RAM)."""

    local_capacity_bytes: float | None = None
    """Tiered: capacity of one node's local tier."""

    ranks_per_node: int = 8
    """Ranks sharing one node's local tier."""

    pace: FlushPace | None = None
    """The job's ``flush_pace`` (async and tiered: the upload to the store; a ``sync`` save is never paced, as
    training waits for it): each writer's rate is capped at its paced rate until a later save is requested, which
    sends it to full speed as the engine's does. None: full speed."""

    def __post_init__(self) -> None:
        if not 1 <= self.checkpoints <= MAX_CHECKPOINTS:
            raise ConfigError(f"checkpoints must be between 1 and {MAX_CHECKPOINTS:,}, got {self.checkpoints:,} "
                              "(a store that keeps up for a few hundred saves keeps up for more)")
        if self.mode not in ("sync", "async", "tiered"):
            raise ConfigError(f"mode must be sync, async or tiered, got {self.mode!r}")
        if self.max_pending < 1:
            raise ConfigError(f"max_pending must be >= 1, got {self.max_pending}")
        if self.overflow not in ("block", "skip"):
            raise ConfigError(f"overflow must be block or skip, got {self.overflow!r}")
        if not 0 <= self.loader_read_bytes_per_s < math.inf:
            raise ConfigError(f"loader read bandwidth must be a finite number >= 0, got {self.loader_read_bytes_per_s}")
        if self.ranks_per_node < 1:
            raise ConfigError(f"ranks per node must be >= 1, got {self.ranks_per_node}")
        if self.mode == "tiered" and not (self.local_bytes_per_s and self.local_capacity_bytes):
            raise ConfigError("tiered mode needs the local tier's bandwidth and capacity")
        for name in ("local_bytes_per_s", "local_capacity_bytes"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ConfigError(f"{name} must be a finite number > 0, got {value}")


@dataclass(kw_only=True, slots=True)
class CheckpointRecord:
    """What happened to one save request."""

    index: int
    """0-based save request number."""
    requested_s: float
    """Simulated time of the request."""
    skipped: bool = False
    """Dropped because no staging slot was free (``overflow="skip"``)."""
    queue_depth: int = 0
    """Earlier saves not yet durable on the slowest class when this one was requested."""
    stall_s: float = 0.0
    """GPU-idle seconds this save cost: waiting for a slot, the copy, and (sync) the flush."""
    returned_s: float | None = None
    """When training resumed (async/tiered) or the copy ended (sync)."""
    committed_s: float | None = None
    """When the last class's flush was durable."""
    flush_s: float | None = None
    """``committed_s − returned_s``."""
    lag_s: float | None = None
    """``committed_s − requested_s``."""
    phases: list[tuple[int, str, float, float]] = field(default_factory=list)
    """``(class index, phase, start, end)`` of each class's local write and upload."""


@dataclass(kw_only=True, slots=True)
class SimulationResult:
    """The simulator's answer (``ckptio simulate --json`` prints these keys; ``records`` per save)."""

    mode: str
    """sync, async or tiered."""
    ranks: int
    """Ranks simulated (as classes)."""
    rank_classes: int
    """Distinct rank classes the ranks fold into."""
    checkpoints: int
    """Save requests simulated."""
    skipped: int
    """Saves dropped for want of a slot."""
    interval_s: float
    """Compute time between save requests."""
    blocking_s: float
    """Device-to-host copy per save."""
    flush_s: float
    """Median flush time (save return → commit) of the committed saves."""
    flush_s_max: float
    """Slowest flush."""
    stall_s_per_checkpoint: float
    """GPU-idle seconds per save request, averaged (skipped saves cost none)."""
    lag_growth_s_per_checkpoint: float
    """Least-squares slope of lag against save index: > 0 when the queue grows."""
    queue_depth_max: int
    """Most saves pending behind a new request."""
    keeps_up: bool
    """Every save found the previous one durable and none was skipped."""
    gpu_idle_fraction: float
    """Share of wall time GPUs idle for checkpoints: stalls, plus compute slowed by the loader."""
    gpu_idle_hours_per_day: float
    """``gpu_idle_fraction`` × ranks × 24 h."""
    loader_slowdown_fraction: float
    """Share of compute time lost because the loader got less than its demand."""
    storage_utilization: float
    """Checkpoint bytes written ÷ (store bandwidth × wall time)."""
    store_busy_fraction: float
    """Share of wall time some checkpoint flush was active."""
    host_staging_bytes_per_rank: float
    """Peak host memory the staging slots held on the largest rank."""
    wall_s: float
    """Simulated wall time of the requests (to the last one's return)."""
    plan_flush_s: float
    """The planner's closed-form flush time, for comparison."""
    peak_store_demand_bytes_per_s: float
    """The most checkpoint bytes a second the writers moved to the store at any moment: the burst the store saw."""
    records: list[CheckpointRecord] = field(default_factory=list)
    """One record per save request."""
    compute_segments: list[tuple[float, float, float]] = field(default_factory=list)
    """``(start, end, rate)``: when training computed, and how fast (1 = not slowed by the loader)."""

    def to_json(self, *, with_records: bool = True) -> dict[str, Any]:
        data = asdict(self)
        data.pop("compute_segments")
        if not with_records:
            data.pop("records")
        return data
