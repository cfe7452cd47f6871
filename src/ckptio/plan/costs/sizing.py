"""A plan without a store: what one checkpoint of a job holds, and the interval arithmetic that needs no bandwidth.

Owns the answer ``ckptio plan`` gives when no store is described (no ``--profile``, no ``--write-bandwidth``):
sizes, objects, bytes per rank, the blocking copy of an async save, the interval in steps and in time, saves and
bytes per day, and the write bandwidth the store would need for a flush to keep up. The verdict is always
``unknown`` (reason ``no store given``). Its JSON keeps the contract keys of
:class:`~ckptio.plan.costs.budget.BurstBudget` that need a store, as null, so a reader finds every key. It must
never guess a store.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ckptio.plan.costs.intervals import Schedule, daly_interval_s, planned_interval, young_interval_s
from ckptio.plan.job.checkpoint import CheckpointShape

NO_STORE_REASON = "no store given"
NO_STORE_CODE = "no-store"
_DAY_S = 86400.0
_NEEDS_A_STORE = ("sync_stall_s", "flush_s", "keeps_up", "overhead_fraction", "modes", "commit_metadata_s")


@dataclass(kw_only=True, slots=True, frozen=True)
class JobSizes:
    """What one checkpoint of a job holds and what its save blocks: the first keys of every plan, with a store
    (:class:`~ckptio.plan.costs.budget.BurstBudget`) or without (:class:`SizingPlan`)."""

    params: float
    """Model parameters."""
    ranks: int
    """Ranks in the job."""
    writers: int
    """Ranks that write model or optimizer bytes."""
    checkpoint_bytes: float
    """Bytes of one checkpoint, all ranks together."""
    bytes_per_rank_max: float
    """Bytes the largest rank writes (it gates blocking and flush)."""
    objects_per_checkpoint: int
    """Files or objects one checkpoint creates."""
    requests_per_checkpoint: int
    """PUT-class requests one checkpoint costs on an object store (multipart parts included)."""
    mode: str
    """async or sync."""
    blocking_s: float
    """Time an async save blocks the training loop (device-to-host copy of the largest rank, or ``--save-cost``)."""


def job_sizes(shape: CheckpointShape, schedule: Schedule, blocking_s: float) -> dict[str, Any]:
    """The :class:`JobSizes` fields of ``shape`` saved under ``schedule`` (a plan passes them on to its own class)."""
    return {"params": shape.params, "ranks": shape.ranks, "writers": shape.writers,
            "checkpoint_bytes": shape.total_bytes, "bytes_per_rank_max": shape.bytes_per_rank_max,
            "objects_per_checkpoint": shape.objects, "requests_per_checkpoint": shape.requests,
            "mode": schedule.mode, "blocking_s": blocking_s}


@dataclass(kw_only=True, slots=True, frozen=True)
class SizingPlan(JobSizes):
    """The store-free part of a plan (``ckptio plan --json`` without a store prints these keys)."""

    interval_s: float | None
    """Compute time between saves: given, or Daly's optimum for an async save (its cost needs no store); None for
    a sync save without ``--interval`` (its cost is the flush)."""
    interval_steps: int | None
    """The interval in steps, when a step time is known."""
    interval_source: str
    """``given``, ``daly`` or ``unknown``."""
    mtbf_s: float
    """Mean time between interruptions used."""
    young_interval_s: float | None
    """Young's interval from the blocking cost (async saves)."""
    optimal_interval_s: float | None
    """Daly's interval from the blocking cost (async saves)."""
    saves_per_day: float | None
    """Checkpoints per day of compute at the interval."""
    bytes_per_day: float | None
    """Bytes written per day at the interval."""
    write_bytes_per_s_to_keep_up: float | None
    """Aggregate write bandwidth a store needs for one flush to end before the next save."""
    restore_s: dict[str, float | None] = field(default_factory=lambda: {"durable": None})
    """Restore time per level: unknown without a store."""
    verdict: str = "unknown"
    """Always ``unknown``: without a store nothing says whether the burst fits."""
    reasons: list[str] = field(default_factory=lambda: [NO_STORE_REASON])
    """Why the verdict is unknown."""
    reason_codes: list[str] = field(default_factory=lambda: [NO_STORE_CODE])
    """A stable name per reason."""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), **dict.fromkeys(_NEEDS_A_STORE)}


def plan_sizes(shape: CheckpointShape, schedule: Schedule) -> SizingPlan:
    """Everything ``shape``'s checkpoints cost under ``schedule`` that no store figure enters."""
    blocking = schedule.blocking_s(shape.bytes_per_rank_max)
    mtbf = schedule.mtbf_for(shape.ranks)
    # An async save's δ is its blocking copy; a sync save's δ includes the flush, which needs the store.
    young = young_interval_s(blocking, mtbf) if schedule.mode == "async" and blocking > 0 else None
    daly = daly_interval_s(blocking, mtbf) if young is not None else None
    interval: float | None = None
    steps: int | None = None
    source = "unknown"
    if schedule.interval_s is not None or daly is not None:
        planned = planned_interval(schedule, daly or 0.0)
        interval, steps, source = planned.seconds, planned.steps, planned.source
    saves_per_day = _DAY_S / interval if interval else None
    return SizingPlan(
        **job_sizes(shape, schedule, blocking),
        interval_s=interval,
        interval_steps=steps,
        interval_source=source,
        mtbf_s=mtbf,
        young_interval_s=young,
        optimal_interval_s=daly,
        saves_per_day=saves_per_day,
        bytes_per_day=shape.total_bytes * saves_per_day if saves_per_day else None,
        write_bytes_per_s_to_keep_up=shape.total_bytes / interval if interval else None,
    )
