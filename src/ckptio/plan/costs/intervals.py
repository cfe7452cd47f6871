"""When a job saves: its schedule, the failure rate, and the intervals of Young and Daly.

Owns :class:`Schedule` (what the job says about when it saves and what a save blocks), the default mean time between
failures, Young's and Daly's optimal intervals, and the rule that turns a schedule and an optimum into the interval a
plan uses (:func:`planned_interval`). Both the burst budget and the store-free sizing plan read them. It must never
know a store: what a flush takes is :mod:`ckptio.plan.costs.store`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ckptio.errors import ConfigError

LLAMA3_GPU_SECONDS_PER_FAILURE = 16384 * 54 * 86400 / 419
"""Llama 3 405B pre-training: 419 unexpected interruptions in 54 days on 16,384 GPUs ("The Llama 3 Herd of Models",
Meta, 2024). Scaled per GPU, it gives a default MTBF for a job of any size: failures grow with the number of GPUs a
job holds."""

DEFAULT_D2H_BYTES_PER_S = 20e9
"""Pinned device-to-host copy over PCIe 4.0 x16 runs at about 20–25 GB/s; 20 GB/s is the cautious default."""

FORWARD_BACKWARD_SHARE = 0.9
"""Share of a training step a device copy launched by ``save()`` runs beside before the optimizer step waits for it:
the next forward and backward. The rest is the optimizer step (an elementwise pass over the rank's shard of the
state, memory-bound) and the step's host work, a few percent of a large model's step; a tenth leaves them room.
An assumption, not a measurement: bench/gpu_check.py is where a GPU checks it (docs/planning.md)."""


def default_mtbf_s(ranks: int) -> float:
    """Mean time between job interruptions for ``ranks`` GPUs, scaled from Llama 3 405B's observed rate."""
    return LLAMA3_GPU_SECONDS_PER_FAILURE / max(ranks, 1)


def young_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Young (1974): τ = sqrt(2 δ M)."""
    return math.sqrt(2.0 * cost_s * mtbf_s)


def daly_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Daly (2006, eq. 37): τ = sqrt(2δM)·[1 + ⅓·sqrt(δ/2M) + ⅑·(δ/2M)] − δ for δ < 2M, else M."""
    if cost_s >= 2.0 * mtbf_s:
        return mtbf_s
    ratio = cost_s / (2.0 * mtbf_s)
    return math.sqrt(2.0 * cost_s * mtbf_s) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - cost_s


@dataclass(kw_only=True, slots=True)
class Schedule:
    """When the job saves and what a save costs the training loop."""

    interval_s: float | None = None
    """Compute time between saves; None plans at Daly's optimal interval."""

    step_time_s: float | None = None
    """Seconds per training step (to express intervals in steps)."""

    mtbf_s: float | None = None
    """Mean time between job interruptions; None scales Llama 3's observed rate to the job's ranks."""

    save_cost_s: float | None = None
    """Blocking seconds per checkpoint, measured elsewhere; overrides the D2H estimate."""

    d2h_bytes_per_s: float = DEFAULT_D2H_BYTES_PER_S
    """Device-to-host copy bandwidth per rank (the blocking part of an async save)."""

    mode: Literal["async", "sync"] = "async"
    """``async``: save blocks for the copy, the flush overlaps training; ``sync``: training waits."""

    def __post_init__(self) -> None:
        for name in ("interval_s", "step_time_s", "mtbf_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value}")
        if self.save_cost_s is not None and self.save_cost_s < 0:
            raise ConfigError(f"save cost must be >= 0, got {self.save_cost_s}")
        if not self.d2h_bytes_per_s > 0:
            raise ConfigError(f"d2h bandwidth must be > 0, got {self.d2h_bytes_per_s}")
        if self.mode not in ("async", "sync"):
            raise ConfigError(f"mode must be async or sync, got {self.mode!r}")

    def blocking_s(self, bytes_per_rank: float) -> float:
        """Seconds an async save holds the loop: ``save_cost_s`` when given, else the copy of ``bytes_per_rank``."""
        return self.save_cost_s if self.save_cost_s is not None else bytes_per_rank / self.d2h_bytes_per_s

    @property
    def overlap_s(self) -> float | None:
        """Seconds of the next step a side-stream device copy runs beside (:data:`FORWARD_BACKWARD_SHARE` of the step
        time); None when the step time is unknown, or when ``save_cost_s`` gives a measured stall instead of a copy."""
        if self.step_time_s is None or self.save_cost_s is not None:
            return None
        return FORWARD_BACKWARD_SHARE * self.step_time_s

    def mtbf_for(self, ranks: int) -> float:
        """``mtbf_s``, or the default for ``ranks`` GPUs."""
        return self.mtbf_s or default_mtbf_s(ranks)


@dataclass(kw_only=True, slots=True, frozen=True)
class PlannedInterval:
    """The interval a plan uses, and where it came from."""

    seconds: float
    """Compute seconds between saves."""
    steps: int | None
    """The interval in steps, when a step time is known."""
    source: str
    """``given`` (the schedule's) or ``daly`` (the optimum, in whole steps when a step time is known)."""


def planned_interval(schedule: Schedule, optimal_s: float) -> PlannedInterval:
    """The schedule's interval when it gives one, else ``optimal_s`` rounded up to whole steps."""
    if schedule.interval_s is not None:
        steps = round(schedule.interval_s / schedule.step_time_s) if schedule.step_time_s else None
        return PlannedInterval(seconds=schedule.interval_s, steps=steps, source="given")
    if schedule.step_time_s:
        steps = max(1, math.ceil(optimal_s / schedule.step_time_s))
        return PlannedInterval(seconds=steps * schedule.step_time_s, steps=steps, source="daly")
    return PlannedInterval(seconds=optimal_s, steps=None, source="daly")
